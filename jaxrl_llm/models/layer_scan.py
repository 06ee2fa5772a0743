"""The layer loops: :func:`scan_layers` (a uniform stack under ``lax.scan``, or unrolled over
:func:`separate_layers`' per-layer arrays), :func:`scan_periods` (a hybrid stack's periods),
the parameter sub-trees each layer kind is stacked over (:func:`layer_kinds`; their layer
indices: :func:`module_layers`) and the
rematerialisation policies (:func:`remat_policy`). :func:`~jaxrl_llm.models.layer_stack.stack`
runs :func:`~jaxrl_llm.models.layer.decoder_layer` through them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import LayerType, ModelConfig

Params = dict[str, Any]


def remat_policy(remat: str):
    """The ``jax.checkpoint`` policy of a rematerialisation name: 'none' (None: no
    checkpoint), 'full' (save nothing) or 'dots' (save the matmuls without batch dims)."""
    if remat == "none":
        return None
    if remat == "full":
        return jax.checkpoint_policies.nothing_saveable
    if remat == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    raise ValueError(f"unknown remat policy {remat!r}; allowed: 'none', 'full', 'dots'")


def scan_layers(
    config: ModelConfig,
    layers: Params,
    carry: Any,
    step: Callable[[Any, Params, Any], tuple[Any, Any]],
    *,
    remat: str = "none",
    unroll: bool = False,
):
    """The one layer scan: ``step(carry, lp, layer) -> (carry, per-layer output)`` over the L
    stacked layers under ``lax.scan`` (one compiled layer body), ``layer`` the traced int32
    index; under autodiff each step is rematerialised per :func:`remat_policy`.

    A store that every layer writes (a KV cache, the page pool) rides in the carry, so each
    layer updates its part in place (as scanned inputs/outputs the scan would read and rewrite
    the whole buffer every call).

    Args:
      config: the model config (``num_layers``).
      layers: ``params["layers"]``, every leaf stacked along a leading ``[L]`` axis; or a
        tuple of L per-layer trees (:func:`separate_layers`), then the layers run unrolled.
      carry: the scan carry (the residual stream, and the store when it changes).
      step: the layer step, calling :func:`decoder_layer`.
      remat: 'none', 'full' or 'dots'.
      unroll: run the layers unrolled over static slices ``w[i]`` of the stacked weights
        (what a layered KV cache needs: each layer writes its own buffer; XLA:TPU fuses the
        static slice into the matmul as it does the scan's dynamic one). Separate per-layer
        arrays always run unrolled. Unrolled, ``layer`` is a concrete ``np.int32``.

    Returns:
      (final carry, per-layer outputs stacked ``[L, ...]``).
    """
    policy = remat_policy(remat)
    if isinstance(layers, tuple) or unroll:  # separate per-layer arrays, or a layered cache
        if policy is not None:  # the layer index stays static (a layered cache reads it)
            step = jax.checkpoint(step, policy=policy, static_argnums=(2,))
        per_layer: tuple[Params, ...] = (
            layers
            if isinstance(layers, tuple)
            else tuple(jax.tree.map(lambda w, i=i: w[i], layers) for i in range(config.num_layers))
        )
        outs = []
        for i, lp in enumerate(per_layer):
            carry, out = step(carry, lp, np.int32(i))
            outs.append(out)
        if all(o is None for o in outs):
            return carry, None
        return carry, jax.tree.map(lambda *o: jnp.stack(o), *outs)

    if policy is not None:
        step = jax.checkpoint(step, policy=policy)

    def body(carry, xs):
        lp, layer = xs
        return step(carry, lp, layer)

    index = jnp.arange(config.num_layers, dtype=jnp.int32)
    return jax.lax.scan(body, carry, (layers, index))


def separate_layers(params: Params, config: ModelConfig) -> Params:
    """``params`` with ``params["layers"]`` as a tuple of L per-layer trees, each leaf its own
    array, for the decode programs: :func:`scan_layers` then runs the layers unrolled.

    Why: under ``lax.scan`` over stacked weights, XLA:GPU copies each layer's slice out of the
    stack before its matmuls (an async ``dynamic-slice`` per weight in the optimized HLO of the
    decode loop on an H200), so a memory-bound decode step moves every weight three times.
    Measured on an H200 (tools/bench/bench_layer_loop.py, 8B-shaped MLP stack, 64 rows): 6.10
    ms per token step under the scan, 2.36 ms with separate arrays; static slices of the stack
    (``w[i]``) gave 6.05 ms, so the arrays must be separate. The split costs one copy of the
    layer weights; do it once per weight version, not per call. XLA:TPU needs none of it: its
    matmul fusion takes the whole stack and the index (the slice fused into the operand).

    A hybrid stack (``config.is_hybrid``) and params already split come back unchanged.
    """
    if config.is_hybrid or isinstance(params["layers"], tuple):
        return params
    return {**params, "layers": _split_layers(params["layers"], config.num_layers)}


@functools.partial(jax.jit, static_argnums=1)
def _split_layers(layers: Params, n: int) -> tuple[Params, ...]:
    return tuple(jax.tree.map(lambda w, i=i: w[i], layers) for i in range(n))


def layer_kinds(modules) -> dict[str, str]:
    """Which layers each parameter sub-tree of ``params["layers"]`` is stacked over in a hybrid
    stack: 'linear' (the LINEAR layers, its ``modules``), 'attention' (the softmax-attention
    layers) or 'all' (norms and the MLP)."""
    out = {}
    for name in modules:
        if name in LINEAR_MODULE_NAMES:
            out[name] = "linear"
        elif name in ATTENTION_MODULE_NAMES:
            out[name] = "attention"
        else:
            out[name] = "all"
    return out


def module_layers(config: ModelConfig, module: str) -> list[int]:
    """The layer indices a stacked sub-tree of ``params["layers"]`` holds, in order: in a
    hybrid stack the LINEAR layers' or the attention layers' own (:func:`layer_kinds`), else
    all (what import and export walk to name each layer's checkpoint tensor)."""
    if not config.is_hybrid:
        return list(range(config.num_layers))
    kind = layer_kinds([module])[module]
    linear = [t == LayerType.LINEAR for t in config.attn.layer_types]
    if kind == "linear":
        return [i for i, is_lin in enumerate(linear) if is_lin]
    if kind == "attention":
        return [i for i, is_lin in enumerate(linear) if not is_lin]
    return list(range(config.num_layers))


#: Parameter sub-trees of a hybrid stack's LINEAR layers (Gated DeltaNet,
#: :mod:`jaxrl_llm.models.gated_deltanet`) and of its softmax-attention layers.
LINEAR_MODULE_NAMES = frozenset(
    (
        "in_proj_qkv",
        "in_proj_z",
        "in_proj_b",
        "in_proj_a",
        "conv",
        "delta",
        "linear_norm",
        "out_proj",
    )
)
ATTENTION_MODULE_NAMES = frozenset(
    ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "attn_gate", "sinks")
)


def scan_periods(
    config: ModelConfig,
    layers: Params,
    carry: Any,
    step: Callable[[Any, Params, LayerType, jax.Array, jax.Array], tuple[Any, Any]],
    *,
    remat: str = "none",
):
    """The layer scan of a hybrid stack: ``lax.scan`` over the periods of its layer pattern
    (``config.layer_period``, e.g. three LINEAR layers then one GLOBAL), each period's layers
    unrolled in order. ``step(carry, lp, kind, layer, index) -> (carry, per-layer output)`` with
    ``kind`` the static :class:`LayerType`, ``layer`` the traced index of the layer among the
    layers of its kind (the index its store reads: a LINEAR layer's recurrent state, an
    attention layer's keys/values) and ``index`` its traced index in the whole stack (where a
    mixture of experts reads its recorded routing, :func:`decoder_layer`'s ``stack_index``);
    under autodiff each period is rematerialised per :func:`remat_policy`.

    Args:
      config: a hybrid config (``config.is_hybrid``).
      layers: ``params["layers"]``: the LINEAR layers' sub-trees stacked ``[L', ...]``, the
        attention layers' ``[L − L', ...]``, the norms and MLP ``[L, ...]``
        (:func:`layer_kinds`).
      carry, step, remat: as :func:`scan_layers`.

    Returns:
      (final carry, per-layer outputs ``[L, ...]`` in layer order, or None when every step
      returns None).
    """
    period = config.layer_period
    p = len(period)
    n_periods = config.num_layers // p
    kinds = layer_kinds(layers)
    per_period = {
        "linear": sum(t == LayerType.LINEAR for t in period),
        "attention": sum(t != LayerType.LINEAR for t in period),
        "all": p,
    }
    xs = {
        name: jax.tree.map(
            lambda w, n=per_period[kinds[name]]: w.reshape(n_periods, n, *w.shape[1:]), sub
        )
        for name, sub in layers.items()
    }

    def period_step(carry, xs_i, i):
        outs = []
        seen = {"linear": 0, "attention": 0}
        for j, kind in enumerate(period):
            group = "linear" if kind == LayerType.LINEAR else "attention"
            idx = seen[group]
            seen[group] += 1
            lp = {
                name: jax.tree.map(lambda w, at=(j if kinds[name] == "all" else idx): w[at], sub)
                for name, sub in xs_i.items()
                if kinds[name] in ("all", group)
            }
            layer = (i * per_period[group] + idx).astype(jnp.int32)
            carry, out = step(carry, lp, kind, layer, (i * p + j).astype(jnp.int32))
            outs.append(out)
        if all(o is None for o in outs):
            return carry, None
        return carry, jax.tree.map(lambda *o: jnp.stack(o), *outs)

    policy = remat_policy(remat)
    if policy is not None:
        period_step = jax.checkpoint(period_step, policy=policy)

    def body(carry, x):
        xs_i, i = x
        return period_step(carry, xs_i, i)

    index = jnp.arange(n_periods, dtype=jnp.int32)
    carry, outs = jax.lax.scan(body, carry, (xs, index))
    if outs is not None:
        outs = jax.tree.map(lambda o: o.reshape(config.num_layers, *o.shape[2:]), outs)
    return carry, outs

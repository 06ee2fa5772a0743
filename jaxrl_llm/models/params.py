"""The decoder's parameters as data: every parameter's shape and logical axes
(:func:`param_shapes_and_axes`, :func:`param_logical_axes`), random initialisation
(:func:`init_params`), and where the stored weights hold padding a layer does not use
(:func:`head_axes`, :func:`padding_masks`; Gemma 4, :mod:`jaxrl_llm.models.padded_heads`).

Parameters are a plain nested dict; per-layer weights are stacked along a leading ``layers``
axis, which the layer scan of :mod:`jaxrl_llm.models.transformer` runs over (a hybrid stack,
Qwen3.5, stacks its attention and Gated DeltaNet sub-trees over the layers of their kind
only). Every parameter dimension has a logical axis name (:func:`param_logical_axes`) so the
parallel layer can shard it without touching the model code.

Shapes use dimension letters: D model width, H query heads, K key/value heads, E head dim,
F MLP width, V vocab, L layers; with experts X experts of width F_e.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import padded_heads
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layer_scan import layer_kinds
from jaxrl_llm.models.options import LayerType

Params = dict[str, Any]


def param_shapes_and_axes(config: ModelConfig) -> dict[str, Any]:
    """Nested dict of ``(shape, logical_axes)`` leaves describing every parameter."""
    c = config
    # Heads of two sizes (Gemma 4) are stored padded to the larger (models/padded_heads.py).
    L, D, F, H, K, E, V = (
        c.num_layers,
        c.hidden_size,
        c.mlp.intermediate_size,
        c.attn.num_heads,
        c.store_kv_heads,
        c.store_head_dim,
        c.vocab_size,
    )
    layers: dict[str, Any] = {
        "attn_norm": {"scale": ((L, D), ("layers", "norm"))},
        "q_proj": {"kernel": ((L, D, H, E), ("layers", "embed", "heads", "head_dim"))},
        "k_proj": {"kernel": ((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim"))},
        "v_proj": {"kernel": ((L, D, K, E), ("layers", "embed", "kv_heads", "head_dim"))},
        "o_proj": {"kernel": ((L, H, E, D), ("layers", "heads", "head_dim", "embed"))},
        "mlp_norm": {"scale": ((L, D), ("layers", "norm"))},
    }
    if c.is_moe:
        X, Fe = c.moe.num_experts, c.moe.intermediate_size
        layers["router"] = {"kernel": ((L, D, X), ("layers", "embed", "router"))}
        expert_in = ("layers", "experts", "embed", "mlp")
        layers["experts_gate"] = {"kernel": ((L, X, D, Fe), expert_in)}
        layers["experts_up"] = {"kernel": ((L, X, D, Fe), expert_in)}
        layers["experts_down"] = {"kernel": ((L, X, Fe, D), ("layers", "experts", "mlp", "embed"))}
        if c.moe.shared_expert_size:
            Fs = c.moe.shared_expert_size
            layers["shared_gate_proj"] = {"kernel": ((L, D, Fs), ("layers", "embed", "mlp"))}
            layers["shared_up_proj"] = {"kernel": ((L, D, Fs), ("layers", "embed", "mlp"))}
            layers["shared_down_proj"] = {"kernel": ((L, Fs, D), ("layers", "mlp", "embed"))}
            layers["shared_expert_gate"] = {"kernel": ((L, D, 1), ("layers", "embed", None))}
        if c.moe.expert_bias:  # gpt-oss
            layers["router"]["bias"] = ((L, X), ("layers", "router"))
            layers["experts_gate"]["bias"] = ((L, X, Fe), ("layers", "experts", "mlp"))
            layers["experts_up"]["bias"] = ((L, X, Fe), ("layers", "experts", "mlp"))
            layers["experts_down"]["bias"] = ((L, X, D), ("layers", "experts", "embed"))
        if c.moe.beside_mlp:
            for name in ("router_norm", "post_dense_norm", "moe_norm", "post_moe_norm"):
                layers[name] = {"scale": ((L, D), ("layers", "norm"))}
            layers["expert_scale"] = {"scale": ((L, X), ("layers", "router"))}
    if not c.is_moe or c.moe.beside_mlp:
        layers["gate_proj"] = {"kernel": ((L, D, F), ("layers", "embed", "mlp"))}
        layers["up_proj"] = {"kernel": ((L, D, F), ("layers", "embed", "mlp"))}
        layers["down_proj"] = {"kernel": ((L, F, D), ("layers", "mlp", "embed"))}
    if c.attn.bias:
        layers["q_proj"]["bias"] = ((L, H, E), ("layers", "heads", "head_dim"))
        layers["k_proj"]["bias"] = ((L, K, E), ("layers", "kv_heads", "head_dim"))
        layers["v_proj"]["bias"] = ((L, K, E), ("layers", "kv_heads", "head_dim"))
    if c.attn.out_bias:
        layers["o_proj"]["bias"] = ((L, D), ("layers", "embed"))
    if c.attn.sinks:  # gpt-oss: one logit per query head
        layers["sinks"] = {"logit": ((L, H), ("layers", "heads"))}
    if c.attn.qk_norm:
        layers["q_norm"] = {"scale": ((L, E), ("layers", "head_dim"))}
        layers["k_norm"] = {"scale": ((L, E), ("layers", "head_dim"))}
    if c.norms.post_norms:
        layers["post_attn_norm"] = {"scale": ((L, D), ("layers", "norm"))}
        layers["post_mlp_norm"] = {"scale": ((L, D), ("layers", "norm"))}
    if c.attn.output_gate:
        layers["attn_gate"] = {"kernel": ((L, D, H, E), ("layers", "embed", "heads", "head_dim"))}
    if c.norms.layer_scalars:
        layers["layer_scalar"] = {"value": ((L,), ("layers",))}
    P = c.tokens.per_layer_input_size
    if P:
        layers["per_layer_gate"] = {"kernel": ((L, D, P), ("layers", "embed", None))}
        layers["per_layer_proj"] = {"kernel": ((L, P, D), ("layers", None, "embed"))}
        layers["per_layer_post_norm"] = {"scale": ((L, D), ("layers", "norm"))}
    if c.is_hybrid:
        layers = _hybrid_layer_specs(c, layers)
    tree: dict[str, Any] = {
        "embed": {"embedding": ((V, D), ("vocab", "embed"))},
        "layers": layers,
        "final_norm": {"scale": ((D,), ("norm",))},
    }
    if P:  # Gemma 4's per-layer inputs
        tree["embed_per_layer"] = {"embedding": ((c.per_layer_vocab, L, P), ("vocab", None, None))}
        tree["per_layer_projection"] = {"kernel": ((D, L, P), ("embed", None, None))}
        tree["per_layer_norm"] = {"scale": ((P,), ("norm",))}
    if not c.tie_embeddings:
        tree["lm_head"] = {"kernel": ((D, V), ("embed", "vocab"))}
    if c.num_labels:
        tree["score_head"] = {"kernel": ((D, c.num_labels), ("embed", "labels"))}
    return tree


def _hybrid_layer_specs(config: ModelConfig, layers: dict[str, Any]) -> dict[str, Any]:
    """A hybrid stack's layer specs: the attention sub-trees over the L − L' attention layers,
    the Gated DeltaNet sub-trees (:mod:`jaxrl_llm.models.gated_deltanet`) over the L' LINEAR
    layers, norms and MLP over all L. The conv channels (q, k, v concatenated) keep no
    logical axis: they stay whole on every device."""
    c = config
    n_lin, n_att = c.num_linear_layers, c.num_attention_layers
    kinds = layer_kinds(layers)
    out: dict[str, Any] = {}
    for name, leaves in layers.items():
        if kinds[name] == "attention":
            leaves = {k: ((n_att, *s[1:]), ax) for k, (s, ax) in leaves.items()}
        out[name] = leaves
    D, Hv, dv, C = (
        c.hidden_size,
        c.linear.num_value_heads,
        c.linear.value_head_dim,
        c.linear_conv_channels,
    )
    out.update(
        in_proj_qkv={"kernel": ((n_lin, D, C), ("layers", "embed", None))},
        in_proj_z={"kernel": ((n_lin, D, Hv, dv), ("layers", "embed", "heads", "head_dim"))},
        in_proj_b={"kernel": ((n_lin, D, Hv), ("layers", "embed", "heads"))},
        in_proj_a={"kernel": ((n_lin, D, Hv), ("layers", "embed", "heads"))},
        conv={"kernel": ((n_lin, c.linear.conv_kernel, C), ("layers", None, None))},
        delta={
            "a_log": ((n_lin, Hv), ("layers", "heads")),
            "dt_bias": ((n_lin, Hv), ("layers", "heads")),
        },
        linear_norm={"scale": ((n_lin, dv), ("layers", "head_dim"))},
        out_proj={"kernel": ((n_lin, Hv, dv, D), ("layers", "heads", "head_dim", "embed"))},
    )
    return out


def _is_spec(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)


def param_logical_axes(config: ModelConfig) -> dict[str, Any]:
    """Same tree as the params with a tuple of logical axis names per leaf.

    Names: vocab, embed, heads, kv_heads, head_dim, mlp, layers, norm, labels; with experts
    also experts (the expert index) and router (the router's expert logits).
    """
    return jax.tree.map(lambda s: s[1], param_shapes_and_axes(config), is_leaf=_is_spec)


def init_params(config: ModelConfig, rng: jax.Array) -> Params:
    """Random initialisation (normal, std 0.02; norms at 1, i.e. w = 0 for the (1 + w) form)
    in ``config.param_dtype``. Gated DeltaNet layers: the gated norm's plain weight at 1,
    ``dt_bias`` at 1 and ``A = exp(a_log)`` drawn uniformly from [1, 16] (Mamba-2's range,
    Dao & Gu 2024, https://arxiv.org/abs/2405.21060). Gemma 4: layer scalars at 1, and the
    stored weights a layer does not use (:func:`padding_masks`) at 0.

    Jittable and usable under ``jax.eval_shape`` for abstract (sharded) creation.
    """
    specs = param_shapes_and_axes(config)
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(rng, len(leaves))
    dtype = config.param_jnp_dtype
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec)[0]
    ]
    out = []
    for key, path, (shape, _) in zip(keys, paths, leaves):
        if any(n in path for n in ("linear_norm", "dt_bias", "layer_scalar", "expert_scale")):
            out.append(jnp.ones(shape, dtype))
        elif "a_log" in path:
            out.append(
                jnp.log(jax.random.uniform(key, shape, jnp.float32, 1.0, 16.0)).astype(dtype)
            )
        elif "norm" in path and "scale" in path:
            out.append((jnp.zeros if config.norms.unit_offset else jnp.ones)(shape, dtype))
        elif "bias" in path:
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append((0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype))
    params = jax.tree.unflatten(treedef, out)
    masks = padding_masks(config)
    if masks:
        layers = dict(params["layers"])
        for name, mask in masks.items():
            layers[name] = jax.tree.map(
                lambda w, m: w * jnp.asarray(m, w.dtype), layers[name], mask
            )
        params["layers"] = layers
    return params


# Where each attention sub-tree's KV heads and head dim are (axes of one layer's leaf):
# module -> (KV-heads axis or None, head-dim axis); biases apart.
_HEAD_AXES = {
    "q_proj": (None, 2),
    "k_proj": (1, 2),
    "v_proj": (1, 2),
    "o_proj": (None, 1),
    "q_norm": (None, 0),
    "k_norm": (None, 0),
}
_BIAS_HEAD_AXES = {"q_proj": (None, 1), "k_proj": (0, 1), "v_proj": (0, 1)}


def head_axes(module: str, leaf: str) -> tuple[int | None, int] | None:
    """(KV-heads axis or None, head-dim axis) of one layer's ``params["layers"][module][leaf]``
    (no layer axis) for the attention tensors a padded head layout pads
    (:mod:`jaxrl_llm.models.padded_heads`); None for every other tensor."""
    table = _BIAS_HEAD_AXES if leaf == "bias" else _HEAD_AXES
    return table.get(module)


def padding_masks(config: ModelConfig) -> dict[str, Any]:
    """The stored weights of ``params["layers"]`` a layer does not use, as 0/1 numpy masks
    that broadcast to their stacked shapes (size 1 on every axis but the layers and the
    padded ones, so a real model's masks stay small); 1 where the layer's own weights sit,
    and {} when every layer uses all of them. Zero there stays zero under training: the
    gradient is zero. Gemma 4 (:mod:`jaxrl_llm.models.padded_heads`):

    - heads stored padded (``config.has_padded_heads``): each layer's own head dims and KV
      heads (:func:`jaxrl_llm.models.padded_heads.pad_heads`); a GLOBAL layer's ``v_proj`` with
      ``global_k_eq_v`` is all 0;
    - KV-shared layers (``config.attn.kv_shared_layers``): ``k_proj``, ``v_proj``, ``k_norm`` all 0;
    - ``double_wide_mlp``: a layer's MLP units past its own width (:meth:`ModelConfig.mlp_width`).
    """
    c = config
    specs = param_shapes_and_axes(c)["layers"]
    out: dict[str, Any] = {}
    if c.has_padded_heads or c.attn.global_k_eq_v or c.attn.kv_shared_layers:
        k_store, e_store = c.store_kv_heads, c.store_head_dim
        for name in _HEAD_AXES:
            if name not in specs:
                continue
            out[name] = {}
            for leaf, (shape, _) in specs[name].items():
                axes = head_axes(name, leaf)
                assert axes is not None
                per_layer = []
                for i in range(c.num_layers):
                    k, e = c.layer_heads(i)
                    true_shape = [1] * (len(shape) - 1)
                    true_shape[axes[1]] = e
                    if axes[0] is not None:
                        true_shape[axes[0]] = k
                    m = padded_heads.pad_heads(
                        np.ones(true_shape, np.float32), *axes, k_store, e_store
                    )
                    if name == "v_proj" and c.attn.global_k_eq_v:
                        m = m * (c.attn.layer_types[i] != LayerType.GLOBAL)
                    if name in ("k_proj", "v_proj", "k_norm") and c.kv_shared(i):
                        m = m * 0
                    per_layer.append(m)
                out[name][leaf] = np.stack(per_layer)
    if c.mlp.double_wide:
        f = c.mlp.intermediate_size
        units = np.stack([np.arange(f) < c.mlp_width(i) for i in range(c.num_layers)]).astype(
            np.float32
        )
        out["gate_proj"] = out["up_proj"] = {"kernel": units[:, None, :]}
        out["down_proj"] = {"kernel": units[:, :, None]}
    return out

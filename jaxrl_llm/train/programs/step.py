"""The sharded, jitted train step: exact gradient accumulation, mixed precision, frozen models.

Exact accumulation (reduce late and exactly). A token-mean loss over a
batch is Σ_b,t ℓ_bt m_bt / Σ_b,t m_bt. Averaging per-micro-batch means would weight short
micro-batches wrongly, so the step computes the denominator once over the *whole* batch with
the loss's ``denominator_fn`` and sets ``batch["loss_denominator"]``; every micro-batch loss
then divides by that same number, and the sum of micro-batch losses (and gradients) is exactly
the big-batch loss (and gradient), up to float summation order.

Mixed precision (Micikevicius et al. 2018, https://arxiv.org/abs/1710.03740): the master
parameters and the optimizer state stay in their own dtype (float32); with ``compute_dtype``
the loss sees a copy cast to e.g. bfloat16, and the gradient (which flows back through the
cast) arrives in float32.

The batch is batch-major: every array with a leading dimension is ``[B, ...]``; scalars
(``loss_denominator``) are shared by all micro-batches.

Context parallelism (a mesh whose ``context`` axis has C > 1 devices): the step is traced
under its mesh (:func:`jaxrl_llm.parallel.under_mesh`), so the model's self-attention runs as
ring attention over that axis (Liu et al. 2023, https://arxiv.org/abs/2310.01889), and the
batch's ``[B, T, ...]`` leaves are constrained to rows over data × fsdp and tokens over
``context`` (every micro-batch too). T must be a multiple of C (the trainers pad it,
``jaxrl_llm.data.pad_length``). The loss's (sum, count) reductions over a row's tokens are
global reductions under jit, so the loss and gradient are the single-device ones.

Activations by rows: on a mesh whose batch axes (data × fsdp) have more than one device the
step is traced under its mesh too, so the model's residual stream, MLP activations and
log-prob chunks are placed by rows over those axes (:mod:`jaxrl_llm.models.layout`): FSDP
keeps B / N rows per device and all-gathers each layer's weights, instead of GSPMD splitting
the model dimension of activations that hold every row. A one-device mesh places nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.context import (
    batch_split,
    check_token_lengths,
    constrain_batch,
    context_size,
    under_mesh,
)
from jaxrl_llm.parallel.rules import DEFAULT_RULES, batch_sharding_tree
from jaxrl_llm.train.programs.state import TrainState, cast_floats

LossFn = Callable[..., tuple[jax.Array, Mapping[str, jax.Array]]]

# Metrics the step itself reports (not the loss's own).
STEP_METRICS = ("loss", "grad_norm", "tokens", "loss_tokens", "nonfinite", "computed_micro_batches")


def is_loss_share(key: str) -> bool:
    """A metric that is a share of the loss (``loss``, ``pg/loss``, ``vf/loss``...): with the
    whole batch's denominator, micro-batch values add up to the batch's value."""
    return key == "loss" or key.endswith("/loss")


def count_tokens(batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(real input tokens, loss tokens) of a batch, as float32 scalars.

    Real tokens: the sum of every ``*attention_mask`` (all of ``input_ids`` when there is no
    mask). Loss tokens: the sum of every ``*loss_mask`` (equal to real tokens when none).
    Preference batches count chosen and rejected rows.
    """
    attn = [v for k, v in batch.items() if k.endswith("attention_mask")]
    if attn:
        tokens = sum(jnp.sum(a.astype(jnp.float32)) for a in attn)
    else:
        ids = [v for k, v in batch.items() if k.endswith("input_ids")]
        tokens = jnp.asarray(float(sum(x.size for x in ids)), jnp.float32)
    lm = [v for k, v in batch.items() if k.endswith("loss_mask")]
    loss_tokens = sum(jnp.sum(m.astype(jnp.float32)) for m in lm) if lm else tokens
    return jnp.asarray(tokens, jnp.float32), jnp.asarray(loss_tokens, jnp.float32)


def _batch_axes(sharding) -> tuple[str, ...] | None:
    leaves = jax.tree.leaves(sharding, is_leaf=lambda x: isinstance(x, NamedSharding))
    for s in leaves:
        if isinstance(s, NamedSharding) and len(s.spec) and s.spec[0] is not None:
            first = s.spec[0]
            return (first,) if isinstance(first, str) else tuple(first)
    return None


def split_micro_batches(
    batch: Mapping[str, jax.Array],
    micro_batches: int,
    *,
    mesh: Mesh | None = None,
    batch_axes: tuple[str, ...] | None = None,
    tokens: bool = False,
) -> tuple[dict, dict]:
    """Split ``[B, ...]`` arrays into ``[M, B/M, ...]`` micro-batches (strided rows).

    Micro-batch m holds rows m, m + M, m + 2M, …: with rows sharded in contiguous blocks over
    devices, each device keeps its own rows (no communication) and every micro-batch is
    spread over all devices. Any partition of the rows gives the same summed loss.

    Args:
      batch: dict of arrays; scalars are returned separately.
      micro_batches: M, dividing B (and B / M divisible by the batch shards).
      mesh, batch_axes: when given, the stacked arrays are constrained to
        ``P(None, batch_axes)``.
      tokens: with ``mesh``, constrain each micro-batch as
        :func:`~jaxrl_llm.parallel.batch_sharding_tree` lays it out (tokens of ``[B, T, ...]``
        leaves over the ``context`` axis) behind the leading ``M`` axis, instead.

    Returns:
      ``(stacked, scalars)``: dict of ``[M, B/M, ...]`` arrays and dict of scalars.

    Raises:
      ConfigError: B is not divisible by M.
    """
    stacked, scalars = {}, {}
    for key, x in batch.items():
        if jnp.ndim(x) == 0:
            scalars[key] = x
            continue
        b = x.shape[0]
        if b % micro_batches:
            raise ConfigError(
                f"batch[{key!r}] has {b} rows, not divisible by micro_batches={micro_batches}"
            )
        y = jnp.swapaxes(x.reshape((b // micro_batches, micro_batches) + x.shape[1:]), 0, 1)
        if mesh is not None:
            spec = PartitionSpec(batch_axes)
            if tokens:
                spec = batch_sharding_tree(y[0], mesh, DEFAULT_RULES).spec
            y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, PartitionSpec(None, *spec)))
        stacked[key] = y
    return stacked, scalars


def _grad_fn(loss_fn: LossFn, compute_dtype: Any) -> Callable:
    """``grad_fn(params, batch, frozen, hparams) -> (loss, metrics, grads)``: the loss in
    ``compute_dtype`` and its gradient in the parameters' dtype."""

    def grad_fn(params, mb, frozen, hparams):
        kw = {"hparams": hparams} if hparams else {}

        def f(p):
            loss, metrics = loss_fn(
                cast_floats(p, compute_dtype), mb, **cast_floats(frozen, compute_dtype), **kw
            )
            chex.assert_rank(loss, 0)
            return loss.astype(jnp.float32), metrics

        (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(params)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        return loss, metrics, grads

    return grad_fn


def _skippable(grad_fn: Callable, skip_fn: Callable | None) -> Callable:
    """``grad_fn`` returning a fourth output, 1.0 when the micro-batch was computed; with
    ``skip_fn``, zeros without running the model when ``skip_fn(mb)`` says so."""

    def maybe_grad_fn(params, mb, frozen, hparams):
        if skip_fn is None:
            return (*grad_fn(params, mb, frozen, hparams), jnp.ones((), jnp.float32))
        shapes = jax.eval_shape(grad_fn, params, mb, frozen, hparams)

        def run(params, mb, frozen):
            return (*grad_fn(params, mb, frozen, hparams), jnp.ones((), jnp.float32))

        def skip(params, mb, frozen):
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            return (*zeros, jnp.zeros((), jnp.float32))

        return jax.lax.cond(jnp.asarray(skip_fn(mb), bool), skip, run, params, mb, frozen)

    return maybe_grad_fn


def _accumulate(
    grad_fn: Callable,
    params: Any,
    stacked: dict,
    scalars: dict,
    frozen: dict,
    hparams: dict,
    *,
    param_sharding: Any,
    summed: bool,
):
    """Σ loss and Σ ∇loss over the micro-batches ``stacked`` (``[M, B/M, ...]``) in a
    ``lax.scan`` (float32 accumulators sharded as the parameters); ``summed``: the loss has the
    whole batch's denominator, so shares add up, else the results are averaged. Returns
    ``(loss, metrics, grads, computed micro-batches)``."""
    micro_batches = len(next(iter(stacked.values())))
    zeros = jax.tree.map(jnp.zeros_like, params)
    zeros = jax.lax.with_sharding_constraint(zeros, param_sharding)

    def body(carry, mb):
        g_sum, l_sum = carry
        loss, metrics, grads, ran = grad_fn(params, {**mb, **scalars}, frozen, hparams)
        g_sum = jax.tree.map(jnp.add, g_sum, grads)
        return (g_sum, l_sum + loss), (metrics, ran)

    (grads, loss), (metrics, ran) = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), stacked)
    computed = jnp.sum(ran)

    def reduce(key, m):
        if summed and is_loss_share(key):
            return jnp.sum(m, axis=0)  # shares of the batch's loss add up
        # others: the mean over the micro-batches that ran (all, without skip_fn)
        w = ran.reshape((-1,) + (1,) * (m.ndim - 1))
        return jnp.sum(m * w, axis=0) / jnp.maximum(computed, 1.0)

    metrics = {k: reduce(k, v) for k, v in dict(metrics).items()}
    if not summed:
        grads = jax.tree.map(lambda g: g / micro_batches, grads)
        loss = loss / micro_batches
    return loss, metrics, grads, computed


def _apply_update(
    optimizer: optax.GradientTransformation,
    state: TrainState,
    loss: jax.Array,
    grads: Any,
    *,
    grad_clip: float | None,
    skip_nonfinite: bool,
):
    """Clip ``grads`` by their global norm and apply the optimizer; returns ``(params,
    opt_state, grad_norm, finite)``. With ``skip_nonfinite`` a non-finite loss or gradient
    leaves params and optimizer state untouched (reported as ``nonfinite``)."""
    grad_norm = optax.tree.norm(grads)
    if grad_clip is not None:
        scale = jnp.minimum(1.0, grad_clip / jnp.maximum(grad_norm, 1e-12))
        grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)

    def apply(params, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
        # A branch, not a per-element select: `jnp.where` over params and moments made the
        # update ~3x slower (tools/bench/time_optimizer.py).
        params, opt_state = jax.lax.cond(
            finite, apply, lambda p, s, g: (p, s), state.params, state.opt_state, grads
        )
    else:
        params, opt_state = apply(state.params, state.opt_state, grads)
    return params, opt_state, grad_norm, finite


def _with_hparams(step: Callable, jitted: Callable) -> Callable:
    """``run(state, batch, frozen=None, hparams=None)`` calling ``jitted`` with the traced
    hyperparameters as float32 scalars; ``run.jitted`` is ``jitted`` (for ``.lower``)."""

    @functools.wraps(step)
    def run(
        state: TrainState,
        batch: Mapping[str, jax.Array],
        frozen: Mapping[str, Any] | None = None,
        hparams: Mapping[str, Any] | None = None,
    ):
        hp = {k: jnp.asarray(v, jnp.float32) for k, v in (hparams or {}).items()}
        return jitted(state, dict(batch), dict(frozen or {}), hp)

    run.jitted = jitted  # type: ignore[attr-defined]  # for .lower(...) / cost analysis
    run.__doc__ = (
        "Jitted train step: (state, batch, frozen=None, hparams=None) -> (new_state, metrics)."
    )
    return run


def _step_metrics(metrics, loss, grad_norm, tokens, loss_tokens, finite) -> dict:
    """A step's metrics: the loss's own (float32) and the step's (see make_train_step)."""
    return {
        **{k: jnp.asarray(v, jnp.float32) for k, v in dict(metrics).items()},
        "loss": loss,
        "grad_norm": grad_norm,
        "tokens": tokens,
        "loss_tokens": loss_tokens,
        "nonfinite": 1.0 - finite.astype(jnp.float32),
    }


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    state_sharding: TrainState,
    batch_sharding: Any,
    micro_batches: int = 1,
    denominator_fn: Callable[[Mapping[str, jax.Array]], jax.Array] | None = None,
    grad_clip: float | None = None,
    compute_dtype: Any = None,
    frozen_sharding: Mapping[str, Any] | None = None,
    donate: bool = True,
    skip_nonfinite: bool = True,
    skip_fn: Callable[[Mapping[str, jax.Array]], jax.Array] | None = None,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """Build ``step(state, batch, frozen=None, hparams=None) -> (new_state, metrics)``, jitted
    over ``mesh``. ``hparams`` (``{name: scalar}``, replicated) are traced hyperparameters
    passed to the loss as ``loss_fn(..., hparams=hparams)``: a schedule of them changes values,
    not the compiled program.

    Per step: (1) with ``denominator_fn``, ``batch["loss_denominator"] = denominator_fn(batch)``
    over the full batch; (2) ``lax.scan`` over ``micro_batches`` slices accumulates
    Σ loss and Σ ∇loss in float32 (without ``denominator_fn`` the micro-batch results are
    averaged instead, exact only for losses with a fixed per-row normaliser); (3) optional
    global-norm clipping g ← g · min(1, c / ‖g‖) (Pascanu et al. 2013,
    https://arxiv.org/abs/1211.5063); (4) the optax update.

    Args:
      loss_fn: ``loss_fn(params, batch, **frozen) -> (scalar loss, metrics dict)``; the
        losses package's functions with ``apply_fn`` / ``config`` bound by
        ``functools.partial``. Sign: we minimise ``loss = −objective``.
      optimizer: the optax transformation the state was created with.
      mesh: the device mesh.
      state_sharding: TrainState of NamedShardings (from ``create_train_state``).
      batch_sharding: a NamedSharding for every batch leaf, or a tree matching the batch
        (``parallel.batch_sharding_tree``); on a context mesh the step itself moves tokens
        onto the ``context`` axis, so the rows-only ``parallel.batch_sharding`` is enough.
      micro_batches: M ≥ 1 gradient-accumulation slices; B must be divisible by M.
      denominator_fn: ``batch -> scalar`` (the loss's ``denominator_fn`` with its config bound).
      grad_clip: max global gradient norm (None = no clipping; 1.0 is the usual LLM value).
      compute_dtype: e.g. ``jnp.bfloat16``: params (and frozen params) are cast before the
        loss; master weights and optimizer state keep their dtype. None = no cast.
      frozen_sharding: ``{name: sharding tree}`` of frozen models passed as
        ``frozen={name: params}`` and forwarded to the loss as keyword arguments.
      donate: donate the input state's buffers to the output state.
      skip_nonfinite: when the loss or the gradient norm is NaN/Inf, keep the params and
        optimizer state of the input (the update is skipped) and report ``nonfinite = 1``.
      skip_fn: ``micro_batch -> bool scalar``, True only when that micro-batch's loss and
        gradient are exactly zero (:func:`jaxrl_llm.losses.policy_gradient_zero_batch`): its
        forward and backward are skipped (a ``lax.cond``), the loss's metrics averaged over
        the micro-batches that ran (``computed_micro_batches``); the update stays exact.

    Returns:
      The jitted step (``step.jitted`` lowers). ``metrics`` (replicated scalars): ``loss``,
      ``grad_norm`` (before clipping), ``tokens``, ``loss_tokens``, ``nonfinite`` (1: the
      NaN/Inf guard skipped the update), ``computed_micro_batches`` (with ``skip_fn``) and
      the loss's metrics (means over micro-batches; loss shares summed, :func:`is_loss_share`).
    """
    if micro_batches < 1:
        raise ConfigError(f"micro_batches={micro_batches} must be >= 1")
    if grad_clip is not None and grad_clip <= 0:
        raise ConfigError(f"grad_clip={grad_clip} must be positive (or None for no clipping)")
    param_sharding = state_sharding.params
    context = context_size(mesh)
    batch_grads = functools.partial(
        _batch_grads,
        _skippable(_grad_fn(loss_fn, compute_dtype), skip_fn),
        micro_batches=micro_batches,
        mesh=mesh,
        batch_axes=_batch_axes(batch_sharding),
        tokens=context > 1,
        param_sharding=param_sharding,
        summed=denominator_fn is not None,
    )

    def step(state: TrainState, batch: dict, frozen: dict, hparams: dict):
        batch = dict(batch)
        if context > 1:  # tokens over the context axis (module docstring)
            check_token_lengths(batch, context)
            batch = constrain_batch(batch, mesh)
        if denominator_fn is not None:
            batch["loss_denominator"] = jnp.asarray(denominator_fn(batch), jnp.float32)
        tokens, loss_tokens = count_tokens(batch)
        loss, metrics, grads, computed = batch_grads(state.params, batch, frozen, hparams)
        grads = jax.lax.with_sharding_constraint(grads, param_sharding)
        params, opt_state, grad_norm, finite = _apply_update(
            optimizer, state, loss, grads, grad_clip=grad_clip, skip_nonfinite=skip_nonfinite
        )
        rng, _ = jax.random.split(state.rng)
        new_state = TrainState(params=params, opt_state=opt_state, step=state.step + 1, rng=rng)
        out = _step_metrics(metrics, loss, grad_norm, tokens, loss_tokens, finite)
        if skip_fn is not None:
            out["computed_micro_batches"] = computed
        return new_state, out

    return _jit_step(step, mesh, state_sharding, batch_sharding, frozen_sharding, donate=donate)


def _jit_step(
    step: Callable,
    mesh: Mesh,
    state_sharding: TrainState,
    batch_sharding: Any,
    frozen_sharding: Mapping[str, Any] | None,
    *,
    donate: bool,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """:func:`make_train_step`'s ``step`` jitted with its shardings (``hparams`` and the
    metrics replicated), taking ``frozen`` and ``hparams`` as optional (:func:`_with_hparams`).
    """
    rep = NamedSharding(mesh, PartitionSpec())
    # Traced under the mesh when it splits rows or tokens: the model places its activations
    # by rows (module docstring), and attention goes round the context ring.
    bind = context_size(mesh) > 1 or batch_split(mesh) > 1
    jitted = jax.jit(
        under_mesh(step, mesh) if bind else step,
        in_shardings=(state_sharding, batch_sharding, frozen_sharding or {}, rep),
        out_shardings=(state_sharding, rep),
        donate_argnums=(0,) if donate else (),
    )
    return _with_hparams(step, jitted)


def _batch_grads(
    grad_fn: Callable,
    params: Any,
    batch: dict,
    frozen: dict,
    hparams: dict,
    *,
    micro_batches: int,
    mesh: Mesh,
    batch_axes: Any,
    tokens: bool,
    param_sharding: Any,
    summed: bool,
) -> tuple[jax.Array, Any, Any, jax.Array]:
    """``(loss, metrics, grads, computed micro-batches)`` of one step's ``batch``: one
    ``grad_fn`` call, or ``micro_batches`` slices accumulated by :func:`_accumulate`
    (``tokens``: the slices keep the context axis' token split)."""
    if micro_batches == 1:
        return grad_fn(params, batch, frozen, hparams)
    stacked, scalars = split_micro_batches(
        batch, micro_batches, mesh=mesh, batch_axes=batch_axes, tokens=tokens
    )
    return _accumulate(
        grad_fn,
        params,
        stacked,
        scalars,
        frozen,
        hparams,
        param_sharding=param_sharding,
        summed=summed,
    )

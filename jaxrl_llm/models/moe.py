"""Sparse mixture-of-experts MLP blocks (Qwen3-MoE, Mixtral) and their load-balancing loss.

Routing, as transformers implements both families: router logits ``z = x W_r`` (``[N, X]``,
N tokens, X experts) in the activation dtype, ``p = softmax(z)`` in float32, the top-k
experts by p, and, when ``config.moe.norm_topk_prob`` (Mixtral always; Qwen3-MoE per its config),
their weights renormalised to sum to 1 (which for Mixtral is the softmax over the k selected
logits). Each selected expert is a SwiGLU MLP ``down(silu(x W_g) ⊙ x W_u)``; the block's output
is ``Σ_j w_j · expert_{e_j}(x)``. No capacity and no token dropping: every token reaches its
k experts (as in both transformers implementations). Shazeer et al. 2017,
https://arxiv.org/abs/1701.06538; Mixtral, Jiang et al. 2024, https://arxiv.org/abs/2401.04088;
Qwen3, Yang et al. 2025, https://arxiv.org/abs/2505.09388.

Dispatch (``config.moe.dispatch``, :class:`~jaxrl_llm.models.config.MoeDispatch`): sorted
assignments and grouped matmuls (``SORTED``, default) or every expert on every token
(``DENSE``), in :mod:`jaxrl_llm.models.expert_dispatch`.

Expert parallelism. The logical axis ``experts`` of the expert weights maps to the mesh axis
:data:`EXPERT_AXIS` (``jaxrl_llm.parallel.rules``). Given a mesh with that axis (the ``mesh``
argument, which the trainer's ``Policy`` binds into the model, or the ambient
``jax.set_mesh`` one), the block runs in a ``shard_map`` over the whole mesh: each device
routes the tokens
it holds (rows split over :data:`TOKEN_AXES` as the batch rule splits them, a row's tokens over
the ``context`` axis), runs only its X / E local experts on the assignments that reach them,
and a ``psum`` over the expert axis (and the tensor axis, which splits each expert's F_e) adds
the partial outputs. Tokens are therefore *replicated* over the expert axis, not exchanged
all-to-all: every device of an expert group holds the same rows, so the dense parts of the
model (attention, norms, the unembedding) run redundantly across that axis. This keeps the
batch layout and everything outside this block unchanged (the expert axis carries no batch
rows), costs one all-reduce of ``[N_local, D]`` per layer instead of two all-to-alls of
``[N_local·k, D]``, and splits the experts' weights, gradients and optimizer state E ways. To
scale the tokens, grow ``data`` / ``fsdp``. The weights enter the ``shard_map`` split only over
the expert (and tensor) axes, so an ``fsdp``-sharded expert kernel is gathered over ``fsdp``
on use, as FSDP does for every other weight. Each device's sorted buffers keep all
N_local·k rows (the other experts' assignments sort past its groups and stay zero), so the
grouped matmul's work is the local share but its buffers are not. Without such a mesh (the
samplers) the block is one program that GSPMD partitions.

Load balancing (Switch Transformer, Fedus et al. 2021, https://arxiv.org/abs/2101.03961
eqs. 4–6, as transformers' ``load_balancing_loss_func`` computes it for both families):
with f_x the share of (token, slot) assignments that went to expert x (summing to k over x)
and P_x the mean router probability of x, both pooled over the real tokens of every sparse
layer, ``aux = X · Σ_x f_x P_x``. Its gradient flows through P only. Each block returns the
sums it needs (:class:`MoeStats`), so the pooled value is exact under any token sharding.

gpt-oss (``config.moe.expert_bias``) adds a bias to the router's logits and to each expert's three
projections, and its experts compute the clamped SwiGLU (:func:`gated_activation`). Its router
takes the softmax over its top-k logits, which is the top-k of the softmax renormalised
(``norm_topk_prob``).

Rollout routing replay (R3; Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by
Aligning Training and Inference Routers", https://arxiv.org/abs/2510.11370). Each block
returns the experts it routed every token to (:attr:`MoeStats.experts`), which the samplers
record. Given a :class:`RecordedRouting` (the sampler's choices), a block counts how many of
its routing decisions differ from them and, with ``replay``, routes every token to the
recorded experts instead of its own top-k: the gate weights are still the router's
probabilities, gathered at the recorded experts (and renormalised over them with
``config.moe.norm_topk_prob``, as :func:`route` does), so the router keeps its gradient over the
chosen experts while the choice itself is the sampler's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models.config import Activation, ModelConfig, MoeDispatch
from jaxrl_llm.models.expert_dispatch import ExpertWeights, experts_dense, experts_sorted

#: Mesh axis the experts are split over (``jaxrl_llm.parallel.MESH_AXES``; named here because
#: models/ imports nothing from parallel/).
EXPERT_AXIS = "expert"
#: Mesh axes that split a batch's rows (the ``batch`` rule of ``jaxrl_llm.parallel.rules``).
TOKEN_AXES = ("data", "fsdp")
#: Mesh axis that splits a row's tokens (the ``length`` rule).
LENGTH_AXIS = "context"
#: Mesh axis that splits each expert's hidden width F_e (the ``mlp`` rule).
TENSOR_AXIS = "tensor"


class MoeStats(NamedTuple):
    """Sums over one block's real tokens that the load-balancing loss pools, and its routing.

    Attributes:
      counts: ``[X]`` float32, token-weighted number of (token, slot) assignments per expert.
      probs: ``[X]`` float32, token-weighted sum of the router probabilities.
      tokens: ``[]`` float32, the token weight (real tokens; a shared prompt counted once per
        row of its group).
      experts: ``[B, T, k]`` int32, the experts each token was routed to (its own top-k, or
        the replayed ones); what the samplers record. None only where a caller drops it.
      mismatch: ``[]`` float32, token-weighted number of (token, slot) decisions whose expert
        is not among the recorded ones (:class:`RecordedRouting`); 0 under replay. None
        without a recorded routing.
      own_mismatch: ``[]`` float32, the same for the block's own top-k (what it would have
        chosen); equal to ``mismatch`` without replay. None without a recorded routing.
    """

    counts: jax.Array
    probs: jax.Array
    tokens: jax.Array
    experts: jax.Array | None = None
    mismatch: jax.Array | None = None
    own_mismatch: jax.Array | None = None


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=("experts",), meta_fields=("replay",)
)
@dataclasses.dataclass(frozen=True)
class RecordedRouting:
    """The experts a sampler routed each token to, for every layer (a pytree; R3, Ma et al.
    2025, https://arxiv.org/abs/2510.11370).

    Attributes:
      experts: ``[B, T, L, k]`` int (int16 or int32) expert ids of every token, layer and slot.
      replay: static; True: the MoE blocks route each token to these experts instead of their
        own top-k (rollout routing replay); False: they only count the decisions that differ
        (:attr:`MoeStats.mismatch`).
    """

    experts: jax.Array
    replay: bool = True

    def at_layer(self, layer) -> jax.Array:
        """``[B, T, k]`` int32 the recorded experts of layer ``layer`` (traced int32)."""
        e = jax.lax.dynamic_index_in_dim(self.experts, layer, axis=2, keepdims=False)
        return e.astype(jnp.int32)


def route(
    config: ModelConfig,
    x_nd: jax.Array,
    router_dx: jax.Array,
    *,
    experts: jax.Array | None = None,
    expert_scale: jax.Array | None = None,
    router_bias: jax.Array | None = None,
):
    """Router of one block: (float32 probabilities ``[N, X]``, top-k weights ``[N, k]``
    float32, top-k expert ids ``[N, k]`` int32).

    ``p = softmax(x W_r)`` (logits in x's dtype, softmax in float32); the k largest; with
    ``config.moe.norm_topk_prob`` the k weights are divided by their sum. ``experts`` ``[N, k]``
    (routing replay, R3: https://arxiv.org/abs/2510.11370): route to these instead of the
    top-k; their weights are ``p`` gathered at them, renormalised the same way (with
    ``norm_topk_prob``: the softmax over their k logits), differentiable through ``p``.
    ``expert_scale`` ``[X]`` (Gemma 4's ``per_expert_scale``): each weight is then multiplied
    by its expert's scale. ``router_bias`` ``[X]`` (gpt-oss) is added to the logits.
    """
    chex.assert_rank([x_nd, router_dx], 2)
    logits = jnp.einsum("nd,dx->nx", x_nd, router_dx.astype(x_nd.dtype))
    if router_bias is not None:
        logits = logits + router_bias.astype(x_nd.dtype)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if experts is None:
        weights, experts = jax.lax.top_k(probs, config.moe.num_experts_per_tok)
    else:
        chex.assert_shape(experts, (x_nd.shape[0], config.moe.num_experts_per_tok))
        weights = jnp.take_along_axis(probs, experts, axis=-1)
    if config.moe.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    if expert_scale is not None:
        weights = weights * expert_scale.astype(jnp.float32)[experts]
    return probs, weights, experts.astype(jnp.int32)


def expert_activation(config: ModelConfig):
    """The experts' gate activation: SiLU (SwiGLU experts; Qwen3-MoE, Mixtral, Qwen3.5) or the
    tanh GELU (GeGLU experts; Gemma 4), per ``config.mlp.activation`` (the clamped SwiGLU is
    not a function of the gate alone: :func:`gated_activation`)."""
    if config.mlp.activation == Activation.GELU_TANH:
        return functools.partial(jax.nn.gelu, approximate=True)
    if config.mlp.activation == Activation.CLAMPED_SWIGLU:
        raise ValueError("the clamped SwiGLU reads gate and up together: use gated_activation")
    return jax.nn.silu


def gated_activation(config: ModelConfig):
    """``glu(gate, up)`` of a gated MLP or expert: ``act(gate) ⊙ up`` with
    :func:`expert_activation`, or gpt-oss's clamped SwiGLU
    ``(clip(up, −ℓ, ℓ) + 1) ⊙ g σ(α g)``, ``g = min(gate, ℓ)`` (``config.mlp.swiglu_alpha`` α,
    ``config.mlp.swiglu_limit`` ℓ; transformers' ``GptOssExperts._apply_gate``)."""
    if config.mlp.activation == Activation.CLAMPED_SWIGLU:
        alpha, limit = config.mlp.swiglu_alpha, config.mlp.swiglu_limit

        def clamped(gate, up):
            g = jnp.minimum(gate, limit)
            u = jnp.clip(up, -limit, limit)
            return (u + 1) * (g * jax.nn.sigmoid(g * alpha))

        return clamped
    act = expert_activation(config)
    return lambda gate, up: act(gate) * up


def _stats(config: ModelConfig, probs, experts, token_w) -> MoeStats:
    hits = jax.nn.one_hot(experts, config.moe.num_experts, dtype=jnp.float32).sum(axis=1)
    return MoeStats(
        counts=jnp.einsum("nx,n->x", hits, token_w),
        probs=jnp.einsum("nx,n->x", probs, token_w),
        tokens=jnp.sum(token_w),
    )


def differing_decisions(experts: jax.Array, recorded: jax.Array) -> jax.Array:
    """``[..., k]`` bool: slot j's expert ``experts[..., j]`` is none of ``recorded[..., :]``
    (the routing decisions that differ, whatever the order of the k slots)."""
    return ~jnp.any(experts[..., :, None] == recorded[..., None, :], axis=-1)


def _block(config, x_nd, rx_nd, token_w, recorded, replay, router, router_bias, scale, w, offset):
    """One block on N tokens: (``[N, D]`` float32 output, :class:`MoeStats` with ``experts``
    ``[N, k]``). ``rx_nd`` the router's input (None: ``x_nd``), ``router_bias`` the router's
    bias or None, ``scale`` the per-expert weight scale or None, ``w`` the
    :class:`ExpertWeights`; ``recorded`` ``[N, k]`` or None: the sampler's experts (replayed
    when ``replay``, static)."""
    dtype = x_nd.dtype
    probs, weights, experts = route(
        config,
        x_nd if rx_nd is None else rx_nd,
        router,
        experts=recorded if replay and recorded is not None else None,
        expert_scale=scale,
        router_bias=router_bias,
    )
    run = experts_dense if config.moe.dispatch == MoeDispatch.DENSE else experts_sorted
    w = jax.tree.map(lambda a: a.astype(dtype), w)
    y = run(x_nd, weights, experts, w, offset, gated_activation(config))
    stats = _stats(config, probs, experts, token_w)._replace(experts=experts)
    if recorded is not None:
        own = experts
        if replay:
            own = jax.lax.top_k(probs, config.moe.num_experts_per_tok)[1].astype(jnp.int32)
        count = lambda e: jnp.einsum(  # noqa: E731
            "n,n->", jnp.sum(differing_decisions(e, recorded), -1).astype(jnp.float32), token_w
        )
        stats = stats._replace(mismatch=count(experts), own_mismatch=count(own))
    return y, stats


def _expert_mesh(mesh):
    """``mesh`` (default the ambient ``jax.set_mesh`` one) when it has the expert axis and no
    manual axes (not already inside a ``shard_map``), else None."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh.empty or EXPERT_AXIS not in mesh.axis_names:
        return None
    if jax.sharding.get_abstract_mesh().manual_axes:
        return None
    return mesh


def _split(mesh, size: int, axes: tuple[str, ...]) -> tuple[str, ...]:
    """The axes (in order) of ``axes`` present in ``mesh`` whose product divides ``size``."""
    out: list[str] = []
    prod = 1
    for a in axes:
        if a in mesh.axis_names and size % (prod * mesh.shape[a]) == 0:
            out.append(a)
            prod *= mesh.shape[a]
    return tuple(out)


def _block_params(lp: Mapping[str, Any]) -> tuple[Any, Any, Any, ExpertWeights]:
    """(router, router bias or None, per-expert scale or None, :class:`ExpertWeights`) of a
    layer, as :func:`_block` takes."""
    scale = lp["expert_scale"]["scale"] if "expert_scale" in lp else None
    names = ("experts_gate", "experts_up", "experts_down")
    kernels = [lp[n]["kernel"] for n in names]
    biases = [lp[n].get("bias") for n in names]
    return (
        lp["router"]["kernel"],
        lp["router"].get("bias"),
        scale,
        ExpertWeights(*kernels, *biases),
    )


def sparse_moe(
    config: ModelConfig,
    x_btd: jax.Array,
    token_w_bt: jax.Array | None,
    lp: Mapping[str, Any],
    *,
    mesh: jax.sharding.Mesh | None = None,
    recorded_btk: jax.Array | None = None,
    replay: bool = False,
    router_x_btd: jax.Array | None = None,
) -> tuple[jax.Array, MoeStats]:
    """One sparse MoE MLP block on ``x_btd`` (the normed MLP input ``[B, T, D]``).

    Args:
      config: a config with ``num_experts > 0``.
      x_btd: ``[B, T, D]`` in the compute dtype.
      token_w_bt: ``[B, T]`` weight of each token in the load-balancing statistics (the
        attention mask; None = every token 1).
      lp: the layer's parameters: ``router`` ``{"kernel": [D, X]}``, ``experts_gate`` /
        ``experts_up`` ``{"kernel": [X, D, F_e]}``, ``experts_down`` ``{"kernel": [X, F_e, D]}``
        (each with a ``"bias"``, ``[X]`` / ``[X, F_e]`` / ``[X, D]``, under
        ``config.moe.expert_bias``);
        with ``expert_scale`` ``{"scale": [X]}`` (Gemma 4) each routing weight is multiplied
        by its expert's scale.
      mesh: the device mesh; default the ambient one (``jax.set_mesh``). With an
        :data:`EXPERT_AXIS` axis the block runs expert-parallel (module docstring); without
        one, or with no mesh, it runs as one program that GSPMD partitions.
      recorded_btk: ``[B, T, k]`` int the experts a sampler routed each token to (None: no
        record): the stats count the decisions that differ (:attr:`MoeStats.mismatch`).
      replay: static; with ``recorded_btk``, route to those experts instead of the own top-k
        (R3, module docstring).
      router_x_btd: ``[B, T, D]`` the router's input when it is not ``x_btd`` (Gemma 4 routes
        the residual stream through its own norm); None: ``x_btd``.

    Returns:
      (``[B, T, D]`` block output in x's dtype, :class:`MoeStats` of this block, with
      ``experts`` ``[B, T, k]``).

    Raises:
      ValueError: under an expert mesh whose expert axis does not divide X.
    """
    chex.assert_rank(x_btd, 3)
    b, t, d = x_btd.shape
    if token_w_bt is None:
        token_w_bt = jnp.ones((b, t), jnp.float32)
    token_w_bt = token_w_bt.astype(jnp.float32)
    params = _block_params(lp)
    router_bias, scale, w = params[1:]
    k = config.moe.num_experts_per_tok
    recorded = None
    if recorded_btk is not None:
        chex.assert_shape(recorded_btk, (b, t, k))
        recorded = recorded_btk.astype(jnp.int32)
    mesh = _expert_mesh(mesh)
    if mesh is None:
        rec_nk = None if recorded is None else recorded.reshape(b * t, k)
        rx = None if router_x_btd is None else router_x_btd.reshape(b * t, d)
        y, stats = _block(
            config, x_btd.reshape(b * t, d), rx, token_w_bt.reshape(-1), rec_nk, replay, *params, 0
        )
        return y.astype(x_btd.dtype).reshape(b, t, d), stats._replace(
            experts=stats.experts.reshape(b, t, k)
        )

    return _expert_parallel(config, mesh, x_btd, router_x_btd, token_w_bt, recorded, replay, params)


def _expert_parallel(
    config: ModelConfig,
    mesh: jax.sharding.Mesh,
    x_btd: jax.Array,
    router_x_btd: jax.Array | None,
    token_w_bt: jax.Array,
    recorded: jax.Array | None,
    replay: bool,
    params: tuple,
) -> tuple[jax.Array, MoeStats]:
    """:func:`sparse_moe` on a mesh with an :data:`EXPERT_AXIS` axis: each expert shard runs
    its experts on every token of its rows (``shard_map``), the outputs summed over the
    expert (and tensor) shards, the statistics over the row shards."""
    b, t, d = x_btd.shape
    router_bias, scale, w = params[1:]
    k = config.moe.num_experts_per_tok
    num_shards = int(mesh.shape[EXPERT_AXIS])
    x_count = config.moe.num_experts
    if x_count % num_shards:
        raise ValueError(
            f"num_experts={x_count} is not divisible by the mesh's {EXPERT_AXIS!r} axis "
            f"({num_shards}); choose an expert axis size that divides it"
        )
    rows = _split(mesh, b, TOKEN_AXES)
    length = _split(mesh, t, (LENGTH_AXIS,))
    f_split = _split(mesh, config.moe.intermediate_size, (TENSOR_AXIS,))
    tok_spec = P(rows or None, length or None)
    x_spec = P(rows or None, length or None, None)
    rec_spec = P(rows or None, length or None, None)
    biased = w.gate_bias is not None
    w_spec: Any = ExpertWeights(
        P(EXPERT_AXIS, None, f_split or None),  # type: ignore[arg-type]
        P(EXPERT_AXIS, None, f_split or None),  # type: ignore[arg-type]
        P(EXPERT_AXIS, f_split or None, None),  # type: ignore[arg-type]
        P(EXPERT_AXIS, f_split or None) if biased else None,  # type: ignore[arg-type]
        P(EXPERT_AXIS, f_split or None) if biased else None,  # type: ignore[arg-type]
        P(EXPERT_AXIS, None) if biased else None,  # type: ignore[arg-type]
    )
    in_specs = (
        x_spec,
        None if router_x_btd is None else x_spec,
        tok_spec,
        None if recorded is None else rec_spec,
        P(),
        None if router_bias is None else P(),
        None if scale is None else P(),
        w_spec,
    )
    reduce_out = (EXPERT_AXIS, *f_split)
    reduce_stats = rows + length
    num_local = x_count // num_shards

    def local(x, rx, token_w, rec, router, router_bias, scale, w):
        lb, lt, _ = x.shape
        offset = jax.lax.axis_index(EXPERT_AXIS) * num_local
        rec_nk = None if rec is None else rec.reshape(lb * lt, k)
        if w.down_bias is not None and f_split:  # added once, not once per tensor shard
            first = jnp.sum(jnp.stack([jax.lax.axis_index(a) for a in f_split])) == 0
            w = w._replace(down_bias=w.down_bias * first.astype(w.down_bias.dtype))
        y, stats = _block(
            config,
            x.reshape(lb * lt, d),
            None if rx is None else rx.reshape(lb * lt, d),
            token_w.reshape(-1),
            rec_nk,
            replay,
            router,
            router_bias,
            scale,
            w,
            offset,
        )
        y = jax.lax.psum(y, reduce_out).astype(x.dtype).reshape(lb, lt, d)
        experts = stats.experts.reshape(lb, lt, k)  # every expert shard routes alike
        sums = stats._replace(experts=None)
        if reduce_stats:
            sums = jax.tree.map(lambda s: jax.lax.psum(s, reduce_stats), sums)
        return y, sums._replace(experts=experts)

    counted = None if recorded is None else P()
    stats_spec: Any = MoeStats(P(), P(), P(), rec_spec, counted, counted)  # type: ignore[arg-type]
    run = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=(x_spec, stats_spec))
    return run(x_btd, router_x_btd, token_w_bt, recorded, *params)


def load_balancing_loss(stats: MoeStats, num_experts: int) -> jax.Array:
    """Switch Transformer's auxiliary load-balancing loss (Fedus et al. 2021,
    https://arxiv.org/abs/2101.03961 eq. 4), pooled as transformers pools it over layers:

    ``aux = X · Σ_x (Σ_l counts_lx / Σ_l tokens_l) · (Σ_l probs_lx / Σ_l tokens_l)``.

    Args:
      stats: :class:`MoeStats` with a leading layer axis (``counts`` / ``probs`` ``[L, X]``,
        ``tokens`` ``[L]``) or of a single block.
      num_experts: X.

    Returns:
      ``[]`` float32; k when the routing is uniform (each expert's f_x = k / X, P_x = 1 / X);
      0 when there is no real token. Differentiable through ``probs`` only.
    """
    counts = jnp.sum(stats.counts.reshape(-1, num_experts), axis=0)
    probs = jnp.sum(stats.probs.reshape(-1, num_experts), axis=0)
    total = jnp.sum(stats.tokens)
    safe = jnp.where(total > 0, total, 1.0)
    aux = num_experts * jnp.sum((counts / safe) * (probs / safe))
    return jnp.where(total > 0, aux, 0.0)

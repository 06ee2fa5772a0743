"""How a mixture-of-experts block runs its tokens' (token, expert) assignments through the
experts' weights (:mod:`jaxrl_llm.models.moe` routes them and sums the results).

Dispatch (``config.moe.dispatch``, :class:`~jaxrl_llm.models.config.MoeDispatch`):

* ``SORTED`` (default): the N·k (token, expert) assignments are put in expert order by a
  stable counting sort (a ``[N·k, X + 1]`` int32 one-hot and its cumulative sum, no
  comparison sort), the token rows gathered into that order (``[N·k, D]``) and each expert's
  contiguous rows multiplied by its weights with one grouped matmul, ``jax.lax.ragged_dot``
  (a native grouped GEMM on TPU / GPU). FLOPs are exactly the active ones, 6·N·k·D·F_e per
  block; extra memory is the ``[N·k, D]`` gathered copy and the ``[N·k, F_e]`` hidden
  activations (what a dense MLP of width k·F_e would hold). On CPU XLA has no grouped GEMM
  and JAX lowers ``ragged_dot`` to a masked dense product over the groups (X× the FLOPs),
  which is fine for tests only.
* ``DENSE``: every expert runs on every token (``einsum`` over ``[N, X, F_e]``) and a
  capacity-free one-hot combine weights the outputs: X/k × the FLOPs and an ``[N, X, F_e]``
  activation. Simple and shape-static; for tiny models and as a cross-check of ``SORTED``.

Both take the local experts ``offset .. offset + X_local`` of :class:`ExpertWeights` (all of
them outside expert parallelism) and count the assignments to other experts as 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def experts_sorted(x_nd, weights, experts, w, offset, glu):
    """Σ_j w_j expert_{e_j}(x) over the experts ``offset .. offset + X_local`` that the
    :class:`ExpertWeights` ``w`` (gate ``[X_local, D, F]``) hold, by sorting the assignments by
    expert and grouped matmuls; ``glu(gate, up)`` the gated activation. Assignments to other
    experts contribute 0."""
    w_gate, w_up, w_down = w.gate, w.up, w.down
    n, k = experts.shape
    num_local = w_gate.shape[0]
    local = experts.reshape(n * k) - offset
    mine = (local >= 0) & (local < num_local)
    key = jnp.where(mine, local, num_local)  # other experts' assignments sort last
    # A stable counting sort: assignment a goes to slot start[key_a] + (its rank among the
    # assignments with that key). (A counting sort, not jnp.argsort: it is O(N·k·X_local)
    # and, inside shard_map, argsort's indices gave wrong input gradients in jax 0.10.)
    hits = jax.nn.one_hot(key, num_local + 1, dtype=jnp.int32)
    counts = jnp.sum(hits, axis=0)
    rank = jnp.sum((jnp.cumsum(hits, axis=0) - 1) * hits, axis=1)
    slot = (jnp.cumsum(counts) - counts)[key] + rank  # [N·k] position in sorted order
    order = jnp.zeros_like(slot).at[slot].set(jnp.arange(n * k, dtype=slot.dtype))
    group_sizes = counts[:num_local]
    x_ad = x_nd[order // k]
    # bfloat16 operands multiply exactly at any precision; asking for more (a global
    # jax_default_matmul_precision="highest") makes TPU's grouped-matmul kernel fail to compile.
    precision = jax.lax.Precision.DEFAULT if x_nd.dtype == jnp.bfloat16 else None
    grouped = lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision)
    gate = grouped(x_ad, w_gate)
    up = grouped(x_ad, w_up)
    row_expert = jnp.minimum(key[order], num_local - 1)  # past the groups: any expert
    if w.gate_bias is not None:  # each sorted row's expert's biases
        gate = gate + w.gate_bias[row_expert]
        up = up + w.up_bias[row_expert]
    y_ad = grouped(glu(gate, up), w_down)
    if w.down_bias is not None:
        y_ad = y_ad + w.down_bias[row_expert]
    # Rows past the last local group are not defined by every backend's grouped matmul.
    y_ad = jnp.where(jnp.arange(n * k)[:, None] < jnp.sum(group_sizes), y_ad, 0)
    y_nkd = y_ad[slot].reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", y_nkd.astype(jnp.float32), weights * mine.reshape(n, k))


def experts_dense(x_nd, weights, experts, w, offset, glu):
    """:func:`experts_sorted` by running every local expert on every token and combining
    with the one-hot routing weights (``[N, X_local]``)."""
    num_local = w.gate.shape[0]
    onehot = jax.nn.one_hot(experts - offset, num_local, dtype=jnp.float32)  # 0 off-range
    combine = jnp.einsum("nkx,nk->nx", onehot, weights)
    gate = jnp.einsum("nd,xdf->nxf", x_nd, w.gate)
    up = jnp.einsum("nd,xdf->nxf", x_nd, w.up)
    if w.gate_bias is not None:
        gate, up = gate + w.gate_bias[None], up + w.up_bias[None]
    y = jnp.einsum("nxf,xfd->nxd", glu(gate, up), w.down)
    if w.down_bias is not None:
        y = y + w.down_bias[None]
    return jnp.einsum("nxd,nx->nd", y.astype(jnp.float32), combine)


class ExpertWeights(NamedTuple):
    """One layer's (local) experts: kernels gate / up ``[X, D, F_e]``, down ``[X, F_e, D]``;
    their biases ``[X, F_e]`` / ``[X, D]`` with ``config.moe.expert_bias`` (gpt-oss), else None."""

    gate: jax.Array
    up: jax.Array
    down: jax.Array
    gate_bias: jax.Array | None = None
    up_bias: jax.Array | None = None
    down_bias: jax.Array | None = None

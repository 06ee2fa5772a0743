"""Grouped-query attention in O(T) memory, with the accelerators' fused kernels where they apply.

Three implementations share one signature and one mask description:

- :func:`naive_attention` materialises the scores ``[B, K, G, T, S]`` (memory ∝ T·S). It is the
  fastest for tiny shapes and for the decode step (T = 1 against a KV cache).
- :func:`blockwise_attention` is the memory-efficient / flash formulation in pure JAX: queries
  in blocks of ``block_q``, keys in blocks of ``block_k``, a running maximum and sum per query
  row (Rabe & Staats 2021, "Self-attention does not need O(n²) memory",
  https://arxiv.org/abs/2112.05682; Dao et al. 2022, "FlashAttention",
  https://arxiv.org/abs/2205.14135), and a custom backward that recomputes each block's scores
  from the saved log-sum-exp (FlashAttention-2, https://arxiv.org/abs/2307.08691 §3.1), so
  neither pass stores a ``T × S`` array. Key blocks after the last query of a block (causal)
  are skipped in both passes.
- the fused kernels, chosen by :func:`select_attention_impl` from the backend and the features
  in use: cuDNN flash attention on GPU (``jax.nn.dot_product_attention(...,
  implementation="cudnn")``) and the Pallas splash-attention kernel on TPU
  (``jax.experimental.pallas.ops.tpu.splash_attention``). Anything they cannot express falls
  back to the blockwise path.

The mask is never a ``[B, T, S]`` array in the blockwise path: :class:`AttentionMask` holds
per-row vectors and each block's mask is computed from them. Query t of row b may attend to
key s when

    (s ≤ q_index[t]  or no causal index)  ∧ k_valid[b, s]  ∧ q_seg[b, t] = k_seg[b, s]
        ∧ q_pos[b, t] − k_pos[b, s] < window,

or when s = q_index[t] (a query always sees its own slot, so no row is empty and padded queries
stay finite; their output is ignored). Scores are ``q·k / √E``, soft-capped as in Gemma 2
(``cap · tanh(s / cap)``, https://arxiv.org/abs/2408.00118) when ``softcap`` is set.

Shapes: B batch, T queries, S keys, H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import AttentionImpl

_NEG_INF = -1e30  # large finite negative: masked scores stay finite (no inf − inf = NaN).

# Up to this many score entries per (row, head), T·S, :attr:`AttentionImpl.AUTO` runs the naive
# path. Measured (tools/bench/results/attention.md: SmolLM2-135M heads, float32, causal,
# forward + backward, 2-core CPU shared with other jobs): equal times up to T = S = 512 (there
# the blockwise path is a single 512 × 512 block, the same arithmetic), blockwise 0.39× the
# naive time at 1,024 and 0.28× at 2,048. Keeping the naive path below keeps the decode step
# (T = 1) exactly as before.
NAIVE_MAX_SCORES = 512 * 512


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["q_index", "k_valid", "q_positions", "k_positions", "q_segments", "k_segments"],
    meta_fields=["self_attention"],
)
@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Compact per-row description of which keys each query may attend to (a pytree).

    Attributes:
      q_index: ``[T]`` int32 slot (key column) of each query, for causality (key s is visible
        when s ≤ q_index[t]); None = not causal. Self-attention: ``arange(T)``; a KV cache:
        ``write_index + arange(T)``.
      k_valid: ``[B, S]`` bool, the key holds a real token; None = all real.
      q_positions, k_positions: ``[B, T]``, ``[B, S]`` int32 RoPE positions (sliding window
        only; None without a window).
      q_segments, k_segments: ``[B, T]``, ``[B, S]`` int segment ids (packing); None = one
        segment.
      self_attention: static; True when the keys are the queries' own tokens and
        ``q_index == arange(T)`` (:func:`causal_self_mask`), the case the fused kernels take.
    """

    q_index: jax.Array | None = None
    k_valid: jax.Array | None = None
    q_positions: jax.Array | None = None
    k_positions: jax.Array | None = None
    q_segments: jax.Array | None = None
    k_segments: jax.Array | None = None
    self_attention: bool = False


def causal_self_mask(
    attention_mask: jax.Array | None,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    *,
    num_tokens: int | None = None,
) -> AttentionMask:
    """The :class:`AttentionMask` of causal self-attention over ``[B, T]`` tokens.

    Args:
      attention_mask: ``[B, T]`` 1 for real tokens (None = all real).
      positions: ``[B, T]`` RoPE positions (needed only with a sliding window).
      segment_ids: ``[B, T]`` packing segment ids or None.
      num_tokens: T, needed only when all three are None.
    """
    known = [x for x in (attention_mask, positions, segment_ids) if x is not None]
    if known:
        t = known[0].shape[1]
    elif num_tokens is None:
        raise ValueError(
            "causal_self_mask needs num_tokens when attention_mask, positions and "
            "segment_ids are all None"
        )
    else:
        t = int(num_tokens)
    return AttentionMask(
        q_index=jnp.arange(t, dtype=jnp.int32),
        k_valid=None if attention_mask is None else attention_mask.astype(bool),
        q_positions=positions,
        k_positions=positions,
        q_segments=segment_ids,
        k_segments=segment_ids,
        self_attention=True,
    )


def _allowed(mask: AttentionMask, q_index, k_index, q_sl, k_sl, window):
    """Bool, broadcastable to ``[B, t, s]``, for the queries ``q_index`` (None: not causal) and
    keys ``k_index`` of one block; ``q_sl`` / ``k_sl`` take the block's part of a ``[B, ·]``
    vector."""
    ok = jnp.ones((1, 1, k_index.shape[0]), bool)
    if q_index is not None:
        ok = (k_index[None, :] <= q_index[:, None])[None]
    if mask.k_valid is not None:
        ok = ok & k_sl(mask.k_valid)[:, None, :]
    if mask.q_segments is not None:
        ok = ok & (q_sl(mask.q_segments)[:, :, None] == k_sl(mask.k_segments)[:, None, :])
    if window is not None:
        diff = q_sl(mask.q_positions)[:, :, None] - k_sl(mask.k_positions)[:, None, :]
        ok = ok & (diff < window)
    if q_index is not None:
        ok = ok | (k_index[None, :] == q_index[:, None])[None]
    return ok


def _check(q, k, v, mask: AttentionMask, window):
    chex.assert_rank([q, k, v], 4)
    chex.assert_equal_shape([k, v])
    b, t, h, e = q.shape
    s, kh = k.shape[1], k.shape[2]
    chex.assert_shape(k, (b, s, kh, e))
    if h % kh:
        raise ValueError(f"{h} query heads are not a multiple of {kh} key/value heads")
    if mask.q_index is not None:
        chex.assert_shape(mask.q_index, (t,))
    if mask.k_valid is not None:
        chex.assert_shape(mask.k_valid, (b, s))
    if (mask.q_segments is None) != (mask.k_segments is None):
        raise ValueError("q_segments and k_segments must be given together")
    if mask.q_segments is not None:
        chex.assert_shape([mask.q_segments], (b, t))
        chex.assert_shape([mask.k_segments], (b, s))
    if window is not None:
        if mask.q_positions is None or mask.k_positions is None:
            raise ValueError("a sliding window needs q_positions and k_positions")
        chex.assert_shape(mask.q_positions, (b, t))
        chex.assert_shape(mask.k_positions, (b, s))


def _cap(s, softcap):
    return s if softcap is None else softcap * jnp.tanh(s / softcap)


def naive_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
) -> jax.Array:
    """Grouped-query attention that materialises the scores ``[B, K, G, T, S]``.

    ``softmax(cap(q·kᵀ/√E) masked) · v`` with H = K·G query heads laid out ``[B, T, K·G, E]``
    (query head h uses key/value head h // G); K/V are never repeated.

    Args:
      q_btne: ``[B, T, H, E]`` queries (RoPE applied). k_bske, v_bske: ``[B, S, K, E]``.
      mask: :class:`AttentionMask`. window: sliding window in positions (an int, or a traced
        int32 scalar when layers differ) or None.
      softcap: Gemma 2 logit soft cap or None.
    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    _check(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    s, kh = k_bske.shape[1], k_bske.shape[2]
    q = q_btne.reshape(b, t, kh, h // kh, e)
    scores = jnp.einsum(
        "btkge,bske->bkgts", q, k_bske, preferred_element_type=jnp.float32
    ) / math.sqrt(e)
    scores = _cap(scores, softcap)
    allowed = _allowed(
        mask, mask.q_index, jnp.arange(s, dtype=jnp.int32), lambda x: x, lambda x: x, window
    )
    scores = jnp.where(allowed[:, None, None, :, :], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_bske.dtype)
    out = jnp.einsum("bkgts,bske->btkge", probs, v_bske)
    return out.reshape(b, t, h, e)


def one_query_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
) -> jax.Array:
    """:func:`naive_attention` for T = 1 (a decode step): the same scores, softmax and
    weighted sum, written as products summed over E and over S instead of two batched dots.

    Each of the B·K dots would be a [G, E] × [E, S] product far too small for a GEMM kernel;
    as products and sums XLA fuses them into passes over the keys and values. Used by the
    paged engine's decode step, whose keys/values are gathered from pages into their own
    buffer (SmolLM2, 32 rows × 192 slots, CPU: its paged trunk 125 → 110 ms per step). Not
    used on the dense cache: there XLA fuses the read of the cache just updated in place into
    these sums and the static engine's step ran 7× slower."""
    _check(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    if t != 1:
        raise ValueError(f"one_query_attention takes one query per row, got T = {t}")
    s, kh = k_bske.shape[1], k_bske.shape[2]
    f32 = jnp.float32
    q = q_btne.reshape(b, 1, kh, h // kh, e).astype(f32)
    scores = jnp.sum(q * k_bske[:, :, :, None, :].astype(f32), axis=-1) / math.sqrt(e)
    scores = _cap(scores, softcap)  # [B, S, K, G]
    allowed = _allowed(
        mask, mask.q_index, jnp.arange(s, dtype=jnp.int32), lambda x: x, lambda x: x, window
    )  # [B, 1, S]
    scores = jnp.where(allowed[:, 0, :, None, None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=1).astype(v_bske.dtype).astype(f32)
    out = jnp.sum(probs[..., None] * v_bske[:, :, :, None, :].astype(f32), axis=1)
    return out.astype(v_bske.dtype).reshape(b, 1, h, e)


# ----- blockwise ------------------------------------------------------------------------------


def _pad_to(x, n, axis, value=0):
    extra = n - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _pad_mask(mask: AttentionMask, tp: int, sp: int) -> AttentionMask:
    """Pad the per-row vectors to ``tp`` queries / ``sp`` keys. Padded keys must already be
    marked invalid by the caller; padded queries get q_index −1 (they see nothing and their
    rows are dropped afterwards)."""

    def pad(x, n, axis, value=0):
        return None if x is None else _pad_to(x, n, axis, value)

    return dataclasses.replace(
        mask,
        q_index=pad(mask.q_index, tp, 0, -1),
        k_valid=pad(mask.k_valid, sp, 1, False),
        q_positions=pad(mask.q_positions, tp, 1),
        k_positions=pad(mask.k_positions, sp, 1),
        q_segments=pad(mask.q_segments, tp, 1),
        k_segments=pad(mask.k_segments, sp, 1),
    )


def _block_fns(mask: AttentionMask, window, bq, bk):
    """Per-block helpers: slicers of a [B, ·] vector for query block i / key block j, and the
    mask of block (i, j)."""

    def q_sl(i):
        return lambda x: jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=1)

    def k_sl(j):
        return lambda x: jax.lax.dynamic_slice_in_dim(x, j * bk, bk, axis=1)

    def allowed(i, j):
        q_index = (
            None if mask.q_index is None else jax.lax.dynamic_slice_in_dim(mask.q_index, i * bq, bq)
        )
        k_index = j * bk + jnp.arange(bk, dtype=jnp.int32)
        return _allowed(mask, q_index, k_index, q_sl(i), k_sl(j), window)

    return q_sl, k_sl, allowed


def _kv_blocks_for(mask: AttentionMask, nq, nk, bq, bk):
    """``[nq]`` number of key blocks each query block must visit (causal skipping)."""
    if mask.q_index is None:
        return jnp.full((nq,), nk, jnp.int32)
    last = jnp.max(mask.q_index.reshape(nq, bq), axis=1)
    return jnp.clip(last // bk + 1, 0, nk).astype(jnp.int32)


def _first_q_block_for(mask: AttentionMask, nq, nk, bq, bk):
    """``[nk]`` first query block that can see key block j (blocks before it are skipped)."""
    if mask.q_index is None:
        return jnp.zeros((nk,), jnp.int32)
    last = jnp.max(mask.q_index.reshape(nq, bq), axis=1)  # [nq]
    starts = jnp.arange(nk, dtype=jnp.int32) * bk  # [nk]
    sees = last[None, :] >= starts[:, None]  # [nk, nq]
    return jnp.where(jnp.any(sees, axis=1), jnp.argmax(sees, axis=1), nq).astype(jnp.int32)


def _scores(q_blk, k_blk, scale, softcap):
    """Scaled (and capped) scores ``[B, K, G, bq, bk]`` in float32; also tanh for the backward."""
    s = jnp.einsum("btkge,bske->bkgts", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
    if softcap is None:
        return s, None
    th = jnp.tanh(s / softcap)
    return softcap * th, th


def _forward(q, k, v, mask, window, softcap, bq, bk):
    """Padded inputs: q ``[B, Tp, K, G, E]``, k/v ``[B, Sp, K, E]``. Returns (out like q,
    lse ``[B, K, G, Tp]`` float32)."""
    b, tp, kh, g, e = q.shape
    sp = k.shape[1]
    nq, nk = tp // bq, sp // bk
    scale = 1.0 / math.sqrt(e)
    q_sl, k_sl, allowed = _block_fns(mask, window, bq, bk)
    n_kv = _kv_blocks_for(mask, nq, nk, bq, bk)

    def q_block(i):
        q_blk = q_sl(i)(q)

        def kv_step(j, carry):
            o, m, l = carry
            s, _ = _scores(q_blk, k_sl(j)(k), scale, softcap)
            s = jnp.where(allowed(i, j)[:, None, None], s, _NEG_INF)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            alpha = jnp.exp(m - m_new)
            l = alpha * l + jnp.sum(p, axis=-1)
            pv = jnp.einsum(
                "bkgts,bske->bkgte",
                p.astype(v.dtype),
                k_sl(j)(v),
                preferred_element_type=jnp.float32,
            )
            return alpha[..., None] * o + pv, m_new, l

        init = (
            jnp.zeros((b, kh, g, bq, e), jnp.float32),
            jnp.full((b, kh, g, bq), _NEG_INF, jnp.float32),
            jnp.zeros((b, kh, g, bq), jnp.float32),
        )
        o, m, l = jax.lax.fori_loop(0, n_kv[i], kv_step, init)
        l_safe = jnp.where(l > 0, l, 1.0)
        return o / l_safe[..., None], m + jnp.log(l_safe)

    o, lse = jax.lax.map(q_block, jnp.arange(nq))  # [nq, B, K, G, bq, ·]
    out = jnp.transpose(o, (1, 0, 4, 2, 3, 5)).reshape(b, tp, kh, g, e).astype(v.dtype)
    lse = jnp.transpose(lse, (1, 2, 3, 0, 4)).reshape(b, kh, g, tp)
    return out, lse


def _backward(q, k, v, mask, window, softcap, bq, bk, out, lse, do):
    """Gradients (dq, dk, dv) from recomputed block scores (FlashAttention-2 backward):
    P = exp(S − lse), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = dS K / √E,
    dK = dSᵀ Q / √E (times 1 − tanh² under a soft cap)."""
    b, tp, kh, g, e = q.shape
    sp = k.shape[1]
    nq, nk = tp // bq, sp // bk
    scale = 1.0 / math.sqrt(e)
    q_sl, k_sl, allowed = _block_fns(mask, window, bq, bk)
    first_q = _first_q_block_for(mask, nq, nk, bq, bk)
    delta = jnp.einsum("btkge,btkge->bkgt", do.astype(jnp.float32), out.astype(jnp.float32))

    def t_sl(i):  # slices of [B, K, G, T] arrays
        return lambda x: jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=3)

    def kv_block(dq, j):
        k_blk, v_blk = k_sl(j)(k), k_sl(j)(v)

        def q_step(i, carry):
            dq, dk, dv = carry
            q_blk, do_blk = q_sl(i)(q), q_sl(i)(do)
            s, th = _scores(q_blk, k_blk, scale, softcap)
            ok = allowed(i, j)[:, None, None]
            p = jnp.where(ok, jnp.exp(s - t_sl(i)(lse)[..., None]), 0.0)
            dv = dv + jnp.einsum(
                "bkgts,btkge->bske", p.astype(do.dtype), do_blk, preferred_element_type=jnp.float32
            )
            dp = jnp.einsum("btkge,bske->bkgts", do_blk, v_blk, preferred_element_type=jnp.float32)
            ds = p * (dp - t_sl(i)(delta)[..., None])
            if softcap is not None:
                ds = ds * (1.0 - th * th)
            ds = (ds * scale).astype(q.dtype)
            dq_blk = jnp.einsum("bkgts,bske->btkge", ds, k_blk, preferred_element_type=jnp.float32)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, q_sl(i)(dq) + dq_blk, i * bq, axis=1)
            dk = dk + jnp.einsum("bkgts,btkge->bske", ds, q_blk, preferred_element_type=jnp.float32)
            return dq, dk, dv

        zeros = jnp.zeros((b, bk, kh, e), jnp.float32)
        dq, dk, dv = jax.lax.fori_loop(first_q[j], nq, q_step, (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(nk))
    dk = jnp.transpose(dk, (1, 0, 2, 3, 4)).reshape(b, sp, kh, e)
    dv = jnp.transpose(dv, (1, 0, 2, 3, 4)).reshape(b, sp, kh, e)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# The window is a primal argument (an int32 array or None), not a static one, so that it may
# be traced: a model whose layers have different windows passes each layer's from the scan.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, mask, window, softcap, bq, bk):
    return _forward(q, k, v, mask, window, softcap, bq, bk)[0]


def _flash_fwd(q, k, v, mask, window, softcap, bq, bk):
    out, lse = _forward(q, k, v, mask, window, softcap, bq, bk)
    return out, (q, k, v, mask, window, out, lse)


def _flash_bwd(softcap, bq, bk, res, do):
    q, k, v, mask, window, out, lse = res
    dq, dk, dv = _backward(q, k, v, mask, window, softcap, bq, bk, out, lse, do)
    return dq, dk, dv, jax.tree.map(lambda _: None, mask), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
    block_q: int = 512,
    block_k: int = 512,
) -> jax.Array:
    """Memory-efficient (flash) grouped-query attention in pure JAX; equals
    :func:`naive_attention` up to float rounding, in O(T + S) memory (plus one
    ``block_q × block_k`` score block per head).

    Forward: for each query block, over key blocks j (causally skipped past the block's last
    query), m ← max(m, max_s S_j), l ← e^{m_old − m} l + Σ e^{S_j − m},
    o ← e^{m_old − m} o + e^{S_j − m} V_j; out = o / l, lse = m + log l (Rabe & Staats 2021,
    https://arxiv.org/abs/2112.05682; Dao et al. 2022, https://arxiv.org/abs/2205.14135).
    The backward (``jax.custom_vjp``) recomputes the block scores from the saved lse.
    Not forward-mode differentiable (``jax.jvp``), as any ``custom_vjp``.

    Args:
      q_btne, k_bske, v_bske, mask, window, softcap: as :func:`naive_attention`.
      block_q, block_k: block sizes (clipped to T and S; T and S are padded to whole blocks).
    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    _check(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    s, kh = k_bske.shape[1], k_bske.shape[2]
    bq, bk = min(int(block_q), t), min(int(block_k), s)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    q = _pad_to(q_btne.reshape(b, t, kh, h // kh, e), tp, 1)
    k, v = _pad_to(k_bske, sp, 1), _pad_to(v_bske, sp, 1)
    if sp != s and mask.k_valid is None:
        mask = dataclasses.replace(mask, k_valid=jnp.ones((b, s), bool))
    mask = _pad_mask(mask, tp, sp)
    window = None if window is None else jnp.asarray(window, jnp.int32)
    out = _flash(q, k, v, mask, window, None if softcap is None else float(softcap), bq, bk)
    return out[:, :t].reshape(b, t, h, e)


# ----- the accelerators' kernels and the choice between implementations ------------------------

_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_SPLASH_BLOCK = 128  # splash's default block sizes; T must be a whole number of blocks.


def select_attention_impl(
    backend: str,
    *,
    requested: AttentionImpl | str = AttentionImpl.AUTO,
    num_queries: int,
    num_keys: int,
    head_dim: int,
    dtype,
    self_attention: bool = True,
    causal: bool = True,
    key_mask: bool = False,
    segment_ids: bool = False,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
) -> AttentionImpl:
    """The implementation that runs for this backend and these static features.

    Rules (each fused kernel only where it computes exactly the mask asked for):

    - ``naive`` / ``blockwise`` requested: that one.
    - cuDNN flash attention (backend ``gpu`` / ``cuda``): causal self-attention with no key
      mask (its padding mask is right padding by lengths, ours is any [B, S] mask), no segment
      ids, no sliding window (cuDNN's is by index, ours by RoPE position), no soft cap,
      float16 / bfloat16, head_dim a multiple of 8 and ≤ 128.
    - splash attention (backend ``tpu``): causal self-attention (key mask and segment ids go in
      as splash segment ids), soft cap allowed, no sliding window, T a multiple of 128 and
      head_dim a multiple of 128.
    - ``cudnn`` / ``splash`` requested where they do not apply: ``blockwise``.
    - ``auto`` elsewhere: ``naive`` when T·S ≤ :data:`NAIVE_MAX_SCORES` (tiny shapes and the
      decode step, where it is faster), else ``blockwise``.

    Args:
      backend: ``jax.default_backend()`` ('cpu', 'gpu', 'cuda', 'rocm', 'tpu').
      requested: the config's :class:`~jaxrl_llm.models.AttentionImpl`.
      num_queries, num_keys, head_dim, dtype: T, S, E and the q/k/v dtype.
      self_attention: keys are the queries' own tokens with q_index = arange(T) (no cache).
      causal, key_mask, segment_ids, window, softcap: the features in use.
    Returns:
      the :class:`~jaxrl_llm.models.AttentionImpl` to run (never AUTO).
    """
    requested = AttentionImpl(requested)
    if requested in (AttentionImpl.NAIVE, AttentionImpl.BLOCKWISE):
        return requested
    fused_ok = self_attention and causal and window is None and num_queries == num_keys
    cudnn_ok = (
        backend in ("gpu", "cuda")
        and fused_ok
        and not key_mask
        and not segment_ids
        and softcap is None
        and jnp.dtype(dtype) in _CUDNN_DTYPES
        and head_dim % 8 == 0
        and head_dim <= 128
    )
    splash_ok = (
        backend == "tpu" and fused_ok and num_queries % _SPLASH_BLOCK == 0 and head_dim % 128 == 0
    )
    if requested == AttentionImpl.CUDNN:
        return AttentionImpl.CUDNN if cudnn_ok else AttentionImpl.BLOCKWISE
    if requested == AttentionImpl.SPLASH:
        return AttentionImpl.SPLASH if splash_ok else AttentionImpl.BLOCKWISE
    if cudnn_ok:
        return AttentionImpl.CUDNN
    if splash_ok:
        return AttentionImpl.SPLASH
    if num_queries * num_keys <= NAIVE_MAX_SCORES:
        return AttentionImpl.NAIVE
    return AttentionImpl.BLOCKWISE


def cudnn_attention(q_btne: jax.Array, k_bske: jax.Array, v_bske: jax.Array) -> jax.Array:
    """Causal grouped-query self-attention with cuDNN's fused flash kernel (GPU only).

    ``jax.nn.dot_product_attention(..., is_causal=True, implementation="cudnn")``; the mask
    features it lacks are checked by :func:`select_attention_impl`.

    Args:
      q_btne: ``[B, T, H, E]``; k_bske, v_bske: ``[B, T, K, E]``, float16 / bfloat16.
    Returns:
      ``[B, T, H, E]``.
    """
    return jax.nn.dot_product_attention(
        q_btne,
        k_bske,
        v_bske,
        is_causal=True,
        scale=1.0 / math.sqrt(q_btne.shape[-1]),
        implementation="cudnn",
    )


def splash_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    softcap: float | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Causal grouped-query self-attention with the Pallas TPU splash-attention kernel.

    The key-validity mask and segment ids become splash segment ids (a padded token gets its
    own segment, −2³¹), so real queries see exactly the keys :func:`naive_attention` lets them
    see; a padded query sees the earlier padded keys instead of only itself (its output is
    ignored either way). ``interpret=True`` runs the kernel in the Pallas interpreter (any
    backend; tests).

    Args:
      q_btne: ``[B, T, H, E]``; k_bske, v_bske: ``[B, T, K, E]``; T a multiple of 128.
      mask: a :func:`causal_self_mask` (no sliding window). softcap: Gemma 2 cap or None.
    Returns:
      ``[B, T, H, E]``.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, h, e = q_btne.shape
    seg = mask.q_segments
    if mask.k_valid is not None:
        base = jnp.zeros((b, t), jnp.int32) if seg is None else seg.astype(jnp.int32)
        seg = jnp.where(mask.k_valid, base, jnp.iinfo(jnp.int32).min)
    block = sa.BlockSizes.get_default()
    heads_mask = sa.MultiHeadMask([sa.CausalMask((t, t))] * h)
    kernel = sa.make_splash_mha(
        heads_mask,
        head_shards=1,
        q_seq_shards=1,
        block_sizes=block,
        attn_logits_soft_cap=softcap,
        interpret=interpret,
    )
    q = jnp.swapaxes(q_btne, 1, 2) * jnp.asarray(1.0 / math.sqrt(e), q_btne.dtype)
    k, v = jnp.swapaxes(k_bske, 1, 2), jnp.swapaxes(v_bske, 1, 2)
    if seg is None:
        out = jax.vmap(kernel)(q, k, v)
    else:
        out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(q=s, kv=s)))(
            q, k, v, seg
        )
    return jnp.swapaxes(out, 1, 2).astype(v_bske.dtype)


# ----- context parallelism (AttentionImpl.RING) ---------------------------------------------

#: The mesh axis a sequence is split over (context parallelism; ``jaxrl_llm.parallel``'s mesh
#: names its axes after it).
CONTEXT_AXIS = "context"


def _context_size() -> int:
    """Size of the ambient mesh's (``jax.set_mesh``) context axis; 1 when there is none or
    it is already manual (inside a ``shard_map`` over it)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or CONTEXT_AXIS not in mesh.axis_names or CONTEXT_AXIS in mesh.manual_axes:
        return 1
    return int(mesh.shape[CONTEXT_AXIS])


def _backend() -> str:
    backend = jax.default_backend()
    if backend == "gpu":
        version = getattr(jax.devices()[0].client, "platform_version", "").lower()
        return "rocm" if "rocm" in version else "cuda"
    return backend


def dot_product_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
    impl: AttentionImpl | str = AttentionImpl.AUTO,
    backend: str | None = None,
    block_size: int = 512,
) -> jax.Array:
    """Grouped-query attention through the implementation :func:`select_attention_impl` picks.

    Every implementation computes ``softmax(cap(q·kᵀ/√E) masked) · v`` for the keys the
    :class:`AttentionMask` allows to real queries; they differ in memory, speed and rounding.
    When cuDNN is chosen but cannot run (no cuDNN, or no kernel for the shape on this GPU),
    a RuntimeWarning says so and the blockwise path runs. Under a mesh (``jax.set_mesh``)
    with a ``context`` axis of size C > 1, AUTO and RING run self-attention whose T is a
    multiple of C as ring attention over that axis (:mod:`jaxrl_llm.models.ring_attention`);
    RING anywhere else is AUTO.

    Args:
      q_btne: ``[B, T, H, E]`` queries; k_bske, v_bske: ``[B, S, K, E]``; H a multiple of K.
      mask: :class:`AttentionMask`. window: sliding window (RoPE positions) or None.
      softcap: Gemma 2 logit soft cap or None. impl: the requested implementation.
      backend: override of ``jax.default_backend()`` (tests). block_size: blockwise blocks.
    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    b, t, h, e = q_btne.shape
    impl = AttentionImpl(impl)
    if impl in (AttentionImpl.AUTO, AttentionImpl.RING):
        c = _context_size()
        if c > 1 and mask.self_attention and t % c == 0:
            from jaxrl_llm.models.ring_attention import ring_attention  # it imports this module

            return ring_attention(q_btne, k_bske, v_bske, mask, window=window, softcap=softcap)
        impl = AttentionImpl.AUTO  # RING where it does not apply: what AUTO picks
    chosen = select_attention_impl(
        backend or _backend(),
        requested=impl,
        num_queries=t,
        num_keys=k_bske.shape[1],
        head_dim=e,
        dtype=q_btne.dtype,
        self_attention=mask.self_attention,
        causal=mask.q_index is not None,
        key_mask=mask.k_valid is not None,
        segment_ids=mask.q_segments is not None,
        window=window,
        softcap=softcap,
    )
    if chosen == AttentionImpl.CUDNN:
        try:
            return cudnn_attention(q_btne, k_bske, v_bske)
        except (NotImplementedError, RuntimeError) as e:
            # Raised while tracing: no cuDNN found, or this GPU / cuDNN version has no fused
            # kernel for the shape. The blockwise path computes the same attention.
            warnings.warn(
                f"cuDNN attention unavailable ({e}); using blockwise attention",
                RuntimeWarning,
                stacklevel=2,
            )
            chosen = AttentionImpl.BLOCKWISE
    if chosen == AttentionImpl.SPLASH:
        return splash_attention(q_btne, k_bske, v_bske, mask, softcap=softcap)
    if chosen == AttentionImpl.NAIVE:
        return naive_attention(q_btne, k_bske, v_bske, mask, window=window, softcap=softcap)
    return blockwise_attention(
        q_btne,
        k_bske,
        v_bske,
        mask,
        window=window,
        softcap=softcap,
        block_q=block_size,
        block_k=block_size,
    )

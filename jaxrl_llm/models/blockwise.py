"""Blockwise (flash) attention in pure JAX, O(T) memory: queries in blocks of ``block_q``, keys
in blocks of ``block_k``, a running maximum and sum per query row (Rabe & Staats 2021,
"Self-attention does not need O(n²) memory", https://arxiv.org/abs/2112.05682; Dao et al. 2022,
"FlashAttention", https://arxiv.org/abs/2205.14135), and a custom backward that recomputes each
block's scores from the saved log-sum-exp (FlashAttention-2, https://arxiv.org/abs/2307.08691
§3.1), so neither pass stores a ``T × S`` array. Key blocks after the last query of a block
(causal) are skipped in both passes. Each block's mask comes from the :class:`AttentionMask`
vectors (:mod:`.attention_mask`). :func:`flash_forward` / :func:`flash_backward` are also
the per-chunk steps of ring attention (:mod:`.ring_attention`).

Shapes: B batch, T queries, S keys, H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention_mask import (
    NEG_INF,
    AttentionMask,
    check_attention_args,
    mask_allows,
)


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
        q_blocks=pad(mask.q_blocks, tp, 1, -1),
        k_blocks=pad(mask.k_blocks, sp, 1, -1),
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
        return mask_allows(mask, q_index, k_index, q_sl(i), k_sl(j), window)

    return q_sl, k_sl, allowed


def _kv_blocks_for(mask: AttentionMask, nq, nk, bq, bk):
    """``[nq]`` number of key blocks each query block must visit (causal skipping; none with
    bidirectional blocks, whose keys may lie ahead)."""
    if mask.q_index is None or mask.q_blocks is not None:
        return jnp.full((nq,), nk, jnp.int32)
    last = jnp.max(mask.q_index.reshape(nq, bq), axis=1)
    return jnp.clip(last // bk + 1, 0, nk).astype(jnp.int32)


def _first_q_block_for(mask: AttentionMask, nq, nk, bq, bk):
    """``[nk]`` first query block that can see key block j (blocks before it are skipped)."""
    if mask.q_index is None or mask.q_blocks is not None:
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


def flash_forward(q, k, v, mask, window, softcap, bq, bk, sinks=None):
    """Padded inputs: q ``[B, Tp, K, G, E]``, k/v ``[B, Sp, K, E]``. Returns (out like q,
    lse ``[B, K, G, Tp]`` float32). ``sinks`` ``[K, G]`` float32 attention-sink logits (None:
    none) start each row's running maximum at its sink and its sum at 1, so the sink is one
    more term of the denominator (and of lse) with no value."""
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
            s = jnp.where(allowed(i, j)[:, None, None], s, NEG_INF)
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

        if sinks is None:
            m0 = jnp.full((b, kh, g, bq), NEG_INF, jnp.float32)
            l0 = jnp.zeros((b, kh, g, bq), jnp.float32)
        else:
            m0 = jnp.broadcast_to(sinks[None, :, :, None], (b, kh, g, bq))
            l0 = jnp.ones((b, kh, g, bq), jnp.float32)
        init = (jnp.zeros((b, kh, g, bq, e), jnp.float32), m0, l0)
        o, m, l = jax.lax.fori_loop(0, n_kv[i], kv_step, init)
        l_safe = jnp.where(l > 0, l, 1.0)
        return o / l_safe[..., None], m + jnp.log(l_safe)

    o, lse = jax.lax.map(q_block, jnp.arange(nq))  # [nq, B, K, G, bq, ·]
    out = jnp.transpose(o, (1, 0, 4, 2, 3, 5)).reshape(b, tp, kh, g, e).astype(v.dtype)
    lse = jnp.transpose(lse, (1, 2, 3, 0, 4)).reshape(b, kh, g, tp)
    return out, lse


def flash_backward(q, k, v, mask, window, softcap, bq, bk, out, lse, do):
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


def sink_gradient(sinks, out, lse, do):
    """The gradient of the attention-sink logits ``[K, G]``: the sink's probability
    ``e^{sink − lse}`` times ``−rowsum(dO ∘ O)``, summed over rows and queries (the sink takes
    probability from every key and gives no value)."""
    delta = jnp.einsum("btkge,btkge->bkgt", do.astype(jnp.float32), out.astype(jnp.float32))
    p_sink = jnp.exp(sinks[None, :, :, None] - lse)
    return -jnp.sum(p_sink * delta, axis=(0, 3))


# The window is a primal argument (an int32 array or None), not a static one, so that it may
# be traced: a model whose layers have different windows passes each layer's from the scan.
# So are the sinks (None, or [K, G] float32 with a gradient).
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, mask, window, softcap, bq, bk, sinks):
    return flash_forward(q, k, v, mask, window, softcap, bq, bk, sinks)[0]


def _flash_fwd(q, k, v, mask, window, softcap, bq, bk, sinks):
    out, lse = flash_forward(q, k, v, mask, window, softcap, bq, bk, sinks)
    return out, (q, k, v, mask, window, out, lse, sinks)


def _flash_bwd(softcap, bq, bk, res, do):
    q, k, v, mask, window, out, lse, sinks = res
    dq, dk, dv = flash_backward(q, k, v, mask, window, softcap, bq, bk, out, lse, do)
    dsinks = None if sinks is None else sink_gradient(sinks, out, lse, do)
    return dq, dk, dv, jax.tree.map(lambda _: None, mask), None, dsinks


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
    sinks: jax.Array | None = None,
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
      q_btne, k_bske, v_bske, mask, window, softcap, sinks: as :func:`naive_attention`.
      block_q, block_k: block sizes (clipped to T and S; T and S are padded to whole blocks).

    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    check_attention_args(q_btne, k_bske, v_bske, mask, window)
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
    if sinks is not None:
        sinks = sinks.astype(jnp.float32).reshape(kh, h // kh)
    cap = None if softcap is None else float(softcap)
    out = _flash(q, k, v, mask, window, cap, bq, bk, sinks)
    return out[:, :t].reshape(b, t, h, e)


# ----- the accelerators' kernels and the choice between implementations ------------------------

"""The attention mask as per-row vectors (:class:`AttentionMask`) and the helpers every
attention implementation shares: which keys a query may see (:func:`mask_allows`, computed per
block, never a ``[B, T, S]`` array), the argument checks and Gemma 2's score soft cap.

Query t of row b may attend to key s when

    (s ≤ q_index[t]  or no causal index  or q_blk[b, t] = k_blk[b, s] ≥ 0)  ∧ k_valid[b, s]
        ∧ q_seg[b, t] = k_seg[b, s]  ∧ q_pos[b, t] − k_pos[b, s] < window,

or when s = q_index[t] (a query always sees its own slot, so no row is empty and padded queries
stay finite; their output is ignored). Scores are ``q·k / √E``, soft-capped as in Gemma 2
(``cap · tanh(s / cap)``, https://arxiv.org/abs/2408.00118) when ``softcap`` is set.

Shapes: B batch, T queries, S keys, H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp

NEG_INF = -1e30  # large finite negative: masked scores stay finite (no inf − inf = NaN).


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "q_index",
        "k_valid",
        "q_positions",
        "k_positions",
        "q_segments",
        "k_segments",
        "q_blocks",
        "k_blocks",
    ],
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
      q_blocks, k_blocks: ``[B, T]``, ``[B, S]`` int bidirectional block ids: a query of
        block ``n ≥ 0`` also sees every key of block ``n``, later ones too (Gemma 3's image
        tokens); −1 = no block; None = none anywhere.
      self_attention: static; True when the keys are the queries' own tokens and
        ``q_index == arange(T)`` (:func:`causal_self_mask`), the case the fused kernels take.
    """

    q_index: jax.Array | None = None
    k_valid: jax.Array | None = None
    q_positions: jax.Array | None = None
    k_positions: jax.Array | None = None
    q_segments: jax.Array | None = None
    k_segments: jax.Array | None = None
    q_blocks: jax.Array | None = None
    k_blocks: jax.Array | None = None
    self_attention: bool = False


def causal_self_mask(
    attention_mask: jax.Array | None,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    *,
    num_tokens: int | None = None,
    blocks: jax.Array | None = None,
) -> AttentionMask:
    """The :class:`AttentionMask` of causal self-attention over ``[B, T]`` tokens.

    Args:
      attention_mask: ``[B, T]`` 1 for real tokens (None = all real).
      positions: ``[B, T]`` RoPE positions (needed only with a sliding window).
      segment_ids: ``[B, T]`` packing segment ids or None.
      num_tokens: T, needed only when all three are None.
      blocks: ``[B, T]`` bidirectional block ids (:class:`AttentionMask`'s ``q_blocks``) or
        None; with them the mask is no plain causal self-attention (no fused kernel takes it).
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
        q_blocks=blocks,
        k_blocks=blocks,
        self_attention=blocks is None,
    )


def mask_allows(mask: AttentionMask, q_index, k_index, q_sl, k_sl, window):
    """Bool, broadcastable to ``[B, t, s]``, for the queries ``q_index`` (None: not causal) and
    keys ``k_index`` of one block; ``q_sl`` / ``k_sl`` take the block's part of a ``[B, ·]``
    vector."""
    ok = jnp.ones((1, 1, k_index.shape[0]), bool)
    if q_index is not None:
        ok = (k_index[None, :] <= q_index[:, None])[None]
    if mask.q_blocks is not None:
        qb, kb = q_sl(mask.q_blocks)[:, :, None], k_sl(mask.k_blocks)[:, None, :]
        ok = ok | ((qb == kb) & (qb >= 0))
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


def check_attention_args(q, k, v, mask: AttentionMask, window):
    """Trace-time checks of an attention call: ranks and shapes of ``q [B, T, H, E]``,
    ``k`` / ``v [B, S, K, E]`` (H a multiple of K) and of ``mask``'s vectors; a window needs
    positions.

    Raises:
      ValueError: a mismatch, named.
    """
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
    if (mask.q_blocks is None) != (mask.k_blocks is None):
        raise ValueError("q_blocks and k_blocks must be given together")
    if mask.q_blocks is not None:
        chex.assert_shape([mask.q_blocks], (b, t))
        chex.assert_shape([mask.k_blocks], (b, s))
    if window is not None:
        if mask.q_positions is None or mask.k_positions is None:
            raise ValueError("a sliding window needs q_positions and k_positions")
        chex.assert_shape(mask.q_positions, (b, t))
        chex.assert_shape(mask.k_positions, (b, s))


def cap_scores(s, softcap):
    """Attention scores soft-capped: ``softcap · tanh(s / softcap)`` (Gemma 2); ``s`` when None."""
    return s if softcap is None else softcap * jnp.tanh(s / softcap)

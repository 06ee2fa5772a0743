"""Context parallelism: attention over a sequence whose tokens are split over a mesh axis.

With a mesh axis ``context`` of size C, every row's T tokens are split into C contiguous
blocks of T/C, block i on the i-th device of the axis (the ``length`` sharding rule,
:func:`jaxrl_llm.parallel.token_sharding`). Everything in a decoder layer but attention is
per token, so it runs on the local block as it is; attention needs every key of the row.

Ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", https://arxiv.org/abs/2310.01889) computes it in C steps: each device
keeps its query block and passes its key/value block (with the keys' mask pieces: validity,
RoPE positions, segment ids) to the next device with ``jax.lax.ppermute``; at step s device i
holds the keys of block (i − s) mod C and merges their scores into a running maximum m, sum l
and output o per query, the online softmax of blockwise attention (Rabe & Staats 2021,
https://arxiv.org/abs/2112.05682; Milakov & Gimelshein 2018,
https://arxiv.org/abs/1805.02867):

    m' = max(m, max_s S),  l' = e^{m−m'} l + Σ_s e^{S−m'},  o' = e^{m−m'} o + Σ_s e^{S−m'} V,

and out = o / l after the last step. Causality is by global token index (query block i sees
key block j ≤ i; block j > i is skipped with ``lax.cond``); the keys' validity, segment ids
and sliding window travel with the block, so the mask is exactly
:func:`jaxrl_llm.models.naive_attention`'s. Grouped-query attention passes the K key/value
heads round the ring, never H repeated ones. The transfer of the next block is issued in the
same step as the current block's compute, so XLA may overlap the two.

Ring versus all-gather of K/V (decision: ring). Per device and layer, with B rows, K key/value
heads, head dim E, one K/V block is ``2·B·(T/C)·K·E`` values:

- all-gather: one collective moving (C − 1) blocks, then one local attention over T keys;
  the gathered K/V, ``2·B·T·K·E``, is resident during attention, growing with T.
- ring: C − 1 neighbour transfers of one block each (the same (C − 1) blocks in total, but
  point-to-point between neighbours, overlappable with compute); two blocks resident at a
  time (the held one and the arriving one), O(T/C).

The forward's scores are one ``(T/C) × (T/C)`` block per head at a time.

Backward: no custom VJP. JAX differentiates through the ring (``ppermute`` transposes to the
reverse permutation; ``shard_map`` and ``lax.scan`` are differentiable); each step's merge is
under ``jax.checkpoint``, so its scores are recomputed in the backward, not stored. What
autodiff keeps is each step's carry and held K/V block, ``C·(T/C) = T`` keys' worth per
device, the all-gather's memory in the backward. A custom VJP that passes dK/dV round the
ring as the Ring Attention paper does would bring the backward to O(T/C) too; not done here.

Load balance: with contiguous blocks and a causal mask, device i has i + 1 unmasked blocks,
so the last device does C times the first's work (striped / zig-zag layouts, Brandon et al.
2023, https://arxiv.org/abs/2311.09431, even this out; not done here).

Shapes: B batch, T tokens (global), H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import attention as attn_lib
from jaxrl_llm.models.attention import AttentionMask

__all__ = ["CONTEXT_AXIS", "ring_attention"]

#: The mesh axis whose devices each hold a block of every row's tokens (:data:`MESH_AXES`).
CONTEXT_AXIS = "context"


def ring_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    axis_name: str = CONTEXT_AXIS,
) -> jax.Array:
    """Self-attention over a sequence split on the mesh axis ``axis_name`` (ring attention).

    Equals :func:`jaxrl_llm.models.naive_attention` up to float rounding: ``softmax(cap(q·kᵀ/√E)
    masked) · v`` with the :class:`~jaxrl_llm.models.attention.AttentionMask` rules (causal
    by global index, key validity, segment ids, sliding window by RoPE position, a query
    always sees itself). Liu et al. 2023, https://arxiv.org/abs/2310.01889; the module
    docstring gives the recurrence, the memory and communication costs and the backward.

    Only ``axis_name`` is manual inside (``shard_map(axis_names={axis_name})``); the other mesh
    axes (rows over data / fsdp, heads over tensor) stay with XLA's partitioner. Inputs that
    are not split over ``axis_name`` are resharded to it on entry.

    Args:
      q_btne: ``[B, T, H, E]`` queries (RoPE applied), T global and divisible by the axis size.
      k_bske, v_bske: ``[B, T, K, E]`` keys / values of the same tokens; H a multiple of K.
      mask: a self-attention mask (``mask.self_attention``, :func:`causal_self_mask`, or one
        with q_index None for bidirectional attention).
      window: sliding window in positions (int or traced int32 scalar) or None.
      softcap: Gemma 2 attention-logit soft cap or None.
      mesh: the mesh; default the ambient one (``jax.set_mesh``).
      axis_name: the mesh axis the tokens are split over.
    Returns:
      ``[B, T, H, E]`` in v's dtype, split over ``axis_name`` along T.
    Raises:
      ValueError: not self-attention, no such axis, or T not divisible by its size.
    """
    attn_lib._check(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    if not mask.self_attention or k_bske.shape[1] != t:
        raise ValueError("ring attention needs self-attention (keys are the queries' tokens)")
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh.empty or axis_name not in mesh.axis_names:
        raise ValueError(f"ring attention needs a mesh with a {axis_name!r} axis (jax.set_mesh)")
    c = int(mesh.shape[axis_name])
    if t % c:
        raise ValueError(f"{t} tokens do not split over {axis_name}={c} devices")

    tok = P(None, axis_name)
    # q_index [T] and the [B, T] mask pieces are split along their token dimension too.
    mask_spec = jax.tree.map(lambda x: P(axis_name) if x.ndim == 1 else tok, mask)
    window = None if window is None else jnp.asarray(window, jnp.int32)
    local = functools.partial(
        _ring_local,
        softcap=None if softcap is None else float(softcap),
        axis_name=axis_name,
        size=c,
    )
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(tok, tok, tok, mask_spec, None if window is None else P()),
        out_specs=tok,
        axis_names={axis_name},
    )
    return sharded(q_btne, k_bske, v_bske, mask, window)


def _ring_local(q, k, v, mask: AttentionMask, window, *, softcap, axis_name, size):
    """One device's part: its query block ``[B, Tc, H, E]`` against every key block."""
    b, tc, h, e = q.shape
    kh = k.shape[2]
    q5 = q.reshape(b, tc, kh, h // kh, e)
    scale = 1.0 / math.sqrt(e)
    me = jax.lax.axis_index(axis_name)
    causal = mask.q_index is not None

    @jax.checkpoint
    def merge(acc, held, src):
        """Fold the scores of the key block from device ``src`` into (o, m, l)."""
        o, m, l = acc
        k_blk, v_blk, k_valid, k_pos, k_seg = held
        s = jnp.einsum("btkge,bske->bkgts", q5, k_blk, preferred_element_type=jnp.float32)
        s = attn_lib._cap(s * scale, softcap)
        held_mask = AttentionMask(
            q_index=mask.q_index,
            k_valid=k_valid,
            q_positions=mask.q_positions,
            k_positions=k_pos,
            q_segments=mask.q_segments,
            k_segments=k_seg,
        )
        k_index = src * tc + jnp.arange(tc, dtype=jnp.int32)  # global key slots
        ident = lambda x: x  # noqa: E731  (the pieces are already this block's)
        ok = attn_lib._allowed(held_mask, mask.q_index, k_index, ident, ident, window)
        s = jnp.where(ok[:, None, None], s, attn_lib._NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        alpha = jnp.exp(m - m_new)
        pv = jnp.einsum(
            "bkgts,bske->bkgte", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32
        )
        return alpha[..., None] * o + pv, m_new, alpha * l + jnp.sum(p, axis=-1)

    def visit(acc, held, src):
        if not causal:
            return merge(acc, held, src)
        # Key blocks after this device's queries are entirely masked (causal): skip them.
        return jax.lax.cond(src <= me, merge, lambda a, *_: a, acc, held, src)

    g = h // kh
    acc = (
        jnp.zeros((b, kh, g, tc, e), jnp.float32),
        jnp.full((b, kh, g, tc), attn_lib._NEG_INF, jnp.float32),
        jnp.zeros((b, kh, g, tc), jnp.float32),
    )
    # The accumulator differs per device from the first merge on; say so from the start.
    acc = jax.tree.map(lambda x: jax.lax.pcast(x, (axis_name,), to="varying"), acc)
    held = (k, v, mask.k_valid, mask.k_positions, mask.k_segments)
    # Step 0 is this device's own (diagonal) block, where every query sees at least itself,
    # so the running maximum is finite from the first step on.
    perm = [(i, (i + 1) % size) for i in range(size)]

    def step(carry, s):
        acc, held = carry
        arriving = jax.lax.ppermute(held, axis_name, perm)  # overlaps with this step's merge
        return (visit(acc, held, (me - s) % size), arriving), None

    (acc, held), _ = jax.lax.scan(step, (acc, held), jnp.arange(size - 1))
    o, _, l = visit(acc, held, (me - (size - 1)) % size)
    l_safe = jnp.where(l > 0, l, 1.0)
    out = o / l_safe[..., None]  # [B, K, G, Tc, E]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, tc, h, e).astype(v.dtype)

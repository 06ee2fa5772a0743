"""Context parallelism: attention over a sequence whose tokens are split over a mesh axis.

With a mesh axis ``context`` of size C, every row's T tokens are split into C contiguous
blocks of T/C, block i on the i-th device of the axis (the ``length`` sharding rule,
:func:`jaxrl_llm.parallel.token_sharding`). Everything in a decoder layer but attention is
per token, so it runs on the local block as it is; attention needs every key of the row.

Ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", https://arxiv.org/abs/2310.01889) computes it in C steps: each device
keeps its query block and passes its key/value block (with the keys' mask pieces: validity,
RoPE positions, segment ids) to the next device with ``jax.lax.ppermute``; at step s device i
holds the keys of block (i − s) mod C, runs blockwise attention of its queries over them
(:func:`jaxrl_llm.models.blockwise_attention`'s loops: the online softmax of Rabe & Staats
2021, https://arxiv.org/abs/2112.05682, giving a partial output o_j and log-sum-exp lse_j) and
merges it into the running (o, lse):

    lse' = log(e^{lse} + e^{lse_j}),  o' = e^{lse − lse'} o + e^{lse_j − lse'} o_j.

Causality is by global token index (query block i sees key block j ≤ i; block j > i is
skipped with ``lax.cond``); the keys' validity, segment ids and sliding window travel with
the block, so the mask is exactly :func:`jaxrl_llm.models.naive_attention`'s (a query that
sees no key at all, possible only without causality, gets a finite output that may differ;
such outputs are ignored). Grouped-query attention passes the K key/value heads round the
ring, never H repeated ones. The next block's transfer is issued in the same step as the
current block's attention, so XLA may overlap the two.

Backward: a custom VJP, the ring run again. Each step computes blockwise attention's backward
(FlashAttention-2, from the saved final out and lse) for the held block: dQ accumulates on the
device, dK and dV travel round the ring with their K/V block, and one last transfer takes them
home. Only q, k, v, out and lse of the local block are saved: O(T/C) per device, no score
array. (Letting JAX differentiate through the ring instead would keep every step's held block
and partial output, O(T) per device, plus each step's scores unless rematerialised.)
Measured (compiled temp memory per device of grad(sum out²), float32, B=1, H=4, K=2, E=32,
C=4, CPU): T = 4k / 8k / 16k: 24 / 27 / 33 MiB, against 89 / 338 MiB at 4k / 8k for
autodiff through a ring whose steps build (and rematerialise) their (T/C)² scores. In
bfloat16 each step's partial output and gradients are rounded to bfloat16 (blockwise
attention's output dtype) before the float32 merge.

Ring versus all-gather of K/V (decision: ring). Per device and layer, with B rows, K key/value
heads, head dim E, one K/V block is ``2·B·(T/C)·K·E`` values:

- all-gather: one collective moving (C − 1) blocks, then one local attention over T keys;
  the gathered K/V, ``2·B·T·K·E``, is resident during attention, growing with T.
- ring: C − 1 neighbour transfers of one block each (the same (C − 1) blocks in total, but
  point-to-point between neighbours, overlappable with compute); two blocks resident at a
  time (the held one and the arriving one), O(T/C). The backward moves K/V and dK/dV: C
  transfers of ``4·B·(T/C)·K·E`` values (C − 1 with K/V), where an all-gather's backward is
  a reduce-scatter of dK/dV.

Load balance: with contiguous blocks and a causal mask, device i has i + 1 unmasked blocks,
so the last device does C times the first's work (striped / zig-zag layouts, Brandon et al.
2023, https://arxiv.org/abs/2311.09431, even this out; not done here).

Shapes: B batch, T tokens (global), H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models.attention_mask import NEG_INF, AttentionMask, check_attention_args
from jaxrl_llm.models.blockwise import flash_backward, flash_forward

__all__ = ["CONTEXT_AXIS", "ring_attention"]

#: The mesh axis whose devices each hold a block of every row's tokens (one of
#: ``jaxrl_llm.parallel.MESH_AXES``; defined here because models/ imports nothing below it).
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
    block_size: int = 512,
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
      block_size: query / key block of the blockwise attention on each held block (the
        largest divisor of T/C up to it).

    Returns:
      ``[B, T, H, E]`` in v's dtype, split over ``axis_name`` along T.

    Raises:
      ValueError: not self-attention, no such axis, or T not divisible by its size.
    """
    check_attention_args(q_btne, k_bske, v_bske, mask, window)
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
        block_size=int(block_size),
    )
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(tok, tok, tok, mask_spec, None if window is None else P()),
        out_specs=tok,
        axis_names={axis_name},
        # the blockwise loops start from device-invariant zeros that the ring makes
        # per-device; the specs above say how everything is split
        check_vma=False,
    )
    return sharded(q_btne, k_bske, v_bske, mask, window)


def _ring_local(q, k, v, mask: AttentionMask, window, *, softcap, axis_name, size, block_size):
    """One device's part: its query block ``[B, Tc, H, E]`` against every key block, with
    the ring backward as its VJP."""
    tc = q.shape[1]
    block = max(d for d in range(1, min(block_size, tc) + 1) if tc % d == 0)
    static = (softcap, axis_name, size, block)
    ring = jax.custom_vjp(functools.partial(_ring_fwd, *static, save=False))
    ring.defvjp(
        functools.partial(_ring_fwd, *static, save=True),
        functools.partial(_ring_bwd, *static),
    )
    return ring(q, k, v, mask, window)


def _ring_perm(size):
    return [(i, (i + 1) % size) for i in range(size)]


def _held_mask(mask: AttentionMask, held, src, tc) -> AttentionMask:
    """The mask of the local queries against the key block of device ``src``, in that block's
    local key slots: causality by global index is ``k ≤ q_index − src·Tc``."""
    _, _, k_valid, k_pos, k_seg = held
    return AttentionMask(
        q_index=None if mask.q_index is None else mask.q_index - src * tc,
        k_valid=k_valid,
        q_positions=mask.q_positions,
        k_positions=k_pos,
        q_segments=mask.q_segments,
        k_segments=k_seg,
    )


def _visit(fn, carry, held, src, me, causal):
    """``fn(carry, held, src)``, skipped (carry unchanged) when causality masks the whole
    block: keys of a later device than this one's queries."""
    if not causal:
        return fn(carry, held, src)
    return jax.lax.cond(src <= me, fn, lambda c, *_: c, carry, held, src)


def _ring_fwd(softcap, axis_name, size, block, q, k, v, mask, window, *, save):
    b, tc, h, e = q.shape
    kh = k.shape[2]
    q5 = q.reshape(b, tc, kh, h // kh, e)
    me = jax.lax.axis_index(axis_name)
    causal = mask.q_index is not None

    def merge(acc, held, src):
        """Blockwise attention over the held block (out_j, lse_j), merged by log-sum-exp."""
        o, lse = acc
        o_j, lse_j = flash_forward(
            q5, held[0], held[1], _held_mask(mask, held, src, tc), window, softcap, block, block
        )
        lse_new = jnp.logaddexp(lse, lse_j)
        w_old = jnp.transpose(jnp.exp(lse - lse_new), (0, 3, 1, 2))[..., None]
        w_new = jnp.transpose(jnp.exp(lse_j - lse_new), (0, 3, 1, 2))[..., None]
        return w_old * o + w_new * o_j.astype(jnp.float32), lse_new

    acc = (
        jnp.zeros(q5.shape, jnp.float32),
        jnp.full((b, kh, h // kh, tc), NEG_INF, jnp.float32),
    )
    held = (k, v, mask.k_valid, mask.k_positions, mask.k_segments)

    # Step 0 is this device's own (diagonal) block. The next block's transfer is issued in
    # the same step as this block's attention, so the two may overlap.
    def step(carry, s):
        acc, held = carry
        arriving = jax.lax.ppermute(held, axis_name, _ring_perm(size))
        return (_visit(merge, acc, held, (me - s) % size, me, causal), arriving), None

    (acc, held), _ = jax.lax.scan(step, (acc, held), jnp.arange(size - 1))
    o, lse = _visit(merge, acc, held, (me - (size - 1)) % size, me, causal)
    out = o.reshape(b, tc, h, e).astype(v.dtype)
    if not save:
        return out
    return out, (q, k, v, mask, window, out, lse)


def _ring_bwd(softcap, axis_name, size, block, res, do):
    """Per held block, blockwise attention's backward (FlashAttention-2, Dao 2023,
    https://arxiv.org/abs/2307.08691: P = exp(S − lse), dV = Pᵀ dO, dS = P ∘ (dO Vᵀ −
    rowsum(dO ∘ O)), dQ = dS K / √E, dK = dSᵀ Q / √E) with the final out and lse; the key
    block and its dK, dV accumulators pass round the ring (Liu et al. 2023 §3), and a last
    transfer takes each block's dK, dV home."""
    q, k, v, mask, window, out, lse = res
    b, tc, h, e = q.shape
    kh = k.shape[2]
    shape5 = (b, tc, kh, h // kh, e)
    q5, out5, do5 = q.reshape(shape5), out.reshape(shape5), do.reshape(shape5)
    me = jax.lax.axis_index(axis_name)
    causal = mask.q_index is not None

    def accumulate(carry, held, src):
        dq, (dk, dv) = carry
        dq_j, dk_j, dv_j = flash_backward(
            q5,
            held[0],
            held[1],
            _held_mask(mask, held, src, tc),
            window,
            softcap,
            block,
            block,
            out5,
            lse,
            do5,
        )
        return dq + dq_j.astype(jnp.float32), (dk + dk_j.astype(jnp.float32), dv + dv_j)

    held = (k, v, mask.k_valid, mask.k_positions, mask.k_segments)
    zeros = jnp.zeros(k.shape, jnp.float32)
    carry = (jnp.zeros(shape5, jnp.float32), (zeros, zeros))
    perm = _ring_perm(size)

    def step(state, s):
        dq, dkv, held = state
        dq, dkv = _visit(accumulate, (dq, dkv), held, (me - s) % size, me, causal)
        dkv, held = jax.lax.ppermute((dkv, held), axis_name, perm)
        return (dq, dkv, held), None

    (dq, dkv, held), _ = jax.lax.scan(step, (*carry, held), jnp.arange(size - 1))
    dq, dkv = _visit(accumulate, (dq, dkv), held, (me - (size - 1)) % size, me, causal)
    dk, dv = jax.lax.ppermute(dkv, axis_name, perm)  # block (me + 1)'s dK, dV go home
    return (
        dq.reshape(q.shape).astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        jax.tree.map(lambda _: None, mask),
        None,
    )

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

The mask (:class:`AttentionMask`, per-row vectors, never a ``[B, T, S]`` array in the
blockwise path) and the rule of which keys a query sees are :mod:`.attention_mask`'s; the
blockwise implementation is :mod:`.blockwise`; ring attention over a mesh's ``context`` axis is
:mod:`.ring_attention`. This module holds the naive and one-query paths, the fused kernels,
the selection among them and :func:`dot_product_attention`, the one entry point.

Attention sinks (gpt-oss; Xiao et al. 2023, https://arxiv.org/abs/2309.17453): with ``sinks``
``[H]`` each query head's softmax has one more logit, its sink, in the denominator and no value
behind it, ``p_j = e^{s_j} / (Σ_i e^{s_i} + e^{sink_h})``. Every implementation but the fused
kernels and ring attention takes them; :func:`select_attention_impl` picks another where sinks
are in use.

Shapes: B batch, T queries, S keys, H = K·G query heads, K key/value heads, E head dim.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention_mask import (
    NEG_INF,
    AttentionMask,
    cap_scores,
    causal_self_mask,
    check_attention_args,
    mask_allows,
)
from jaxrl_llm.models.blockwise import blockwise_attention
from jaxrl_llm.models.config import AttentionImpl
from jaxrl_llm.models.ring_attention import CONTEXT_AXIS, ring_attention

__all__ = [
    "NAIVE_MAX_SCORES",
    "AttentionMask",
    "blockwise_attention",
    "causal_self_mask",
    "cudnn_attention",
    "dot_product_attention",
    "naive_attention",
    "one_query_attention",
    "select_attention_impl",
    "softmax_with_sinks",
    "splash_attention",
]

# Up to this many score entries per (row, head), T·S, :attr:`AttentionImpl.AUTO` runs the naive
# path. Measured (tools/bench/results/attention.md: SmolLM2-135M heads, float32, causal,
# forward + backward, 2-core CPU shared with other jobs): equal times up to T = S = 512 (there
# the blockwise path is a single 512 × 512 block, the same arithmetic), blockwise 0.39× the
# naive time at 1,024 and 0.28× at 2,048. Keeping the naive path below keeps the decode step
# (T = 1) exactly as before.
NAIVE_MAX_SCORES = 512 * 512
# Query and key block length of the blockwise path (``attention(block_size=...)``'s default).
BLOCKWISE_BLOCK = 512


def softmax_with_sinks(scores: jax.Array, sinks: jax.Array | None, axis: int) -> jax.Array:
    """``softmax(scores)`` over ``axis``, or with ``sinks`` (broadcast against ``scores`` with
    size 1 on ``axis``) each sink's logit added to its denominator: ``e^{s_j} / (Σ_i e^{s_i} +
    e^{sink})``, in float32 (attention sinks; module docstring)."""
    if sinks is None:
        return jax.nn.softmax(scores, axis=axis)
    sinks = sinks.astype(jnp.float32)
    m = jnp.maximum(jnp.max(scores, axis=axis, keepdims=True), sinks)
    e = jnp.exp(scores - m)
    return e / (jnp.sum(e, axis=axis, keepdims=True) + jnp.exp(sinks - m))


def naive_attention(
    q_btne: jax.Array,
    k_bske: jax.Array,
    v_bske: jax.Array,
    mask: AttentionMask,
    *,
    window: int | jax.Array | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention that materialises the scores ``[B, K, G, T, S]``.

    ``softmax(cap(q·kᵀ/√E) masked) · v`` with H = K·G query heads laid out ``[B, T, K·G, E]``
    (query head h uses key/value head h // G); K/V are never repeated.

    Args:
      q_btne: ``[B, T, H, E]`` queries (RoPE applied). k_bske, v_bske: ``[B, S, K, E]``.
      mask: :class:`AttentionMask`. window: sliding window in positions (an int, or a traced
        int32 scalar when layers differ) or None.
      softcap: Gemma 2 logit soft cap or None. sinks: ``[H]`` attention-sink logits or None.

    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    check_attention_args(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    s, kh = k_bske.shape[1], k_bske.shape[2]
    q = q_btne.reshape(b, t, kh, h // kh, e)
    scores = jnp.einsum(
        "btkge,bske->bkgts", q, k_bske, preferred_element_type=jnp.float32
    ) / math.sqrt(e)
    scores = cap_scores(scores, softcap)
    allowed = mask_allows(
        mask, mask.q_index, jnp.arange(s, dtype=jnp.int32), lambda x: x, lambda x: x, window
    )
    scores = jnp.where(allowed[:, None, None, :, :], scores, NEG_INF)
    sink = None if sinks is None else sinks.reshape(1, kh, h // kh, 1, 1)
    probs = softmax_with_sinks(scores, sink, -1).astype(v_bske.dtype)
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
    sinks: jax.Array | None = None,
) -> jax.Array:
    """:func:`naive_attention` for T = 1 (a decode step): the same scores, softmax and
    weighted sum, written as products summed over E and over S instead of two batched dots.

    Each of the B·K dots would be a [G, E] × [E, S] product far too small for a GEMM kernel;
    as products and sums XLA fuses them into passes over the keys and values. Used by the
    paged engine's decode step, whose keys/values are gathered from pages into their own
    buffer (SmolLM2, 32 rows × 192 slots, CPU: its paged trunk 125 → 110 ms per step). Not
    used on the dense cache: there XLA fuses the read of the cache just updated in place into
    these sums and the static engine's step ran 7× slower. ``sinks`` ``[H]``: attention-sink
    logits or None, as in :func:`naive_attention`."""
    check_attention_args(q_btne, k_bske, v_bske, mask, window)
    b, t, h, e = q_btne.shape
    if t != 1:
        raise ValueError(f"one_query_attention takes one query per row, got T = {t}")
    s, kh = k_bske.shape[1], k_bske.shape[2]
    f32 = jnp.float32
    q = q_btne.reshape(b, 1, kh, h // kh, e).astype(f32)
    scores = jnp.sum(q * k_bske[:, :, :, None, :].astype(f32), axis=-1) / math.sqrt(e)
    scores = cap_scores(scores, softcap)  # [B, S, K, G]
    allowed = mask_allows(
        mask, mask.q_index, jnp.arange(s, dtype=jnp.int32), lambda x: x, lambda x: x, window
    )  # [B, 1, S]
    scores = jnp.where(allowed[:, 0, :, None, None], scores, NEG_INF)
    sink = None if sinks is None else sinks.reshape(1, 1, kh, h // kh)
    probs = softmax_with_sinks(scores, sink, 1).astype(v_bske.dtype).astype(f32)
    out = jnp.sum(probs[..., None] * v_bske[:, :, :, None, :].astype(f32), axis=1)
    return out.astype(v_bske.dtype).reshape(b, 1, h, e)


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
    sinks: bool = False,
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
    - neither fused kernel with attention sinks (``sinks``).
    - ``cudnn`` / ``splash`` requested where they do not apply: ``blockwise``.
    - ``auto`` elsewhere: ``naive`` when T·S ≤ :data:`NAIVE_MAX_SCORES` (tiny shapes and the
      decode step, where it is faster), else ``blockwise``.

    Args:
      backend: ``jax.default_backend()`` ('cpu', 'gpu', 'cuda', 'rocm', 'tpu').
      requested: the config's :class:`~jaxrl_llm.models.AttentionImpl`.
      num_queries, num_keys, head_dim, dtype: T, S, E and the q/k/v dtype.
      self_attention: keys are the queries' own tokens with q_index = arange(T) (no cache).
      causal, key_mask, segment_ids, window, softcap, sinks: the features in use.

    Returns:
      the :class:`~jaxrl_llm.models.AttentionImpl` to run (never AUTO).
    """
    requested = AttentionImpl(requested)
    if requested in (AttentionImpl.NAIVE, AttentionImpl.BLOCKWISE):
        return requested
    fused_ok = (
        self_attention and causal and window is None and not sinks and num_queries == num_keys
    )
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
    block_size: int = BLOCKWISE_BLOCK,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention through the implementation :func:`select_attention_impl` picks.

    Every implementation computes ``softmax(cap(q·kᵀ/√E) masked) · v`` for the keys the
    :class:`AttentionMask` allows to real queries; they differ in memory, speed and rounding.
    When cuDNN is chosen but cannot run (no cuDNN, or no kernel for the shape on this GPU),
    a RuntimeWarning says so and the blockwise path runs. Under a mesh (``jax.set_mesh``)
    with a ``context`` axis of size C > 1, AUTO and RING run self-attention whose T is a
    multiple of C as ring attention over that axis (:mod:`jaxrl_llm.models.ring_attention`);
    RING anywhere else is AUTO, and so is it with attention ``sinks`` ``[H]`` (ring attention
    does not take them: the attention then runs unsplit over ``context``, same result).

    Args:
      q_btne: ``[B, T, H, E]`` queries; k_bske, v_bske: ``[B, S, K, E]``; H a multiple of K.
      mask: :class:`AttentionMask`. window: sliding window (RoPE positions) or None.
      softcap: Gemma 2 logit soft cap or None. impl: the requested implementation.
      sinks: ``[H]`` attention-sink logits (gpt-oss) or None.
      backend: override of ``jax.default_backend()`` (tests). block_size: blockwise blocks.

    Returns:
      ``[B, T, H, E]`` in v's dtype.
    """
    b, t, h, e = q_btne.shape
    impl = AttentionImpl(impl)
    if impl in (AttentionImpl.AUTO, AttentionImpl.RING):
        c = _context_size()
        if c > 1 and mask.self_attention and t % c == 0 and sinks is None:
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
        sinks=sinks is not None,
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
        return naive_attention(
            q_btne, k_bske, v_bske, mask, window=window, softcap=softcap, sinks=sinks
        )
    return blockwise_attention(
        q_btne,
        k_bske,
        v_bske,
        mask,
        window=window,
        softcap=softcap,
        block_q=block_size,
        block_k=block_size,
        sinks=sinks,
    )

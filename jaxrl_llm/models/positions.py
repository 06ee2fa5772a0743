"""Where a token is and what it may see, per layer: RoPE and the per-layer attention tables.

RoPE (Su et al. 2021, "RoFormer", https://arxiv.org/abs/2104.09864) in transformers' "rotate
half" layout, with Llama 3's, linear and YaRN frequency scaling (Peng et al. 2023,
https://arxiv.org/abs/2309.00071). For models whose layers differ in
type (Gemma 2 / 3: local sliding-window layers with their own RoPE base interleaved with
global layers; Gemma Team 2024, https://arxiv.org/abs/2408.00118, and 2025,
https://arxiv.org/abs/2503.19786 §2) the per-layer window and RoPE frequencies are small
constant tables built from the static config and indexed by the traced layer index inside
the layer scan, so every layer still runs one compiled body.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.attention_mask import causal_self_mask
from jaxrl_llm.models.config import LayerType, ModelConfig, RopeScaling


def rope_inv_freq(config: ModelConfig) -> jax.Array:
    """Inverse RoPE frequencies ``[E/2]`` including Llama 3 / linear scaling (of the global
    layers when the config has per-layer types; :func:`layer_rope_inv_freq` gives each
    layer's); ``[R/2]`` over the R = ``config.rotary_dim`` rotated dims with a partial
    rotary factor (Qwen3.5). With Gemma 4's GLOBAL-layer geometry (``global_head_dim``,
    ``global_rope_proportion`` p) ``[E_g/2]`` over the GLOBAL head dim E_g: the first
    ⌊p · E_g / 2⌋ are ``1/θ^(2j/E_g)``, the rest 0 (pairs that do not rotate; transformers'
    "proportional" RoPE)."""
    e = config.rotary_dim
    inv = 1.0 / (config.rope.theta ** (jnp.arange(0, e, 2, dtype=jnp.float32) / e))
    if config.attn.global_head_dim is not None or config.rope.global_proportion != 1.0:
        e = config.layer_heads(config.attn.layer_types.index(LayerType.GLOBAL))[1]
        rotated = int(config.rope.global_proportion * e // 2)
        inv = 1.0 / (config.rope.theta ** (jnp.arange(0, 2 * rotated, 2, dtype=jnp.float32) / e))
        inv = jnp.pad(inv, (0, e // 2 - rotated))
    return scale_inv_freq(config, inv)


def scale_inv_freq(config: ModelConfig, inv: jax.Array) -> jax.Array:
    """``config.rope.scaling`` applied to the unscaled inverse frequencies ``inv`` ``[R/2]``
    of base ``config.rope.theta`` over R rotated dims."""
    if config.rope.scaling == RopeScaling.YARN:
        return yarn_inv_freq(config, inv)
    if config.rope.scaling == RopeScaling.LINEAR:
        inv = inv / config.rope.factor
    elif config.rope.scaling == RopeScaling.LLAMA3:
        # Llama 3.1 (arXiv:2407.21783): keep high frequencies, divide low ones by `factor`,
        # interpolate smoothly in between.
        factor, lo, hi = (
            config.rope.factor,
            config.rope.low_freq_factor,
            config.rope.high_freq_factor,
        )
        old = config.rope.original_max_position
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = jnp.where(medium, smoothed, scaled)
    return inv


def yarn_inv_freq(config: ModelConfig, inv: jax.Array) -> jax.Array:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2023, https://arxiv.org/abs/2309.00071
    §3.2): pair j keeps θ_j where it turns more than β_fast times over the original context
    ``rope_original_max_position`` (L), takes θ_j / s where it turns fewer than β_slow times,
    and a linear ramp between, over dims; the ramp's ends are the dims
    ``R · ln(L / (2π β)) / (2 ln base)``, rounded outwards with ``rope_truncate``, clipped to
    [0, R − 1]. The factor q and k are multiplied by is
    :attr:`~jaxrl_llm.models.ModelConfig.rope_attention_scaling`."""
    c = config
    r = 2 * inv.shape[0]

    def boundary(rotations: float) -> float:
        return (
            r
            * math.log(c.rope.original_max_position / (rotations * 2 * math.pi))
            / (2 * math.log(c.rope.theta))
        )

    low, high = boundary(c.rope.beta_fast), boundary(c.rope.beta_slow)
    if c.rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = jnp.clip((jnp.arange(r // 2, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1: extrapolate (keep θ_j); 0: interpolate (θ_j / s)
    return inv / c.rope.factor * (1.0 - keep) + inv * keep


# A global layer's window when layers differ in type: farther than any position.
NO_WINDOW = 2**30


def layer_windows(config: ModelConfig) -> np.ndarray | None:
    """``[L]`` int32 sliding window of each layer (:data:`NO_WINDOW` on GLOBAL layers); None
    when the config has no per-layer types (then ``config.attn.sliding_window`` applies to every
    layer) or no LOCAL layer (then no layer has a window)."""
    if LayerType.LOCAL not in config.attn.layer_types:
        return None
    local = config.attn.sliding_window if config.attn.sliding_window is not None else NO_WINDOW
    return np.asarray(
        [local if t == LayerType.LOCAL else NO_WINDOW for t in config.attn.layer_types], np.int32
    )


def layer_rope_inv_freq(config: ModelConfig) -> jax.Array | None:
    """``[L, E/2]`` RoPE inverse frequencies of each layer: LOCAL layers use base
    ``rope_local_theta`` unscaled (Gemma 3, https://arxiv.org/abs/2503.19786 §2), GLOBAL
    layers :func:`rope_inv_freq`. None when the config has no LOCAL layer (every layer then
    uses :func:`rope_inv_freq`). Without ``rope_local_theta`` the LOCAL layers take the base
    ``rope_theta`` with the config's scaling (one rotary table for every layer, as in Gemma 2 and
    gpt-oss). With heads of two sizes (Gemma 4) the table is
    ``[L, E*/2]`` over the stored head dim E*: a smaller layer's frequencies then zeros, which
    with its heads padded per half (:mod:`jaxrl_llm.models.padded_heads`) rotates each of its pairs
    as at its own size and leaves the padding alone."""
    if LayerType.LOCAL not in config.attn.layer_types:
        return None
    e = config.rotary_dim
    glob = rope_inv_freq(config)
    theta = config.rope.theta if config.rope.local_theta is None else config.rope.local_theta
    local = 1.0 / (theta ** (jnp.arange(0, e, 2, dtype=jnp.float32) / e))
    if config.rope.local_theta is None:
        local = scale_inv_freq(config, local)
    width = max(local.shape[0], glob.shape[0])
    local = jnp.pad(local, (0, width - local.shape[0]))
    glob = jnp.pad(glob, (0, width - glob.shape[0]))
    is_local = np.asarray([t == LayerType.LOCAL for t in config.attn.layer_types])
    return jnp.where(jnp.asarray(is_local)[:, None], local[None], glob[None])


def layer_head_tables(config: ModelConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-layer tables of a stack whose heads are stored padded
    (``config.has_padded_heads``, Gemma 4): (``[L]`` int32 each layer's own head dim, the
    divisor of its per-head RMSNorms; ``[L, K*]`` int32 the KV head of that layer that fills
    each of the K* stored KV slots, :func:`jaxrl_llm.models.padded_heads.kv_slot_heads`). None when
    every layer has the stored size."""
    if not config.has_padded_heads:
        return None
    k_store = config.store_kv_heads
    heads = [config.layer_heads(i) for i in range(config.num_layers)]
    dims = np.asarray([e for _, e in heads], np.int32)
    slots = np.stack([np.arange(k_store) * k // k_store for k, _ in heads]).astype(np.int32)
    return dims, slots


def layer_values_are_keys(config: ModelConfig) -> np.ndarray | None:
    """``[L]`` bool: the layer's values are its key projection (Gemma 4's GLOBAL layers with
    ``global_k_eq_v``); None when no layer's are."""
    if not config.attn.global_k_eq_v:
        return None
    return np.asarray([t == LayerType.GLOBAL for t in config.attn.layer_types])


def layer_kv_sharing(config: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per-layer tables of a stack whose last layers share keys/values
    (``config.attn.kv_shared_layers``, Gemma 4): (``[L]`` bool the layer reuses the keys/values of
    the last earlier layer of its type; ``[L]`` int32 its type's slot among the stack's types,
    in order of first appearance; ``[L]`` int32 the layer whose cache slot it reads: itself,
    or for a KV-shared layer that source layer, always < ``config.num_kv_layers``). None
    without KV sharing."""
    if not config.attn.kv_shared_layers:
        return None
    kinds = list(dict.fromkeys(config.attn.layer_types))
    n = config.num_layers
    reuse = np.asarray([config.kv_shared(i) for i in range(n)])
    slot = np.asarray([kinds.index(t) for t in config.attn.layer_types], np.int32)
    first = config.num_kv_layers
    last_of = {t: max(i for i in range(first) if config.attn.layer_types[i] == t) for t in kinds}
    source = np.asarray(
        [last_of[config.attn.layer_types[i]] if reuse[i] else i for i in range(n)], np.int32
    )
    return reuse, slot, source


def check_layer_index(config: ModelConfig, layer) -> None:
    """ValueError when the config has per-layer types (``config.attn.layer_types``) and no layer
    index was given: the window and RoPE tables are looked up by that index."""
    if config.attn.layer_types and layer is None:
        raise ValueError(
            "this config has per-layer attention types (layer_types); pass the layer index"
        )


def apply_rope(x_btne: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in transformers' "rotate half" layout, on the first R = 2·len(inv_freq)
    dims of each head (all E unless a partial rotary factor made ``inv_freq`` shorter; the
    other E − R dims pass through, as in Qwen3.5)."""
    angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B, T, R/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    r = 2 * inv_freq.shape[-1]
    x = x_btne.astype(jnp.float32)
    x1, x2 = jnp.split(x[..., :r], 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], axis=-1)
    return out.astype(x_btne.dtype)


def default_positions(attention_mask: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """RoPE positions from a ``[B, T]`` mask: cumsum(mask) − 1 (0 on left padding);
    with segment ids, positions restart at 0 in every segment (packing)."""
    m = attention_mask.astype(jnp.int32)
    if segment_ids is None:
        return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)
    idx = jnp.arange(m.shape[1])[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return (idx - start_idx).astype(jnp.int32)


def self_attention_mask(
    config: ModelConfig, attention_mask, positions, segment_ids=None, blocks=None
):
    """Compact mask of causal self-attention: causal, real keys, same segment, inside the
    sliding window; a query always sees itself (so a padded query's ignorable output stays
    finite). ``attention_mask`` None = every key real; ``blocks`` ``[B, T]``: bidirectional
    block ids (tokens of one block ≥ 0 see each other both ways), or None."""
    window = config.uses_window
    return causal_self_mask(
        attention_mask,
        positions if window else None,
        segment_ids,
        num_tokens=positions.shape[1],
        blocks=blocks,
    )

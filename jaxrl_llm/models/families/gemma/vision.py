"""Gemma 3's vision part, as transformers' ``Gemma3ForConditionalGeneration`` implements it:
the SigLIP image encoder, the multi-modal projector and the insertion of its soft tokens into
the text embeddings; pure functions over a params tree (``params["vision"]``).

- SigLIP (Zhai et al., "Sigmoid Loss for Language Image Pre-Training", 2023,
  https://arxiv.org/abs/2303.15343; transformers' ``SiglipVisionModel``): non-overlapping
  ``p × p`` patches embedded by a linear map (a stride-p convolution) plus a learned position
  embedding per patch, then pre-LayerNorm transformer blocks ``x += attn(LN₁ x)``,
  ``x += fc₂ gelu_tanh(fc₁ LN₂ x)`` with bidirectional multi-head attention over the patches
  (scores ``q·k / √E``), then a final LayerNorm. No pooling head (Gemma 3 reads every patch).
- The projector (Gemma Team, "Gemma 3 Technical Report", 2025,
  https://arxiv.org/abs/2503.19786, §2.1; ``Gemma3MultiModalProjector``): the patch grid
  average-pooled to ``√m × √m`` (m = ``mm_tokens_per_image``), Gemma's RMSNorm
  ``x / rms(x) · (1 + w)`` and a linear map to the text width, giving m soft tokens per image.
- Insertion (``Gemma3Model.forward``): the text embeddings (√D-scaled) of the prompt, the
  image placeholders' rows replaced by the soft tokens in reading order (row-major over the
  batch, images in order). In the text stack, the tokens of one image attend to each other
  bidirectionally (``get_block_sequence_ids_for_mask``: a run of consecutive image tokens is
  one block), everything else is causal: :func:`image_blocks`, the ``blocks`` of
  :func:`jaxrl_llm.models.trunk`.

Shapes: N images, C channels, P = (image_size / p)² patches, Dv vision width, Hv heads,
Ev = Dv / Hv head dim, Fv MLP width, Lv layers, m soft tokens per image, D text width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.families.gemma.vision_config import GemmaVisionConfig
from jaxrl_llm.models.kv_cache import KVCache, init_cache
from jaxrl_llm.models.layer import embed_tokens
from jaxrl_llm.models.positions import default_positions
from jaxrl_llm.models.transformer import forward, softcap_logits, trunk, unembedding

Params = dict[str, Any]


def _layer_norm(x, p: Mapping[str, jax.Array], eps: float):
    """LayerNorm over the last axis in float32, ``(x − μ) / √(σ² + ε) · w + b``."""
    x32 = x.astype(jnp.float32)
    mu = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
    y = (x32 - mu) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def _encoder_layer(v: GemmaVisionConfig, x_npd, lp: Mapping[str, Any]):
    """One SigLIP block: ``x += attn(LN₁ x); x += MLP(LN₂ x)`` over ``[N, P, Dv]``."""
    h = _layer_norm(x_npd, lp["layers_ln1"], v.layer_norm_eps)
    q, k, val = (
        jnp.einsum("npd,dhe->nphe", h, lp[m]["kernel"]) + lp[m]["bias"]
        for m in ("layers_q", "layers_k", "layers_v")
    )
    s = jnp.einsum("nqhe,nkhe->nhqk", q, k, preferred_element_type=jnp.float32)
    w = jax.nn.softmax(s / math.sqrt(v.head_dim), axis=-1).astype(val.dtype)
    o = jnp.einsum("nhqk,nkhe->nqhe", w, val)
    x_npd = x_npd + jnp.einsum("nqhe,hed->nqd", o, lp["layers_o"]["kernel"])
    x_npd = x_npd + lp["layers_o"]["bias"]
    h = _layer_norm(x_npd, lp["layers_ln2"], v.layer_norm_eps)
    h = jnp.einsum("npd,df->npf", h, lp["layers_fc1"]["kernel"]) + lp["layers_fc1"]["bias"]
    h = jax.nn.gelu(h, approximate=True)
    h = jnp.einsum("npf,fd->npd", h, lp["layers_fc2"]["kernel"]) + lp["layers_fc2"]["bias"]
    return x_npd + h


def encode_patches(params: Params, v: GemmaVisionConfig, pixels: jax.Array) -> jax.Array:
    """SigLIP's last hidden state ``[N, P, Dv]`` (after the post-LayerNorm) of ``pixels``.

    Args:
      params: ``params["vision"]`` (:func:`vision_param_shapes`).
      v: the vision config.
      pixels: ``[N, C, H, W]`` float images as transformers' image processor gives them
        (channels first, normalised), H = W = ``v.image_size``.
    """
    chex.assert_shape(pixels, (None, v.num_channels, v.image_size, v.image_size))
    n, g, p = pixels.shape[0], v.patches_per_side, v.patch_size
    dtype = params["patch_embed"]["kernel"].dtype
    x = pixels.astype(dtype).reshape(n, v.num_channels, g, p, g, p)
    x = jnp.einsum("ncyixj,ijcd->nyxd", x, params["patch_embed"]["kernel"])
    x = x.reshape(n, g * g, v.hidden_size) + params["patch_embed"]["bias"]
    x = x + params["pos_embed"]["embedding"][None]
    stacked = {k: val for k, val in params.items() if k.startswith("layers_")}

    def body(x, lp):
        return _encoder_layer(v, x, lp), None

    x, _ = jax.lax.scan(body, x, stacked)
    return _layer_norm(x, params["post_ln"], v.layer_norm_eps)


def project_patches(params: Params, v: GemmaVisionConfig, patches: jax.Array) -> jax.Array:
    """Gemma 3's projector: ``[N, P, Dv]`` patches -> ``[N, m, D]`` soft tokens (average pool
    to ``√m × √m``, RMSNorm ``x / rms(x) · (1 + w)`` in float32, linear map)."""
    n, g, k = patches.shape[0], v.patches_per_side, v.pool
    side = g // k
    x = patches.reshape(n, side, k, side, k, v.hidden_size).mean(axis=(2, 4))
    x = x.reshape(n, side * side, v.hidden_size)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + v.layer_norm_eps)
    x32 = x32 * (1.0 + params["proj_norm"]["scale"].astype(jnp.float32))
    return jnp.einsum("nmd,dk->nmk", x32.astype(x.dtype), params["proj"]["kernel"])


def encode_images(params: Params, v: GemmaVisionConfig, pixels: jax.Array) -> jax.Array:
    """Soft tokens ``[N, m, D]`` of N images ``[N, C, H, W]`` (:func:`encode_patches`, then
    :func:`project_patches`); ``params`` is ``params["vision"]``."""
    return project_patches(params, v, encode_patches(params, v, pixels))


def image_blocks(tokens: jax.Array, image_token_id: int) -> jax.Array:
    """``[B, T]`` int32 bidirectional block ids: each run of consecutive ``image_token_id``
    tokens of a row is one block (0, 1, ... in order), −1 elsewhere (transformers'
    ``get_block_sequence_ids_for_mask`` of the image ``token_type_ids``)."""
    chex.assert_rank(tokens, 2)
    is_image = tokens == image_token_id
    prev = jnp.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
    group = jnp.cumsum(is_image & ~prev, axis=1) - 1
    return jnp.where(is_image, group, -1).astype(jnp.int32)


def insert_image_features(
    embeds_btd: jax.Array, tokens: jax.Array, features: jax.Array, image_token_id: int
) -> jax.Array:
    """``embeds_btd`` with the rows of the ``image_token_id`` placeholders replaced by
    ``features`` ``[N, m, D]`` in reading order (row-major over ``[B, T]``; transformers'
    ``masked_scatter``). The caller checks that there are exactly N·m placeholders
    (:func:`check_placeholders`)."""
    chex.assert_rank([embeds_btd, tokens, features], [3, 2, 3])
    b, t, d = embeds_btd.shape
    flat = features.reshape(-1, d).astype(embeds_btd.dtype)
    is_image = (tokens == image_token_id).reshape(-1)
    idx = jnp.clip(jnp.cumsum(is_image) - 1, 0, flat.shape[0] - 1)
    out = jnp.where(is_image[:, None], flat[idx], embeds_btd.reshape(-1, d))
    return out.reshape(b, t, d)


def check_placeholders(tokens: Any, num_images: int, v: GemmaVisionConfig) -> None:
    """Raise a one-line ValueError unless ``tokens`` (host ints ``[B, T]``) hold exactly
    ``num_images · m`` image placeholders."""
    have = int(np.sum(np.asarray(tokens) == v.image_token_id))
    want = num_images * v.mm_tokens_per_image
    if have != want:
        raise ValueError(
            f"{num_images} image(s) need {want} image placeholder tokens "
            f"(id {v.image_token_id}, {v.mm_tokens_per_image} per image); the prompt has {have}"
        )


def embed_with_images(
    params: Params,
    tokens: jax.Array,
    pixels: jax.Array,
    *,
    config: ModelConfig,
    vision: GemmaVisionConfig,
) -> tuple[jax.Array, jax.Array]:
    """(input embeddings ``[B, T, D]`` in the compute dtype, bidirectional blocks ``[B, T]``)
    of a prompt with images: the tokens' scaled embeddings (a placeholder id past the
    vocabulary reads row 0, as transformers does) with :func:`encode_images`' soft tokens
    inserted; ``params`` is the whole tree (``params["vision"]`` the tower). Pass both to
    :func:`jaxrl_llm.models.trunk` / :func:`~jaxrl_llm.models.forward`.

    Raises:
      ValueError: ``params`` has no vision tower; concrete ``tokens`` whose placeholders do
        not number ``N · m`` (:func:`check_placeholders`); one line each.
    """
    if "vision" not in params:
        raise ValueError(
            "images given to a model without a vision tower (params has no 'vision'; load a "
            "vision-language model with jaxrl_llm.interop.load_vision_model)"
        )
    if not isinstance(tokens, jax.core.Tracer):  # checked on the host when it can be
        check_placeholders(tokens, pixels.shape[0], vision)
    ids = jnp.where(tokens >= config.vocab_size, 0, tokens)
    x = embed_tokens(config, params, ids)
    feats = encode_images(params["vision"], vision, pixels)
    x = insert_image_features(x, tokens, feats, vision.image_token_id)
    return x, image_blocks(tokens, vision.image_token_id)


def forward_with_images(
    params: Params,
    tokens: jax.Array,
    pixels: jax.Array,
    *,
    config: ModelConfig,
    vision: GemmaVisionConfig,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Float32 logits ``[B, T, V]`` of prompts with images (``Gemma3ForConditionalGeneration``
    with ``pixel_values`` and ``token_type_ids``): :func:`embed_with_images`, then
    :func:`jaxrl_llm.models.forward` with the image blocks."""
    x, blocks = embed_with_images(params, tokens, pixels, config=config, vision=vision)
    logits, _ = forward(
        params, tokens, config=config, attention_mask=attention_mask, embeds=x, blocks=blocks
    )
    return logits


def prefill_with_images(
    params: Params,
    tokens: jax.Array,
    mask: jax.Array,
    pixels: jax.Array,
    *,
    config: ModelConfig,
    vision: GemmaVisionConfig,
    cache_len: int,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Prefill left-padded prompts with images into a fresh cache: (last position's float32
    logits ``[B, V]``, the cache, next positions ``[B]``), what
    :func:`jaxrl_llm.sampling.prefill` returns for text, so the decode loop
    (:func:`jaxrl_llm.sampling.init_decode_state`, :func:`jaxrl_llm.sampling.decode`) runs
    unchanged: the images are encoded once, here, and decoding is text-only."""
    chex.assert_equal_shape([tokens, mask])
    mask = mask.astype(bool)
    x, blocks = embed_with_images(params, tokens, pixels, config=config, vision=vision)
    b = tokens.shape[0]
    hidden, cache = trunk(
        params,
        tokens,
        config=config,
        positions=default_positions(mask),
        attention_mask=mask,
        cache=init_cache(config, b, cache_len),
        embeds=x,
        blocks=jnp.where(mask, blocks, -1),
    )
    assert cache is not None
    w = unembedding(params, config).astype(hidden.dtype)
    last = jnp.einsum("bd,dv->bv", hidden[:, -1], w, preferred_element_type=jnp.float32)
    return softcap_logits(last, config), cache, jnp.sum(mask, axis=-1).astype(jnp.int32)

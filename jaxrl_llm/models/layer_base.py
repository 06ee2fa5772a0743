"""What the decoder layer's attention and MLP blocks share (:mod:`.layer`, :mod:`.mlp`): the
new tokens' :class:`TokenInfo`, the RMSNorm, a projection's unmerged LoRA adapter and the
logical axes of the activations they place. Below both: it imports neither."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig

Params = dict[str, Any]


class TokenInfo(NamedTuple):
    """What every layer needs to know of the new tokens, built once per forward (a pytree).

    Attributes:
      positions: ``[B, T]`` int32 RoPE position of each new token.
      inv_freq: ``[E/2]`` RoPE inverse frequencies (:func:`jaxrl_llm.models.rope_inv_freq`);
        with per-layer types each layer's come from
        :func:`jaxrl_llm.models.layer_rope_inv_freq` at its index instead.
      weights: ``[B, T]`` float32 weight of each token in a mixture of experts' routing
        statistics (the attention mask); None = 1 each.
      routing: a mixture of experts' :class:`~jaxrl_llm.models.moe.RecordedRouting` of the
        new tokens (``[B, T, L, k]``, each layer reads its slice): the sampler's experts, to
        replay or compare against (R3); None = each block routes by its own top-k.
      per_layer: ``[B, T, L, P]`` Gemma 4's per-layer inputs of the new tokens
        (:func:`~jaxrl_llm.models.layer.per_layer_inputs`; each layer reads its slice); None without them.
    """

    positions: jax.Array
    inv_freq: jax.Array
    weights: jax.Array | None = None
    routing: moe_lib.RecordedRouting | None = None
    per_layer: jax.Array | None = None


#: Logical axes of the residual stream ``[B, T, D]`` and the MLP's hidden units ``[B, T, F]``
#: (:mod:`jaxrl_llm.models.layout`).
BTD = ("batch", "length", "embed")
BTF = ("batch", "length", "mlp")


def rms_norm(
    x: jax.Array,
    scale: jax.Array | None,
    eps: float,
    *,
    unit_offset: bool = False,
    float32: bool = False,
    width=None,
) -> jax.Array:
    """RMSNorm ``x / √(mean(x²) + ε)`` times a learned scale (Zhang & Sennrich 2019,
    https://arxiv.org/abs/1910.07467), normalised in float32.

    ``unit_offset=False`` (Llama): ``w · cast(x̂)``, the product in x's dtype; with
    ``float32`` (Gemma 4) ``cast(w · x̂)``, the product in float32.
    ``unit_offset=True`` (Gemma 2 / 3, https://arxiv.org/abs/2408.00118): ``cast((1 + w) · x̂)``,
    the product in float32, with w stored as trained (zero = identity).
    ``scale=None``: no learned scale, ``cast(x̂)`` (Gemma 4's value norm).
    ``width``: the mean is ``Σx² / width`` (a zero-padded head: its own size; may be traced);
    None = the last axis' size.
    """
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    sq = jnp.square(x32)
    ms = (
        jnp.mean(sq, -1, keepdims=True) if width is None else jnp.sum(sq, -1, keepdims=True) / width
    )
    x32 = x32 * jax.lax.rsqrt(ms + eps)
    if scale is None:
        return x32.astype(dtype)
    if unit_offset:
        return (x32 * (1.0 + scale.astype(jnp.float32))).astype(dtype)
    if float32:
        return (x32 * scale.astype(jnp.float32)).astype(dtype)
    return scale.astype(dtype) * x32.astype(dtype)


def apply_norm(config: ModelConfig, x: jax.Array, p: Params | None, width=None) -> jax.Array:
    """The config's RMSNorm (ε, unit offset, float32 product) of ``x`` with one norm's
    parameters ``p`` (``{"scale": [D]}``; None: scale-free) over ``width`` dims (None: all)."""
    return rms_norm(
        x,
        None if p is None else p["scale"],
        config.norms.eps,
        unit_offset=config.norms.unit_offset,
        float32=config.rms_norm_float32,
        width=width,
    )


def with_adapter(y, x, p, n_in: int):
    """``y + (x A) B`` when the projection carries an unmerged LoRA adapter (``lora_a``
    ``[in, r]``, ``lora_b`` ``[r, out]``, scale folded into B: :func:`models.lora.attach_lora`);
    ``x``'s last ``n_in`` dims are the kernel's input dims. Otherwise ``y`` unchanged."""
    if "lora_a" not in p:
        return y
    dtype = y.dtype
    lead = x.shape[: x.ndim - n_in]
    low = x.reshape(*lead, -1) @ p["lora_a"].astype(dtype)
    return y + (low @ p["lora_b"].astype(dtype)).reshape(y.shape)

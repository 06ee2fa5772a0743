"""Gemma 3's vision config (:class:`GemmaVisionConfig`: transformers' ``Gemma3Config`` minus
its ``text_config``), both ways, and the shapes of ``params["vision"]``; the computation is
:mod:`.vision`'s, the weight names :mod:`.vision_weights`'."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GemmaVisionConfig:
    """Gemma 3's vision tower, projector and image tokens (transformers' ``Gemma3Config``
    minus its ``text_config``).

    Attributes:
      hidden_size (Dv), intermediate_size (Fv), num_layers (Lv), num_heads (Hv): the SigLIP
        encoder's sizes.
      image_size, patch_size (p), num_channels (C): the square input image.
      layer_norm_eps: ε of the encoder's LayerNorms and of the projector's RMSNorm.
      mm_tokens_per_image (m): soft tokens per image, a square whose side divides the patch
        grid's.
      image_token_id: the placeholder token the soft tokens replace.
      boi_token_id, eoi_token_id: the tokens around an image's placeholders (kept for export).
      text_hidden_size (D): the text model's width the projector maps to.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    mm_tokens_per_image: int
    image_token_id: int
    boi_token_id: int
    eoi_token_id: int
    text_hidden_size: int

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision hidden_size {self.hidden_size} % heads {self.num_heads}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} % patch_size {self.patch_size}")
        side = math.isqrt(self.mm_tokens_per_image)
        if side * side != self.mm_tokens_per_image or self.patches_per_side % side:
            raise ValueError(
                f"mm_tokens_per_image={self.mm_tokens_per_image} is not a square whose side "
                f"divides the {self.patches_per_side}-patch grid"
            )

    @property
    def patches_per_side(self) -> int:
        """Patches along one side of the image."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """P, patches per image."""
        return self.patches_per_side**2

    @property
    def head_dim(self) -> int:
        """Ev = Dv / Hv."""
        return self.hidden_size // self.num_heads

    @property
    def pool(self) -> int:
        """The average pool's kernel and stride, in patches."""
        return self.patches_per_side // math.isqrt(self.mm_tokens_per_image)


def vision_param_shapes(v: GemmaVisionConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shapes of ``params["vision"]``: module -> leaf -> shape (layers stacked ``[Lv, ...]``).

    ``patch_embed.kernel`` is ``[p, p, C, Dv]`` (the convolution's, channels last), attention
    kernels ``[Dv, Hv, Ev]`` in / ``[Hv, Ev, Dv]`` out as in the text layers.
    """
    d, f, h, e, n = v.hidden_size, v.intermediate_size, v.num_heads, v.head_dim, v.num_layers
    p = v.patch_size
    return {
        "patch_embed": {"kernel": (p, p, v.num_channels, d), "bias": (d,)},
        "pos_embed": {"embedding": (v.num_patches, d)},
        "layers_ln1": {"scale": (n, d), "bias": (n, d)},
        "layers_q": {"kernel": (n, d, h, e), "bias": (n, h, e)},
        "layers_k": {"kernel": (n, d, h, e), "bias": (n, h, e)},
        "layers_v": {"kernel": (n, d, h, e), "bias": (n, h, e)},
        "layers_o": {"kernel": (n, h, e, d), "bias": (n, d)},
        "layers_ln2": {"scale": (n, d), "bias": (n, d)},
        "layers_fc1": {"kernel": (n, d, f), "bias": (n, f)},
        "layers_fc2": {"kernel": (n, f, d), "bias": (n, d)},
        "post_ln": {"scale": (d,), "bias": (d,)},
        "proj_norm": {"scale": (d,)},
        "proj": {"kernel": (d, v.text_hidden_size)},
    }


def vision_config_from_hf(d: Mapping[str, Any], text_hidden_size: int) -> GemmaVisionConfig:
    """The :class:`GemmaVisionConfig` of a transformers ``Gemma3Config`` dict (``config.json``
    of a ``Gemma3ForConditionalGeneration``).

    Raises:
      ValueError: a vision feature we do not implement (a vision model other than SigLIP's, an
        activation other than tanh-GELU); KeyError: a required key is missing.
    """
    vc = d["vision_config"]
    if vc.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise ValueError(f"unsupported Gemma 3 vision model_type {vc.get('model_type')!r}")
    act = vc.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma 3 vision hidden_act {act!r}")
    return GemmaVisionConfig(
        hidden_size=int(vc["hidden_size"]),
        intermediate_size=int(vc["intermediate_size"]),
        num_layers=int(vc["num_hidden_layers"]),
        num_heads=int(vc["num_attention_heads"]),
        image_size=int(vc["image_size"]),
        patch_size=int(vc["patch_size"]),
        num_channels=int(vc.get("num_channels", 3)),
        layer_norm_eps=float(vc.get("layer_norm_eps", 1e-6)),
        mm_tokens_per_image=int(d.get("mm_tokens_per_image", 256)),
        image_token_id=int(d.get("image_token_index", d.get("image_token_id", 262144))),
        boi_token_id=int(d.get("boi_token_index", 255999)),
        eoi_token_id=int(d.get("eoi_token_index", 256000)),
        text_hidden_size=int(text_hidden_size),
    )


def vision_config_to_hf(v: GemmaVisionConfig) -> dict[str, Any]:
    """The keys of a transformers ``Gemma3Config`` beside ``text_config`` (the inverse of
    :func:`vision_config_from_hf`; SigLIP without its pooling head, which Gemma 3 never
    reads)."""
    return {
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size,
            "num_hidden_layers": v.num_layers,
            "num_attention_heads": v.num_heads,
            "image_size": v.image_size,
            "patch_size": v.patch_size,
            "num_channels": v.num_channels,
            "layer_norm_eps": v.layer_norm_eps,
            "hidden_act": "gelu_pytorch_tanh",
            "vision_use_head": False,
        },
        "mm_tokens_per_image": v.mm_tokens_per_image,
        "image_token_index": v.image_token_id,
        "boi_token_index": v.boi_token_id,
        "eoi_token_index": v.eoi_token_id,
    }

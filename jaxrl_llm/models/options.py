"""The enumerated options of a :class:`~jaxrl_llm.models.config.ModelConfig`: the model family,
layer types, activation, RoPE scaling, the attention implementation and the MoE dispatch.

A leaf module (it imports nothing from the package), so that the config and the families'
preset modules (:mod:`jaxrl_llm.models.families`) can both use these enums without importing
each other. :mod:`jaxrl_llm.models.config` re-exports every name.
"""

from __future__ import annotations

import enum


class Family(str, enum.Enum):
    """Model families this implementation covers (transformers' ``model_type``)."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    GEMMA2 = "gemma2"
    GEMMA3 = "gemma3_text"
    QWEN3_MOE = "qwen3_moe"
    MIXTRAL = "mixtral"
    QWEN3_5 = "qwen3_5_text"
    QWEN3_5_MOE = "qwen3_5_moe_text"
    GEMMA4 = "gemma4_text"
    GPT_OSS = "gpt_oss"


class LayerType(str, enum.Enum):
    """Token mixer of one layer (transformers' ``layer_types`` entries).

    GLOBAL layers attend to every earlier token; LOCAL layers only to the last
    ``sliding_window`` positions and use the local RoPE base (Gemma 2 / 3 / 4 interleave them).
    LINEAR layers are Gated DeltaNet linear attention (:mod:`jaxrl_llm.models.gated_deltanet`),
    interleaved with GLOBAL layers in Qwen3.5.
    """

    GLOBAL = "full_attention"
    LOCAL = "sliding_attention"
    LINEAR = "linear_attention"


class Activation(str, enum.Enum):
    """The gated MLP's activation: SwiGLU (Llama family), GeGLU with tanh-GELU (Gemma), or
    gpt-oss's clamped SwiGLU, ``(clip(u, ±ℓ) + 1) · g·σ(α g)`` with ``g = min(gate, ℓ)``
    (``ModelConfig.swiglu_alpha`` α, ``swiglu_limit`` ℓ; transformers' ``GptOssExperts``)."""

    SILU = "silu"
    GELU_TANH = "gelu_pytorch_tanh"
    CLAMPED_SWIGLU = "clamped_swiglu"


class RopeScaling(str, enum.Enum):
    """RoPE frequency scaling schemes (transformers' ``rope_type``)."""

    NONE = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    YARN = "yarn"


class AttentionImpl(str, enum.Enum):
    """Which attention implementation the model runs (:mod:`jaxrl_llm.models.attention`).

    AUTO picks by backend and shape (``select_attention_impl``): cuDNN flash attention on GPU
    and the Pallas splash kernel on TPU where they can express the mask, else the naive path
    for tiny shapes and the decode step, else the blockwise (O(T) memory) path. The others
    force one; CUDNN and SPLASH still fall back to BLOCKWISE where they cannot apply.
    RING is ring attention over the mesh's ``context`` axis (``jaxrl_llm.models.ring_attention``);
    AUTO picks it for self-attention when the ambient mesh (``jax.set_mesh``) has a
    ``context`` axis of size > 1.
    """

    AUTO = "auto"
    NAIVE = "naive"
    BLOCKWISE = "blockwise"
    CUDNN = "cudnn"
    SPLASH = "splash"
    RING = "ring"


class MoeDispatch(str, enum.Enum):
    """How a sparse MoE block sends tokens to experts (:mod:`jaxrl_llm.models.moe`).

    SORTED sorts the (token, expert) assignments by expert and runs one grouped matmul
    (``jax.lax.ragged_dot``): the active FLOPs only. DENSE runs every expert on every token and
    combines with one-hot routing weights (X/k × the FLOPs; for tiny models and checks).
    """

    SORTED = "sorted"
    DENSE = "dense"

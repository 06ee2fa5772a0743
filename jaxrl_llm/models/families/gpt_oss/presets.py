"""gpt-oss sizes as :class:`~jaxrl_llm.models.ModelConfig` field dicts: a tiny random-init
config for tests and the two released models. Imports only the options (a leaf for the
config, :mod:`jaxrl_llm.models.families.facts`).

The released sizes are those of the models' ``config.json`` files (openai/gpt-oss-20b and
openai/gpt-oss-120b on the Hugging Face Hub; transformers' ``GptOssConfig`` defaults are the
120b's): vocabulary 201,088, width 2,880, 64 query heads and 8 KV heads of 64, experts of width
2,880 with top-4 routing, sliding window 128 on every other layer (the first sliding), RoPE base
150,000 with YaRN (factor 32 over 4,096 positions, β 32 / 1, not truncated), 131,072 positions,
RMSNorm ε 1e-5, untied unembedding; 20b: 24 layers and 32 experts, 120b: 36 layers and 128.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.options import Activation, Family, LayerType, RopeScaling


def alternating_layer_types(num_layers: int) -> tuple[LayerType, ...]:
    """Sliding then full attention, repeated (transformers' ``GptOssConfig`` default)."""
    return tuple(LayerType.LOCAL if i % 2 == 0 else LayerType.GLOBAL for i in range(num_layers))


def _fields(*, num_layers: int, num_experts: int, **sizes) -> dict[str, Any]:
    """The fields every gpt-oss shares, around the given sizes."""
    return dict(
        family=Family.GPT_OSS,
        num_layers=num_layers,
        num_experts=num_experts,
        layer_types=alternating_layer_types(num_layers),
        rope_scaling=RopeScaling.YARN,
        rope_truncate=False,
        rope_beta_fast=32.0,
        rope_beta_slow=1.0,
        rms_norm_eps=1e-5,
        tie_embeddings=False,
        attention_bias=True,
        attention_out_bias=True,
        attention_sinks=True,
        expert_bias=True,
        mlp_activation=Activation.CLAMPED_SWIGLU,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        norm_topk_prob=True,  # the softmax over the top-k logits
        **sizes,
    )


def tiny_fields() -> dict[str, Any]:
    """A tiny gpt-oss for unit tests: 4 layers (sliding window 5), D=48, 3 heads / 1 KV head of
    16, 8 experts of width 40, top-2, V=97; YaRN with factor 4 over 64 positions."""
    return _fields(
        num_layers=4,
        num_experts=8,
        vocab_size=97,
        hidden_size=48,
        intermediate_size=40,
        num_heads=3,
        num_kv_heads=1,
        head_dim=16,
        num_experts_per_tok=2,
        sliding_window=5,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_factor=4.0,
        rope_original_max_position=64,
    )


def _released(num_layers: int, num_experts: int) -> dict[str, Any]:
    return _fields(
        num_layers=num_layers,
        num_experts=num_experts,
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        num_experts_per_tok=4,
        sliding_window=128,
        max_position_embeddings=131072,
        rope_theta=150000.0,
        rope_factor=32.0,
        rope_original_max_position=4096,
    )


def gpt_oss_20b_fields() -> dict[str, Any]:
    """gpt-oss-20b: 24 layers, 32 experts (top-4), D=2880, 64 heads / 8 KV heads of 64."""
    return _released(24, 32)


def gpt_oss_120b_fields() -> dict[str, Any]:
    """gpt-oss-120b: 36 layers, 128 experts (top-4), otherwise as gpt-oss-20b."""
    return _released(36, 128)

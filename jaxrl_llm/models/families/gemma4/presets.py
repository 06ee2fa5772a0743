"""Gemma 4 (text) sizes as :class:`~jaxrl_llm.models.ModelConfig` field dicts: the fields
every Gemma 4 shares, a tiny random-init config for tests and Gemma 4 31B for planning. Imports
only the options (a leaf for the config, :mod:`jaxrl_llm.models.families.facts`)."""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.options import Activation, Family, LayerType

#: Gemma 4's end-of-generation tokens: ``<eos>`` (1), ``<turn|>`` (106) and
#: ``<|tool_response>`` (50), as transformers' GGUF reader sets them for Gemma 4.
EOS_TOKEN_IDS = (1, 106, 50)


def default_layer_types(num_layers: int, period: int = 6) -> tuple[LayerType, ...]:
    """``period − 1`` LOCAL layers then one GLOBAL layer, repeated, and the last layer GLOBAL
    (transformers' default ``layer_types`` for Gemma 4, which forces the last one)."""
    types = [
        LayerType.GLOBAL if (i + 1) % period == 0 else LayerType.LOCAL for i in range(num_layers)
    ]
    types[-1] = LayerType.GLOBAL
    return tuple(types)


def common_fields() -> dict[str, Any]:
    """The ModelConfig fields every Gemma 4 text model shares (transformers' classes fix
    them)."""
    return dict(
        family=Family.GEMMA4,
        rms_norm_unit_offset=False,
        post_norms=True,
        mlp_activation=Activation.GELU_TANH,
        scale_embeddings=True,
        qk_norm=True,
        value_norm=True,
        layer_scalars=True,
        query_pre_attn_scalar=1.0,
    )


def tiny_fields() -> dict[str, Any]:
    """A tiny random Gemma 4 for tests: 4 layers (sliding, sliding, sliding, full), window 5,
    sliding heads of E=16 with 2 KV heads, full-attention heads of E=24 with 1 KV head whose
    values are their keys, proportional RoPE on a quarter of the full-attention pairs."""
    return dict(
        common_fields(),
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        global_head_dim=24,
        global_kv_heads=1,
        global_k_eq_v=True,
        global_rope_proportion=0.25,
        layer_types=default_layer_types(4, 4),
        sliding_window=5,
        max_position_embeddings=256,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        final_logit_softcap=30.0,
        tie_embeddings=True,
    )


def gemma4_31b_fields() -> dict[str, Any]:
    """ModelConfig fields of Gemma 4 31B (google/gemma-4-31B, text decoder): 60 layers, five
    sliding (window 1024) per full one, D=5376, F=21504, 32 heads; sliding layers 16 KV heads
    of E=256, full layers 4 KV heads of E=512 whose values are their keys; V=262144, tied,
    final soft cap 30; 30.7B parameters. The sizes are those the model's published card and
    config describe (as quoted by third-party conversions: the Core AI port's model card,
    huggingface.co/mlboydaisuke/Gemma-4-31B-CoreAI, and apxml.com/models/gemma-4-31b); the
    RoPE values (θ 1M proportional with p = 0.25 on full layers, 10k on sliding ones) are
    transformers' ``Gemma4TextConfig`` defaults, assumed unchanged."""
    return dict(
        common_fields(),
        vocab_size=262144,
        hidden_size=5376,
        intermediate_size=21504,
        num_layers=60,
        num_heads=32,
        num_kv_heads=16,
        head_dim=256,
        global_head_dim=512,
        global_kv_heads=4,
        global_k_eq_v=True,
        global_rope_proportion=0.25,
        layer_types=default_layer_types(60),
        sliding_window=1024,
        max_position_embeddings=262144,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        final_logit_softcap=30.0,
        tie_embeddings=True,
        bos_token_id=2,
        eos_token_ids=EOS_TOKEN_IDS,
        pad_token_id=0,
    )

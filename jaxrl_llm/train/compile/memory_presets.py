"""The planning tables of the memory estimator (:mod:`jaxrl_llm.train.compile.memory`): published
model architectures by size (dense and mixture-of-experts) and the memory of one device of each
accelerator kind."""

from __future__ import annotations

import os

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.models.config import Family, ModelConfig, RopeScaling
from jaxrl_llm.models.families.gemma4.presets import gemma4_31b_fields
from jaxrl_llm.models.families.gpt_oss.presets import gpt_oss_20b_fields, gpt_oss_120b_fields
from jaxrl_llm.models.families.qwen3_5.presets import qwen3_5_9b_fields, qwen3_5_35b_a3b_fields
from jaxrl_llm.parallel.chips import CHIPS


def _llama(**kw) -> ModelConfig:
    return ModelConfig(family=Family.LLAMA, **kw)


# Published architectures by size (Llama 2 / 3.x, SmolLM2, Gemma 3 / 4, Qwen3-MoE, Qwen3.5,
# gpt-oss, Mixtral), for planning without downloads (the Qwen3-MoE and Mixtral shapes are those of the
# models' config.json files; Qwen3.5's those of transformers' config classes).
MODEL_PRESETS: dict[str, ModelConfig] = {
    "135m": ModelConfig.smollm2_135m(),
    "gemma3-270m": ModelConfig.gemma3_270m(),
    # Gemma 4 31B (text): 30.7B parameters; sliding heads 16 x 256, full-attention 4 x 512
    # (stored padded to 16 x 512: jaxrl_llm.models.padded_heads). Sources:
    # models/families/gemma4/presets.py.
    "gemma4-31b": ModelConfig(**gemma4_31b_fields()),
    "1b": _llama(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=RopeScaling.LLAMA3,
        rope_factor=32.0,
        tie_embeddings=True,
    ),
    "3b": _llama(
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=RopeScaling.LLAMA3,
        rope_factor=32.0,
        tie_embeddings=True,
    ),
    "7b": _llama(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
    ),
    "8b": _llama(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        rope_theta=500000.0,
        rope_scaling=RopeScaling.LLAMA3,
        rope_factor=8.0,
    ),
    "13b": _llama(
        vocab_size=32000,
        hidden_size=5120,
        intermediate_size=13824,
        num_layers=40,
        num_heads=40,
        num_kv_heads=40,
    ),
    "70b": _llama(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        rope_theta=500000.0,
        rope_scaling=RopeScaling.LLAMA3,
        rope_factor=8.0,
    ),
    # Qwen3-30B-A3B: 48 layers, 128 experts of width 768, top-8 renormalised; 30.5B total,
    # 3.3B active parameters.
    "qwen3-30b-a3b": ModelConfig(
        family=Family.QWEN3_MOE,
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        qk_norm=True,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
    # Qwen3.5-9B (8.95B parameters) and Qwen3.5-35B-A3B: the defaults of transformers'
    # Qwen3_5TextConfig / Qwen3_5MoeTextConfig (5.23.0). Sources:
    # models/families/qwen3_5/presets.py.
    "qwen3.5-9b": ModelConfig(**qwen3_5_9b_fields()),
    "qwen3.5-35b-a3b": ModelConfig(**qwen3_5_35b_a3b_fields()),
    # gpt-oss-20b / -120b: 24 / 36 layers, 32 / 128 experts of width 2880, top-4, sliding
    # window 128 on every other layer, attention sinks; 20.9B / 116.8B parameters (4.2B / 5.7B
    # active with the embeddings). Sources: models/families/gpt_oss/presets.py.
    "gpt-oss-20b": ModelConfig(**gpt_oss_20b_fields()),
    "gpt-oss-120b": ModelConfig(**gpt_oss_120b_fields()),
    # Mixtral-8x7B: 32 layers, 8 experts of width 14336, top-2; 46.7B total, 12.9B active.
    "mixtral-8x7b": ModelConfig(
        family=Family.MIXTRAL,
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        num_experts=8,
        num_experts_per_tok=2,
    ),
}

#: Memory per device (bytes) of each device kind: the HBM of
#: :data:`jaxrl_llm.parallel.chips.CHIPS` (the one chip table, with its sources). "cpu" reads
#: this machine's RAM (:func:`device_memory_bytes`).
DEVICE_MEMORY: dict[str, int] = {kind: chip.hbm_bytes for kind, chip in CHIPS.items()}


def device_memory_bytes(device: str) -> int:
    """Memory of one device of the named kind (``cpu``: physical RAM of this machine)."""
    if device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        return DEVICE_MEMORY[device]
    except KeyError:
        raise ConfigError(
            f"unknown device {device!r}{did_you_mean(device, [*DEVICE_MEMORY, 'cpu'])}; "
            f"allowed: {sorted(DEVICE_MEMORY) + ['cpu']}"
        ) from None

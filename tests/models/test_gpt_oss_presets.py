"""The gpt-oss size presets (models/families/gpt_oss/presets.py) and their memory-planning
entries: the parameter counts of the model card (OpenAI 2025, https://arxiv.org/abs/2508.10925
table 1: 20.9B / 116.8B total, 3.6B / 5.1B active, which leave out the embedding table), and an
estimate for each that splits its experts over the ``expert`` axis."""

import pytest

from jaxrl_llm.models import Family, LayerType, ModelConfig
from jaxrl_llm.train.compile.memory import MODEL_PRESETS, estimate_memory


@pytest.mark.parametrize(
    "name,layers,experts,total,active",
    [("gpt-oss-20b", 24, 32, 20.9e9, 3.6e9), ("gpt-oss-120b", 36, 128, 116.8e9, 5.1e9)],
)
def test_presets_have_the_model_cards_sizes(name, layers, experts, total, active):
    c = MODEL_PRESETS[name]
    assert c.family == Family.GPT_OSS and (c.num_layers, c.num_experts) == (layers, experts)
    assert c.layer_types[:2] == (LayerType.LOCAL, LayerType.GLOBAL) and c.sliding_window == 128
    assert c.attention_sinks and c.expert_bias and c.num_experts_per_tok == 4
    assert c.num_params() == pytest.approx(total, rel=0.005)
    embedding = c.vocab_size * c.hidden_size
    assert c.num_params(active=True) - embedding == pytest.approx(active, rel=0.01)


def test_the_tiny_preset_is_a_small_gpt_oss():
    c = ModelConfig.tiny("gpt_oss")
    assert c.family == Family.GPT_OSS and c.num_layers == 4 and c.rope_attention_scaling > 1


def test_memory_estimate_splits_the_experts():
    """Experts are 91% of gpt-oss-20b's weights (24 · 32 · 3 · 2880² of 20.9B): over 4 expert
    shards a device holds 0.09 + 0.91 / 4 ≈ 0.31 of the weights it holds unsplit."""
    c = MODEL_PRESETS["gpt-oss-20b"]

    def weights(expert):
        m = estimate_memory(c, "grpo", batch_size=4, seq_len=1024, group_size=8, expert=expert)
        return next(r.bytes for r in m.rows if r.model == "learner" and "master" in r.component)

    assert weights(4) / weights(1) == pytest.approx(0.31, abs=0.01)

"""The family registry (jaxrl_llm/models/families/registry.py): every folder's entry answers the
shared import and export code both ways, and the multimodal model types resolve to their text
family."""

import jax
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models import HF_ARCHITECTURES, Family, ModelConfig, param_shapes_and_axes
from jaxrl_llm.models.families.registry import FAMILIES, entry_of, family_entry


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=lambda f: f.value)
def test_a_tiny_config_reads_back_from_its_export(family):
    config = ModelConfig.tiny(family)
    if family == Family.QWEN3_5_MOE:
        # No dense MLP: import takes the expert width for intermediate_size (interop.hf_config).
        config = config.replace(intermediate_size=config.moe.intermediate_size)
    assert interop.model_config_from_hf(interop.hf_config_dict(config)) == config


# Gemma 4's own tensors are those of its MoE block beside the MLP (the 26B-A4B's).
GEMMA4_MOE = dict(
    moe_beside_mlp=True,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=40,
    norm_topk_prob=True,
    router_aux_loss_coef=0.0,
)
WEIGHT_CASES = [(f, {}) for f in sorted(FAMILIES)] + [(Family.GEMMA4, GEMMA4_MOE)]


@pytest.mark.parametrize(
    ("family", "extra"),
    WEIGHT_CASES,
    ids=lambda x: x.value if isinstance(x, Family) else str(bool(x)),
)
def test_weights_go_out_and_back_unchanged(family, extra):
    """Random weights exported, imported and exported again give the same tensors under the
    same names (the entry's own tensors and the shared mapping together)."""
    config = ModelConfig.tiny(family, param_dtype="float32", **extra)
    rng = np.random.default_rng(0)

    def fill(spec):
        if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], tuple):
            return rng.standard_normal(spec[0]).astype(np.float32)
        return {k: fill(v) for k, v in spec.items()}

    params = fill(param_shapes_and_axes(config))
    out = interop.params_to_hf_state_dict(params, config)
    again = interop.params_to_hf_state_dict(interop.params_from_hf_state_dict(out, config), config)
    assert sorted(again) == sorted(out)
    for name, w in out.items():
        np.testing.assert_array_equal(again[name], w, err_msg=name)


def test_multimodal_model_types_resolve_to_their_text_family():
    assert family_entry("qwen3_5").family == Family.QWEN3_5
    assert family_entry("qwen3_5_moe").family == Family.QWEN3_5_MOE
    assert family_entry("gemma3").family == Family.GEMMA3
    assert family_entry("gemma4").family == Family.GEMMA4
    assert family_entry(Family.GPT_OSS).family == Family.GPT_OSS
    assert family_entry("llama").family == Family.LLAMA
    assert family_entry("gpt2") is None


def test_gemma_2_and_3_carry_the_gemma_chat_template():
    """What interop.load gives a Gemma 2 / 3 tokenizer that arrives without a template (Gemma
    4 and the other families have none on their entry)."""
    import jinja2

    for family in (Family.GEMMA2, Family.GEMMA3):
        entry = family_entry(family)
        assert entry.end_of_turn == "<end_of_turn>"
        text = jinja2.Template(entry.chat_template).render(
            bos_token="<bos>",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            add_generation_prompt=True,
        )
        assert (
            text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        )
    assert family_entry(Family.GEMMA4).chat_template is None
    assert family_entry(Family.QWEN3_5).chat_template is None


def test_every_family_has_its_entry():
    """The shared code asks :func:`entry_of` for any family, so every member has an entry, under
    its own key, and the exported table of architecture names is the entries'."""
    assert set(FAMILIES) == set(Family)
    assert all(entry.family == family for family, entry in FAMILIES.items())
    assert {f: entry_of(f.value).hf_architectures for f in Family} == HF_ARCHITECTURES
    with pytest.raises(ValueError):
        entry_of("gpt2")


def test_the_llama_layouts_checks_come_from_the_entry():
    """config_from_hf_dict runs a family's ``check_hf`` (the Llama layout's: Qwen3-MoE and
    Mixtral share it); an unknown model_type is named as such, whatever else it has."""
    base = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2)
    base.update(num_attention_heads=3, num_experts=4, num_local_experts=4, num_experts_per_tok=2)
    base.update(moe_intermediate_size=8)
    for family in (Family.LLAMA, Family.QWEN3_MOE, Family.MIXTRAL):
        assert entry_of(family).check_hf is not None
        with pytest.raises(ModelLoadError, match=r"^src: mlp_bias=true is not supported"):
            interop.config_from_hf_dict(
                {**base, "model_type": family.value, "mlp_bias": True}, source="src"
            )
    with pytest.raises(ModelLoadError, match="unsupported architecture model_type='phi'"):
        interop.config_from_hf_dict({**base, "model_type": "phi", "hidden_act": "gelu_new"})
    full = {**base, "model_type": "mistral", "sliding_window": 7}
    assert interop.config_from_hf_dict(full).attn.sliding_window == 7
    full["layer_types"] = ["full_attention"] * 2
    assert interop.config_from_hf_dict(full).attn.sliding_window is None
    assert interop.config_from_hf_dict(full, sliding_window=5).attn.sliding_window == 5


def test_a_family_without_expert_names_refuses_experts():
    """The shared expert mapping reads the per-expert names from the entry; a Llama config
    given experts has none in transformers, and says so."""
    assert entry_of(Family.MIXTRAL).expert_names == ("block_sparse_moe", "w1", "w3", "w2")
    config = ModelConfig.tiny(Family.LLAMA, num_experts=4, num_experts_per_tok=2)
    params = jax.tree.map(
        lambda spec: np.zeros(spec[0], np.float32),
        param_shapes_and_axes(config),
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple),
    )
    with pytest.raises(ModelLoadError, match="llama config with experts has no transformers"):
        interop.params_to_hf_state_dict(params, config)
    with pytest.raises(ModelLoadError, match="llama config with experts has no transformers"):
        interop.hf_config_dict(config)

import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.errors import ModelLoadError
from tests.interop._tiny import VARIANTS, tiny_hf_config, tiny_hf_model


def _sd(model):
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_state_dict_round_trip_is_exact(variant):
    hf = tiny_hf_model(variant, seed=1)
    config = interop.config_from_hf_dict(hf.config)
    sd = _sd(hf)
    params = interop.params_from_hf_state_dict(sd, config)
    # the tree has exactly the model's structure and shapes
    shapes = M.param_shapes_and_axes(config)
    is_spec = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)
    import jax

    want = jax.tree.leaves(
        jax.tree.map(lambda s: s[0], shapes, is_leaf=is_spec),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    got = [tuple(x.shape) for x in jax.tree.leaves(params)]
    assert sorted(got) == sorted(want)
    back = interop.params_to_hf_state_dict(params, config)
    expected_keys = set(sd) - ({"lm_head.weight"} if config.tie_embeddings else set())
    assert set(back) == expected_keys
    for k in back:
        np.testing.assert_array_equal(back[k], sd[k], err_msg=k)


def test_layouts_by_hand():
    """q_proj.weight [H·E, D] -> kernel [D, H, E]: kernel[d, h, e] = W[h·E + e, d]."""
    hf = tiny_hf_model("qwen2", seed=2)
    config = interop.config_from_hf_dict(hf.config)
    sd = _sd(hf)
    p = interop.params_from_hf_state_dict(sd, config)
    wq = sd["model.layers.1.self_attn.q_proj.weight"]
    assert p["layers"]["q_proj"]["kernel"].shape == (2, 48, 3, 16)
    assert p["layers"]["q_proj"]["kernel"][1, 5, 2, 7] == wq[2 * 16 + 7, 5]
    wo = sd["model.layers.0.self_attn.o_proj.weight"]  # [D, H·E] -> [H, E, D]
    assert p["layers"]["o_proj"]["kernel"][0, 1, 3, 40] == wo[40, 1 * 16 + 3]
    bk = sd["model.layers.0.self_attn.k_proj.bias"]  # [K·E] -> [K, E]
    assert p["layers"]["k_proj"]["bias"][0, 0, 9] == bk[9]
    wd = sd["model.layers.1.mlp.down_proj.weight"]  # [D, F] -> [F, D]
    assert p["layers"]["down_proj"]["kernel"][1, 70, 4] == wd[4, 70]
    assert p["lm_head"]["kernel"][6, 90] == sd["lm_head.weight"][90, 6]


def test_scalar_head_maps_to_score_weight():
    hf = tiny_hf_model("llama_untied", seq_cls=True, seed=4)
    config = interop.from_hf_model(hf).config  # architectures taken from the class name
    assert config.num_labels == 1 and config.tie_embeddings  # no lm_head in a classifier
    sd = _sd(hf)
    p = interop.params_from_hf_state_dict(sd, config)
    assert "lm_head" not in p
    np.testing.assert_array_equal(p["score_head"]["kernel"], sd["score.weight"].T)
    assert set(interop.params_to_hf_state_dict(p, config)) == set(sd)


def test_missing_key_shape_mismatch_and_unexpected_key_errors():
    hf = tiny_hf_model("llama_untied", seed=1)
    config = interop.config_from_hf_dict(hf.config)
    sd = _sd(hf)
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(
        ModelLoadError, match=r"mydir: missing weight 'model\.layers\.1\.mlp\.up_proj"
    ):
        interop.params_from_hf_state_dict(missing, config, source="mydir")
    bad = dict(sd, **{"model.norm.weight": np.ones(47, np.float32)})
    with pytest.raises(
        ModelLoadError, match=r"'model\.norm\.weight' has shape \(47,\), expected \(48,\)"
    ):
        interop.params_from_hf_state_dict(bad, config)
    extra = dict(sd, **{"model.layers.0.mlp.up_proj.bias": np.zeros(80, np.float32)})
    with pytest.raises(ModelLoadError, match="unexpected weights.*up_proj.bias"):
        interop.params_from_hf_state_dict(extra, config)
    p = interop.params_from_hf_state_dict(sd, config)
    del p["layers"]["q_proj"]
    with pytest.raises(ModelLoadError, match="missing layers/q_proj/kernel"):
        interop.params_to_hf_state_dict(p, config)


def test_unsupported_configs_are_rejected():
    with pytest.raises(ModelLoadError, match="unsupported architecture model_type='gpt2'"):
        interop.config_from_hf_dict(
            {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, source="x/config.json"
        )
    with pytest.raises(ModelLoadError, match="mlp_bias"):
        interop.config_from_hf_dict(tiny_hf_config("llama_tied", mlp_bias=True))
    with pytest.raises(ModelLoadError, match="hidden_act='gelu'"):
        interop.config_from_hf_dict(tiny_hf_config("qwen3", hidden_act="gelu"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_config_dict_round_trips_our_config(variant):
    config = interop.config_from_hf_dict(tiny_hf_config(variant))
    d = interop.hf_config_dict(config)
    assert "quantization_config" not in d
    assert d["architectures"] == [M.HF_ARCHITECTURES[config.family][0]]
    assert d["torch_dtype"] == "float32"
    assert interop.config_from_hf_dict(d) == config

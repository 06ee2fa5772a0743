"""gpt-oss against transformers on CPU in float32: config and weight import (attention sinks,
q/k/v/o biases, sliding and full attention alternating, YaRN RoPE, the router's bias and the
experts' biases and clamped SwiGLU), logits on a left-padded batch longer than the sliding
window, export back to a directory transformers loads with the same logits, the MXFP4 expert
weights of the released checkpoints dequantised on import, and what we refuse."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models import Family, LayerType
from jaxrl_llm.models.families.gpt_oss.weights import dequantize_mxfp4
from tests.interop._tiny import forward_logits, left_padded_batch, torch_logits

SIZES = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=16,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=5,
    max_position_embeddings=256,
    # a clamp the random projections reach (the released 7.0 is never reached at this size)
    swiglu_limit=0.5,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def tiny_gpt_oss(seed: int = 0, **overrides):
    """A random transformers GptOssForCausalLM; every weight re-drawn (norms around 1, the
    sinks N(0, 1), projections and biases N(0, 0.1²)), so that a mapping error in any tensor
    changes the logits."""
    cfg = transformers.GptOssConfig(**{**SIZES, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("sinks"):
                p.copy_(noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def padded_batch(length=40, pads=(0, 5, 17), seed=0):
    return left_padded_batch(
        SIZES["vocab_size"], SIZES["pad_token_id"], length=length, pads=pads, seed=seed
    )


@pytest.fixture(scope="module")
def hf_and_loaded():
    hf = tiny_gpt_oss(seed=3)
    return hf, interop.from_hf_model(hf)


def test_config_maps_every_gpt_oss_field(hf_and_loaded):
    hf, loaded = hf_and_loaded
    c = loaded.config
    assert c.family == Family.GPT_OSS
    assert c.layer_types == (LayerType.LOCAL, LayerType.GLOBAL) * 2 and c.sliding_window == 5
    assert c.attention_sinks and c.attention_bias and c.attention_out_bias and c.expert_bias
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (8, 2, 40)
    assert c.mlp_activation == M.Activation.CLAMPED_SWIGLU and c.swiglu_limit == 0.5
    assert c.rope_scaling == M.RopeScaling.YARN and not c.rope_truncate
    assert (c.rope_factor, c.rope_original_max_position, c.rope_theta) == (4.0, 64, 10000.0)
    assert c.rms_norm_float32 and not c.tie_embeddings
    assert c.num_params() == sum(p.numel() for p in hf.parameters())


def test_yarn_frequencies_and_factor_equal_transformers(hf_and_loaded):
    hf, loaded = hf_and_loaded
    rot = hf.model.rotary_emb
    np.testing.assert_allclose(
        np.asarray(M.rope_inv_freq(loaded.config)), rot.inv_freq.numpy(), rtol=1e-6
    )
    assert loaded.config.rope_attention_scaling == pytest.approx(rot.attention_scaling)
    assert rot.attention_scaling > 1.1  # the factor is in use


def test_logits_match_transformers_on_a_left_padded_batch(hf_and_loaded):
    hf, loaded = hf_and_loaded
    toks, mask = padded_batch()
    assert mask.sum(1).min() > 4 * loaded.config.sliding_window
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    assert np.abs(ref[mask]).max() > 0.5
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


def test_blockwise_attention_with_sinks_gives_the_same_logits(hf_and_loaded):
    _, loaded = hf_and_loaded
    toks, mask = padded_batch()
    blockwise = dataclasses.replace(loaded.config, attention=M.AttentionImpl.BLOCKWISE)
    np.testing.assert_allclose(
        forward_logits(loaded.params, blockwise, toks, mask)[mask],
        forward_logits(loaded.params, loaded.config, toks, mask)[mask],
        atol=1e-5,
        rtol=0,
    )


def test_padding_does_not_change_a_row(hf_and_loaded):
    _, loaded = hf_and_loaded
    toks, mask = padded_batch()
    alone = forward_logits(loaded.params, loaded.config, toks[2:, 17:], mask[2:, 17:])
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    np.testing.assert_allclose(got[2, 17:], alone[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "field,plain",
    [
        ("attention_sinks", False),
        ("attention_out_bias", False),
        ("rope_scaling", M.RopeScaling.NONE),
        ("mlp_activation", M.Activation.SILU),
        ("swiglu_limit", 1e4),
    ],
)
def test_each_gpt_oss_feature_changes_the_logits(hf_and_loaded, field, plain):
    """Dropping a feature changes the logits, so the parity above really checks it."""
    _, loaded = hf_and_loaded
    toks, mask = padded_batch(length=24)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    without = dataclasses.replace(loaded.config, **{field: plain})
    params = loaded.params
    if field == "attention_out_bias":  # the tree without the bias
        layers = {**params["layers"], "o_proj": {"kernel": params["layers"]["o_proj"]["kernel"]}}
        params = {**params, "layers": layers}
    if field == "attention_sinks":
        params = {**params, "layers": {k: v for k, v in params["layers"].items() if k != "sinks"}}
    assert np.abs(forward_logits(params, without, toks, mask) - got)[mask].max() > 1e-2


def test_export_round_trip_gives_transformers_the_same_logits(hf_and_loaded, tmp_path):
    _, loaded = hf_and_loaded
    interop.export_hf(tmp_path, config=loaded.config, params=loaded.params)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == "GptOssForCausalLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    hf.config._attn_implementation = "eager"
    toks, mask = padded_batch(length=30, seed=1)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf.float().eval(), toks, mask, positions)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)
    again = interop.params_from_hf_state_dict(hf.state_dict(), loaded.config)
    assert jax.tree.structure(again) == jax.tree.structure(loaded.params)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_hf_config_dict_round_trips(hf_and_loaded):
    _, loaded = hf_and_loaded
    d = interop.hf_config_dict(loaded.config)
    assert d["model_type"] == "gpt_oss" and d["architectures"] == ["GptOssForCausalLM"]
    assert interop.config_from_hf_dict(d) == loaded.config


def test_mxfp4_dequantisation_equals_transformers():
    """Our MXFP4 unpacking against transformers' own (``convert_moe_packed_tensors``) on random
    bytes: every code point and a range of exponents."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 10, 2, 16), dtype=np.uint8)
    scales = rng.integers(120, 134, (3, 10, 2), dtype=np.uint8)
    ours = dequantize_mxfp4(blocks, scales)
    ref = convert_moe_packed_tensors(
        torch.tensor(blocks), torch.tensor(scales), dtype=torch.float32
    ).numpy()
    assert ours.shape == (3, 64, 10) == ref.shape
    np.testing.assert_array_equal(ours, ref)


def test_mxfp4_checkpoint_imports_dequantised():
    """A state dict with MXFP4 expert kernels (as the released checkpoints hold them) imports
    as their dequantised values, and says so (widths in whole blocks of 32: D=64, F_e=32)."""
    c = M.ModelConfig.tiny("gpt_oss", hidden_size=64, intermediate_size=32)
    sd = interop.params_to_hf_state_dict(M.init_params(c, jax.random.PRNGKey(0)), c)
    rng = np.random.default_rng(1)
    want = {}
    for name, (d_out, d_in) in {"gate_up_proj": (64, 64), "down_proj": (64, 32)}.items():
        key = f"model.layers.1.mlp.experts.{name}"
        blocks = rng.integers(0, 256, (8, d_out, d_in // 32, 16), dtype=np.uint8)
        scales = rng.integers(122, 130, (8, d_out, d_in // 32), dtype=np.uint8)
        del sd[key]
        sd[key + "_blocks"], sd[key + "_scales"] = blocks, scales
        want[name] = dequantize_mxfp4(blocks, scales)
    with pytest.warns(UserWarning, match="MXFP4 expert weights were dequantised"):
        params = interop.params_from_hf_state_dict(sd, c)
    layers = params["layers"]
    np.testing.assert_array_equal(
        layers["experts_gate"]["kernel"][1], want["gate_up_proj"][..., 0::2]
    )
    np.testing.assert_array_equal(
        layers["experts_up"]["kernel"][1], want["gate_up_proj"][..., 1::2]
    )
    np.testing.assert_array_equal(layers["experts_down"]["kernel"][1], want["down_proj"])
    sd["model.layers.1.mlp.experts.down_proj_scales"] = want["down_proj"]  # not uint8
    with pytest.raises(ModelLoadError, match="expected uint8"):
        interop.params_from_hf_state_dict(sd, c)


def test_unsupported_gpt_oss_features_fail_in_one_line(hf_and_loaded):
    _, loaded = hf_and_loaded
    d = interop.hf_config_dict(loaded.config)
    with pytest.raises(ModelLoadError, match="hidden_act"):
        interop.config_from_hf_dict({**d, "hidden_act": "gelu"})
    rope = {**d["rope_parameters"], "mscale": 1.0, "mscale_all_dim": 1.0}
    with pytest.raises(ModelLoadError, match="mscale"):
        interop.config_from_hf_dict({**d, "rope_parameters": rope})
    with pytest.raises(ModelLoadError, match="attention_sinks"):
        interop.hf_config_dict(dataclasses.replace(loaded.config, attention_sinks=False))


def test_a_directory_with_mxfp4_experts_loads_dequantised(tmp_path):
    """A Hugging Face directory laid out as the released ones (MXFP4 expert kernels in the
    safetensors, a ``quantization_config`` in config.json) loads through ``load_hf_dir``."""
    import json

    from safetensors.numpy import load_file, save_file

    c = M.ModelConfig.tiny("gpt_oss", hidden_size=64, intermediate_size=32)
    interop.export_hf(tmp_path, config=c, params=M.init_params(c, jax.random.PRNGKey(0)))
    (weights,) = tmp_path.glob("*.safetensors")
    sd = load_file(weights)
    rng = np.random.default_rng(2)
    want = {}
    for i in range(c.num_layers):
        for name, (d_out, d_in) in {"gate_up_proj": (64, 64), "down_proj": (64, 32)}.items():
            key = f"model.layers.{i}.mlp.experts.{name}"
            del sd[key]
            sd[key + "_blocks"] = rng.integers(0, 256, (8, d_out, d_in // 32, 16), dtype=np.uint8)
            sd[key + "_scales"] = rng.integers(122, 130, (8, d_out, d_in // 32), dtype=np.uint8)
            want[(i, name)] = dequantize_mxfp4(sd[key + "_blocks"], sd[key + "_scales"])
    save_file(sd, weights)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": []}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="MXFP4"):
        loaded = interop.load_hf_dir(tmp_path)
    assert loaded.config == c
    down = loaded.params["layers"]["experts_down"]["kernel"]
    for i in range(c.num_layers):
        np.testing.assert_array_equal(np.asarray(down[i]), want[(i, "down_proj")])

"""Qwen3.5 (text, hybrid Gated DeltaNet + gated full attention) against transformers on CPU in
float32: config and weight import, logits on a left-padded batch longer than the delta rule's
chunk, export back to a directory transformers loads with the same logits."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.models import Family, LayerType
from tests.interop._tiny import forward_logits, left_padded_batch, torch_logits

SIZES = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=4,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def tiny_qwen3_5(seed: int = 0, **overrides):
    """A random transformers Qwen3_5ForCausalLM: 3 linear layers then 1 full-attention layer.

    Every weight is re-drawn: the (1 + w) norms' w and the projections around 0 (N(0, 0.1²),
    N(0, 0.2²) for norms), the linear layers' plain-weight gated norm around 1, so that a
    mapping error in any tensor changes the logits."""
    cfg = transformers.Qwen3_5TextConfig(**{**SIZES, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    return _redraw(model, seed)


def _redraw(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def padded_batch(length=75, pads=(0, 5, 30), seed=0):
    return left_padded_batch(
        SIZES["vocab_size"], SIZES["pad_token_id"], length=length, pads=pads, seed=seed
    )


@pytest.fixture(scope="module")
def hf_and_loaded():
    hf = tiny_qwen3_5(seed=3)
    return hf, interop.from_hf_model(hf)


def test_config_maps_every_qwen3_5_field(hf_and_loaded):
    _, loaded = hf_and_loaded
    c = loaded.config
    assert c.family == Family.QWEN3_5
    assert c.layer_types == (LayerType.LINEAR,) * 3 + (LayerType.GLOBAL,)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (2, 4)
    assert (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel) == (8, 6, 4)
    assert c.partial_rotary_factor == 0.25 and c.rotary_dim == 4
    assert c.attn_output_gate and c.qk_norm and c.rms_norm_unit_offset
    assert c.num_params() == sum(p.numel() for p in hf_and_loaded[0].parameters())


def test_logits_match_transformers_on_a_left_padded_batch(hf_and_loaded):
    hf, loaded = hf_and_loaded
    toks, mask = padded_batch()
    assert toks.shape[1] > loaded.config.delta_chunk_size
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    assert np.abs(ref[mask]).max() > 0.5
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


def test_padding_does_not_change_a_row(hf_and_loaded):
    """A row's logits are the same alone and unpadded as left-padded in a batch, for several
    chunk sizes of the delta rule."""
    _, loaded = hf_and_loaded
    toks, mask = padded_batch()
    alone = forward_logits(loaded.params, loaded.config, toks[2:, 30:], mask[2:, 30:])
    for chunk in (64, 16, 7):
        config = dataclasses.replace(loaded.config, delta_chunk_size=chunk)
        got = forward_logits(loaded.params, config, toks, mask)
        np.testing.assert_allclose(got[2, 30:], alone[0], atol=1e-4, rtol=0)


def test_export_round_trip_gives_transformers_the_same_logits(hf_and_loaded, tmp_path):
    _, loaded = hf_and_loaded
    interop.export_hf(tmp_path, config=loaded.config, params=loaded.params)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    toks, mask = padded_batch(length=40, seed=1)
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
    assert d["model_type"] == "qwen3_5_text"
    assert interop.config_from_hf_dict(d) == loaded.config


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40)


def tiny_qwen3_5_moe(seed: int = 0):
    """A random transformers Qwen3_5MoeForCausalLM (8 experts, top-2, a shared expert)."""
    sizes = {k: v for k, v in SIZES.items() if k != "intermediate_size"}
    cfg = transformers.Qwen3_5MoeTextConfig(**sizes, **MOE, shared_expert_intermediate_size=56)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    return _redraw(model, seed)


def test_moe_logits_and_export_match_transformers(tmp_path):
    hf = tiny_qwen3_5_moe(seed=4)
    loaded = interop.from_hf_model(hf)
    c = loaded.config
    assert c.family == Family.QWEN3_5_MOE and c.is_hybrid and c.is_moe
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (8, 2, 40)
    assert c.shared_expert_size == 56 and c.norm_topk_prob
    assert c.num_params() == sum(p.numel() for p in hf.parameters())
    toks, mask = padded_batch()
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, c, toks, mask)
    assert np.abs(ref[mask]).max() > 0.5
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)
    # without the shared expert the logits differ: the parity above checks it
    no_shared = {**loaded.params, "layers": dict(loaded.params["layers"])}
    no_shared["layers"]["shared_expert_gate"] = {
        "kernel": jnp.full_like(loaded.params["layers"]["shared_expert_gate"]["kernel"], -1e4)
    }
    assert np.abs(forward_logits(no_shared, c, toks, mask) - got)[mask].max() > 1e-2

    interop.export_hf(tmp_path, config=c, params=loaded.params)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert type(back).__name__ == "Qwen3_5MoeForCausalLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ref_back = torch_logits(back.float().eval(), toks, mask, positions)
    np.testing.assert_allclose(got[mask], ref_back[mask], atol=1e-4, rtol=0)
    assert interop.config_from_hf_dict(interop.hf_config_dict(c)) == c


def test_an_irregular_layer_pattern_matches_transformers():
    """layer_types that repeat no shorter period (one period of five layers): each layer's
    weights and store are found by its rank among the layers of its kind."""
    types = [
        "linear_attention",
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ]
    hf = tiny_qwen3_5(seed=7, num_hidden_layers=5, layer_types=types)
    loaded = interop.from_hf_model(hf)
    assert [t.value for t in loaded.config.layer_types] == types
    toks, mask = padded_batch(length=40, seed=2)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


def test_the_multimodal_checkpoint_layout_imports_its_text_model(hf_and_loaded):
    """A Qwen3_5ForConditionalGeneration checkpoint: the text config nested under
    ``text_config``, weights under ``model.language_model.``, a vision tower and a
    multi-token-prediction head that are not ours."""
    hf, loaded = hf_and_loaded
    text = hf.config.to_dict()
    nested = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}
    nested["text_config"] = text
    config = interop.config_from_hf_dict(nested)
    assert config == loaded.config
    sd = {}
    for k, v in hf.state_dict().items():
        sd["model.language_model." + k[len("model.") :] if k.startswith("model.") else k] = v
    sd["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    sd["mtp.fc.weight"] = torch.zeros(3, 3)
    params = interop.params_from_hf_state_dict(sd, config)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

"""Gemma 4 (text) against transformers on CPU in float32: config and weight import (the
full-attention layers' own head dim and KV heads, values that are keys, proportional RoPE,
layer scalars), logits on a left-padded batch longer than the sliding window, export back to a
directory transformers loads with the same logits, and the features we refuse."""

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
from tests.interop._tiny import forward_logits, left_padded_batch, torch_logits

S, F = "sliding_attention", "full_attention"
SIZES = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=[S, S, F, S, F],
    sliding_window=5,
    hidden_size_per_layer_input=0,
    final_logit_softcapping=30.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
# k_eq_v: full-attention heads of E=24 with 1 KV head whose values are their keys,
# proportional RoPE on a quarter of their pairs (the 31B's shape, small).
# kv_shared: the last 2 layers share keys/values (E2B / E4B), with k_eq_v's heads.
# plain: every head alike (E=16, 2 KV heads), full-attention RoPE "default" with θ 5e4.
VARIANTS = {
    "k_eq_v": dict(
        global_head_dim=24,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        rope_parameters={
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
            S: {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    # E2B / E4B's KV sharing: layers 3 (sliding) and 4 (full) reuse the keys/values of layers
    # 1 and 2, and their MLP is twice as wide (160 against 80); with per-layer inputs, as
    # those models have (transformers 5.23's KV-shared forward also fails without them:
    # ``_maybe_slice_kv_shared_inputs`` slices ``per_layer_inputs`` even when None).
    "kv_shared": dict(
        global_head_dim=24,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=97,
    ),
    "plain": dict(
        global_head_dim=16,
        rope_parameters={
            F: {"rope_type": "default", "rope_theta": 5e4},
            S: {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


def tiny_gemma4(variant: str = "k_eq_v", seed: int = 0, **overrides):
    """A random transformers Gemma4ForCausalLM; every weight re-drawn (plain-weight norms and
    the router's scales around 1, projections N(0, 0.1²)) and the layer scalars around 1, so
    that a mapping error in any tensor changes the logits."""
    cfg = transformers.Gemma4TextConfig(**{**SIZES, **VARIANTS[variant], **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            scale_like = name.endswith(("norm.weight", "router.scale", "per_expert_scale"))
            p.copy_(1.0 + 0.2 * noise if scale_like else 0.1 * noise)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.3 * torch.randn(b.shape, generator=g))
    return model.eval()


def padded_batch(length=40, pads=(0, 5, 17), seed=0):
    return left_padded_batch(
        SIZES["vocab_size"], SIZES["pad_token_id"], length=length, pads=pads, seed=seed
    )


def _hf_size(hf) -> int:
    """transformers' parameters plus the layer-scalar buffers (ours are parameters)."""
    scalars = sum(b.numel() for n, b in hf.named_buffers() if n.endswith("layer_scalar"))
    return sum(p.numel() for p in hf.parameters()) + scalars


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_and_loaded(request):
    hf = tiny_gemma4(request.param, seed=3)
    return request.param, hf, interop.from_hf_model(hf)


def test_config_maps_every_gemma4_field(hf_and_loaded):
    variant, hf, loaded = hf_and_loaded
    c = loaded.config
    assert c.family == Family.GEMMA4
    assert [t.value for t in c.layer_types] == SIZES["layer_types"]
    assert c.sliding_window == 5 and c.final_logit_softcap == 30.0
    assert c.value_norm and c.layer_scalars and c.qk_norm and not c.rms_norm_unit_offset
    assert c.query_pre_attn_scalar == 1.0 and c.tie_embeddings
    if variant == "kv_shared":
        assert c.kv_shared_layers == 2 and c.double_wide_mlp and c.intermediate_size == 160
        assert [c.mlp_width(i) for i in range(5)] == [80, 80, 80, 160, 160]
    else:
        assert not c.kv_shared_layers and not c.double_wide_mlp
    if variant in ("k_eq_v", "kv_shared"):
        assert c.layer_heads(2) == (1, 24) and c.layer_heads(0) == (2, 16)
        assert c.global_k_eq_v and c.global_rope_proportion == 0.25
        assert (c.store_kv_heads, c.store_head_dim) == (2, 24) and c.has_padded_heads
    else:
        assert not c.has_padded_heads and not c.global_k_eq_v
        assert (c.rope_theta, c.rope_local_theta) == (5e4, 1e4)
    assert c.num_params() == _hf_size(hf)


def test_logits_match_transformers_on_a_left_padded_batch(hf_and_loaded):
    _, hf, loaded = hf_and_loaded
    toks, mask = padded_batch()
    assert mask.sum(1).min() > 4 * loaded.config.sliding_window
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    assert np.abs(ref[mask]).max() > 0.5
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


def test_padding_does_not_change_a_row(hf_and_loaded):
    _, _, loaded = hf_and_loaded
    toks, mask = padded_batch()
    alone = forward_logits(loaded.params, loaded.config, toks[2:, 17:], mask[2:, 17:])
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    np.testing.assert_allclose(got[2, 17:], alone[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "field,plain",
    [("global_rope_proportion", 1.0), ("value_norm", False), ("layer_scalars", False)],
)
def test_each_gemma4_feature_changes_the_logits(field, plain):
    """Dropping a feature changes the logits, so the parity above really checks it."""
    loaded = interop.from_hf_model(tiny_gemma4("k_eq_v", seed=3))
    toks, mask = padded_batch(length=24)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    without = dataclasses.replace(loaded.config, **{field: plain})
    assert np.abs(forward_logits(loaded.params, without, toks, mask) - got)[mask].max() > 1e-2


def test_kv_sharing_changes_the_logits():
    """The shared layers' keys/values come from their source layers: computing them from the
    (zero) k/v weights of the shared layers instead changes the logits."""
    loaded = interop.from_hf_model(tiny_gemma4("kv_shared", seed=3))
    toks, mask = padded_batch(length=24)
    got = forward_logits(loaded.params, loaded.config, toks, mask)
    without = dataclasses.replace(loaded.config, kv_shared_layers=0, double_wide_mlp=False)
    assert np.abs(forward_logits(loaded.params, without, toks, mask) - got)[mask].max() > 1e-2


def test_export_round_trip_gives_transformers_the_same_logits(hf_and_loaded, tmp_path):
    _, _, loaded = hf_and_loaded
    interop.export_hf(tmp_path, config=loaded.config, params=loaded.params)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == "Gemma4ForCausalLM"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
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
    _, _, loaded = hf_and_loaded
    d = interop.hf_config_dict(loaded.config)
    assert d["model_type"] == "gemma4_text"
    assert interop.config_from_hf_dict(d) == loaded.config


def test_published_config_keys_and_the_multimodal_nesting_read_the_same():
    """A ``config.json`` as published (``global_head_dim``, ``num_global_key_value_heads``,
    no ``per_layer_config``), nested in a multimodal ``gemma4`` config, reads as
    transformers' own ``to_dict()``."""
    hf = tiny_gemma4("k_eq_v")
    want = interop.config_from_hf_dict(hf.config.to_dict())
    flat = {**SIZES, **VARIANTS["k_eq_v"], "model_type": "gemma4_text"}
    nested = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]}
    nested["text_config"] = flat
    assert interop.config_from_hf_dict(nested) == want
    assert want.layer_types[-1] == LayerType.GLOBAL


MOE = dict(enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=40)
PLE = dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=89)


def test_per_layer_inputs_match_transformers_and_export(tmp_path):
    """Per-layer inputs (E2B / E4B) from an embedding of 89 rows (< the vocab: tokens past it
    are not drawn here), P = 8."""
    hf = tiny_gemma4("k_eq_v", seed=6, **PLE)
    loaded = interop.from_hf_model(hf)
    c = loaded.config
    assert (c.per_layer_input_size, c.per_layer_vocab) == (8, 89)
    assert c.num_params() == _hf_size(hf)
    toks, mask = padded_batch()
    toks = np.where(mask, toks % 89, toks)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = forward_logits(loaded.params, c, toks, mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)
    without = dataclasses.replace(c, per_layer_input_size=0, per_layer_vocab_size=None)
    bare = {k: v for k, v in loaded.params.items() if "per_layer" not in k}
    bare["layers"] = {k: v for k, v in bare["layers"].items() if "per_layer" not in k}
    assert np.abs(forward_logits(bare, without, toks, mask) - got)[mask].max() > 1e-2
    interop.export_hf(tmp_path, config=c, params=loaded.params)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ref_back = torch_logits(back.float().eval(), toks, mask, positions)
    np.testing.assert_allclose(got[mask], ref_back[mask], atol=1e-4, rtol=0)
    assert interop.config_from_hf_dict(interop.hf_config_dict(c)) == c


def test_moe_beside_the_mlp_matches_transformers_and_exports(tmp_path):
    """The 26B-A4B's block: a dense MLP and 8 GeGLU experts (top-2) side by side."""
    hf = tiny_gemma4("k_eq_v", seed=4, **MOE)
    loaded = interop.from_hf_model(hf)
    c = loaded.config
    assert c.moe_beside_mlp and c.is_moe and (c.num_experts, c.num_experts_per_tok) == (8, 2)
    assert c.moe_intermediate_size == 40 and c.intermediate_size == 80
    assert c.num_params() == _hf_size(hf)
    toks, mask = padded_batch()
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    for dispatch in ("sorted", "dense"):
        got = forward_logits(
            loaded.params, dataclasses.replace(c, moe_dispatch=dispatch), toks, mask
        )
        np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)
    interop.export_hf(tmp_path, config=c, params=loaded.params)
    back, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ref_back = torch_logits(back.float().eval(), toks, mask, positions)
    np.testing.assert_allclose(got[mask], ref_back[mask], atol=1e-4, rtol=0)
    assert interop.config_from_hf_dict(interop.hf_config_dict(c)) == c


def test_peft_export_of_padded_attention_adapters_is_refused(tmp_path):
    """transformers' per-layer shapes differ from our padded ones: refused, MLP adapters not."""
    config = M.ModelConfig.tiny("gemma4_text")
    mlp = M.LoRAConfig(rank=2, targets=("gate_proj", "down_proj"))
    adapters = M.init_lora(config, mlp, jax.random.PRNGKey(0))
    kw = dict(config=config, base_model=None)
    assert interop.export_peft_adapter(tmp_path / "mlp", adapters=adapters, lora=mlp, **kw)
    attn = M.LoRAConfig(rank=2, targets=("q_proj", "v_proj"))
    adapters = M.init_lora(config, attn, jax.random.PRNGKey(0))
    with pytest.raises(ModelLoadError, match="two sizes"):
        interop.export_peft_adapter(tmp_path / "attn", adapters=adapters, lora=attn, **kw)
    wide = M.ModelConfig.tiny(
        "gemma4_text",
        layer_types=("sliding_attention", "full_attention") * 2,
        kv_shared_layers=2,
        double_wide_mlp=True,
        intermediate_size=160,
    )
    adapters = M.init_lora(wide, mlp, jax.random.PRNGKey(0))
    with pytest.raises(ModelLoadError, match="two widths"):
        interop.export_peft_adapter(
            tmp_path / "wide", adapters=adapters, lora=mlp, config=wide, base_model=None
        )


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("num_kv_shared_layers", 5, "kv_shared_layers"),
        ("use_bidirectional_attention", "all", "bidirectional"),
    ],
)
def test_unsupported_features_are_refused_naming_them(key, value, named):
    d = {**SIZES, **VARIANTS["k_eq_v"], "model_type": "gemma4_text", key: value}
    with pytest.raises(ModelLoadError, match=named):
        interop.config_from_hf_dict(d, source="cfg")

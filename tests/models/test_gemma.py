"""Gemma 2 / Gemma 3 (text) in jaxrl_llm.models against transformers, on tiny random models.

The tiny models have 3 layers (local, global, local), a window of 4 positions, sequences of 13
tokens with a row left-padded by 5, and ``query_pre_attn_scalar`` ≠ head_dim, so every Gemma
feature (window, per-layer RoPE base, soft caps, pre/post norms, (1 + w) RMSNorm, √D embedding
scale, GeGLU, query scaling) changes the logits that are compared.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.models import Family, LayerType
from jaxrl_llm.sampling import SamplingConfig, generate
from tests.interop._tiny import SIZES, randomize_, tiny_tokenizer, torch_logits

WINDOW = 4
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
HF_CONFIGS = {
    "gemma2": lambda: transformers.Gemma2Config(
        **{**SIZES, "num_hidden_layers": 3},
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,
        layer_types=LAYER_TYPES,
    ),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **{**SIZES, "num_hidden_layers": 3},
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,
        layer_types=LAYER_TYPES,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


def tiny_gemma(variant: str, seed: int = 3):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[variant]())
    return randomize_(model, seed)


def tokens_and_mask(seed=0, batch=2, length=13, pad=5):
    rng = np.random.RandomState(seed)
    toks = rng.randint(3, SIZES["vocab_size"], (batch, length))
    mask = np.ones((batch, length), bool)
    mask[-1, :pad] = False
    toks[~mask] = SIZES["pad_token_id"]
    return toks, mask


def ours(params, config, toks, mask):
    logits, _ = M.forward(
        params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask)
    )
    return np.asarray(logits)


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def pair(request):
    hf = tiny_gemma(request.param)
    return request.param, hf, interop.from_hf_model(hf)


def test_config_reads_every_gemma_feature(pair):
    variant, _, loaded = pair
    c = loaded.config
    assert c.family == (Family.GEMMA2 if variant == "gemma2" else Family.GEMMA3)
    assert c.layer_types == (LayerType.LOCAL, LayerType.GLOBAL, LayerType.LOCAL)
    assert c.sliding_window == WINDOW and c.query_pre_attn_scalar == 24
    assert c.rms_norm_unit_offset and c.post_norms and c.scale_embeddings and c.tie_embeddings
    assert c.mlp_activation == M.Activation.GELU_TANH
    if variant == "gemma2":
        assert (c.attn_logit_softcap, c.final_logit_softcap) == (50.0, 30.0) and not c.qk_norm
        assert c.rope_local_theta is None
    else:
        assert (c.attn_logit_softcap, c.final_logit_softcap) == (None, None) and c.qk_norm
        assert (c.rope_theta, c.rope_local_theta) == (1e6, 1e4)


def test_logits_match_transformers_with_left_padding_past_the_window(pair):
    _, hf, loaded = pair
    toks, mask = tokens_and_mask(seed=1)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = ours(loaded.params, loaded.config, toks, mask)
    assert toks.shape[1] > 3 * WINDOW and np.abs(ref[mask]).max() > 0.5
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "change",
    [
        {"layer_types": (LayerType.GLOBAL,) * 3},  # the window of the local layers
        {"layer_types": (LayerType.LOCAL,) * 3},  # the global layer sees past the window
        {"rope_local_theta": 5e5},  # the local RoPE base (Gemma 2: only rope_theta)
        {"query_pre_attn_scalar": None},
        {"scale_embeddings": False},
        {"post_norms": False},
    ],
    ids=lambda d: next(iter(d)),
)
def test_each_feature_changes_the_logits(pair, change):
    """So the parity test above really checks each of them."""
    _, _, loaded = pair
    params = loaded.params
    if "post_norms" in change:
        params = {
            **params,
            "layers": {
                k: v
                for k, v in params["layers"].items()
                if k not in ("post_attn_norm", "post_mlp_norm")
            },
        }
    toks, mask = tokens_and_mask(seed=1)
    base = ours(loaded.params, loaded.config, toks, mask)
    other = ours(params, dataclasses.replace(loaded.config, **change), toks, mask)
    assert np.abs(base - other)[mask].max() > 1e-3


def test_soft_caps_are_applied():
    hf = tiny_gemma("gemma2")
    c = interop.from_hf_model(hf).config
    params = interop.from_hf_model(hf).params
    toks, mask = tokens_and_mask(seed=1)
    capped = ours(params, c, toks, mask)
    assert np.abs(capped).max() < 30.0
    for field in ("attn_logit_softcap", "final_logit_softcap"):
        loose = ours(params, dataclasses.replace(c, **{field: None}), toks, mask)
        assert np.abs(capped - loose)[mask].max() > 1e-4, field


@pytest.mark.parametrize("family", [Family.GEMMA2, Family.GEMMA3])
def test_blockwise_attention_with_per_layer_windows_matches_naive(family):
    """The traced per-layer window goes through the blockwise path's custom VJP: forward and
    gradient equal the naive path's."""
    c = M.ModelConfig.tiny(family, attention=M.AttentionImpl.NAIVE)
    params = M.init_params(c, jax.random.PRNGKey(0))
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
    )
    toks, mask = tokens_and_mask(seed=4, length=21)
    cb = dataclasses.replace(c, attention=M.AttentionImpl.BLOCKWISE)

    def loss(p, config):
        logits, _ = M.forward(p, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
        return jnp.sum(jnp.where(jnp.asarray(mask)[..., None], jax.nn.log_softmax(logits), 0.0))

    (l_n, g_n), (l_b, g_b) = (jax.value_and_grad(loss)(params, x) for x in (c, cb))
    np.testing.assert_allclose(l_b, l_n, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_b), jax.tree.leaves(g_n)):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-3)


def test_kv_cache_decode_equals_full_forward(pair):
    """Prefill 3 tokens, then decode one at a time well past the window: same logits."""
    _, _, loaded = pair
    c, params = loaded.config, loaded.params
    toks, mask = tokens_and_mask(seed=2)
    full = ours(params, c, toks, mask)
    pos = M.default_positions(jnp.asarray(mask))
    step = jax.jit(
        lambda x, m, p, cache: M.forward(
            params, x, config=c, attention_mask=m, positions=p, cache=cache
        )
    )
    cache = M.init_cache(c, 2, 16)
    out, cache = step(jnp.asarray(toks[:, :3]), jnp.asarray(mask[:, :3]), pos[:, :3], cache)
    outs = [out]
    for i in range(3, toks.shape[1]):
        sl = slice(i, i + 1)
        out, cache = step(jnp.asarray(toks[:, sl]), jnp.asarray(mask[:, sl]), pos[:, sl], cache)
        outs.append(out)
    inc = np.asarray(jnp.concatenate(outs, axis=1))
    np.testing.assert_allclose(inc[mask], full[mask], atol=2e-5, rtol=0)


def test_greedy_sampling_follows_the_full_forward_argmax(pair):
    """Greedy decode (prefill + while_loop decode with the dense cache) picks, at every step,
    the argmax of a full forward over the prompt and the tokens chosen so far."""
    _, _, loaded = pair
    c, params = loaded.config, loaded.params
    prompts = [[5, 17, 33, 41, 8, 9, 60], [70, 3, 12]]
    n_new = 8
    out = generate(params, c, prompts, sampling=SamplingConfig(greedy=True), max_new_tokens=n_new)
    for i, prompt in enumerate(prompts):
        seq = list(prompt)
        for _ in range(n_new):
            logits = ours(params, c, np.asarray([seq]), np.ones((1, len(seq)), bool))
            seq.append(int(logits[0, -1].argmax()))
        got = np.asarray(out.tokens[i, : int(out.lengths[i])]).tolist()
        assert got == seq[len(prompt) : len(prompt) + len(got)] and len(got) >= 1
        assert len(seq) > WINDOW + len(prompt)


def test_shared_prefix_trunk_equals_plain_trunk():
    c = M.ModelConfig.tiny(Family.GEMMA3)
    params = M.init_params(c, jax.random.PRNGKey(1))
    rng = np.random.RandomState(0)
    prompt = rng.randint(3, 97, (1, 7))
    toks = np.concatenate([np.repeat(prompt, 2, 0), rng.randint(3, 97, (2, 6))], axis=1)
    plain, _ = M.trunk(params, jnp.asarray(toks), config=c)
    shared = M.trunk_shared_prefix(params, jnp.asarray(toks), config=c, prefix_len=7, group_size=2)
    np.testing.assert_allclose(np.asarray(shared), np.asarray(plain), atol=1e-5, rtol=0)


def test_layer_helpers_need_the_layer_index_for_per_layer_types():
    c = M.ModelConfig.tiny(Family.GEMMA3)
    params = M.init_params(c, jax.random.PRNGKey(1))
    lp = jax.tree.map(lambda x: x[0], params["layers"])
    x = jnp.zeros((1, 2, c.hidden_size))
    info = M.TokenInfo(jnp.zeros((1, 2), jnp.int32), M.rope_inv_freq(c))
    with pytest.raises(ValueError, match="layer index"):
        M.project_qkv(c, lp, x, info)
    np.testing.assert_array_equal(M.layer_windows(c), [WINDOW, M.NO_WINDOW, WINDOW])
    inv = np.asarray(M.layer_rope_inv_freq(c))
    assert inv.shape == (3, c.head_dim // 2) and inv[0, 1] > inv[1, 1]  # 1e4 vs 1e6 base
    assert M.layer_windows(M.ModelConfig.tiny()) is None


@pytest.mark.parametrize("variant", sorted(HF_CONFIGS))
def test_export_loads_in_transformers_with_identical_logits(tmp_path, variant):
    config = interop.from_hf_model(tiny_gemma(variant)).config
    params = M.init_params(config, jax.random.PRNGKey(11))
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
    )  # norm weights away from 0
    interop.export_hf(tmp_path, config=config, params=params, tokenizer=tiny_tokenizer())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [M.HF_ARCHITECTURES[config.family][0]]
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == cfg["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    toks, mask = tokens_and_mask(seed=3)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf.eval(), toks, mask, positions)
    np.testing.assert_allclose(ours(params, config, toks, mask)[mask], ref[mask], atol=1e-4)
    again = interop.load_model(tmp_path)
    assert again.config == config
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_multimodal_gemma3_config_and_weight_names_give_the_text_decoder():
    hf = tiny_gemma("gemma3")
    text = hf.config.to_dict()
    outer = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]}
    config = interop.config_from_hf_dict({**outer, "text_config": text})
    assert config == interop.from_hf_model(hf).config
    sd = {k.replace("model.", "model.language_model.", 1): v for k, v in hf.state_dict().items()}
    sd["model.vision_tower.patch.weight"] = torch.zeros(2)
    params = interop.params_from_hf_state_dict(sd, config)
    want = interop.from_hf_model(hf).params
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

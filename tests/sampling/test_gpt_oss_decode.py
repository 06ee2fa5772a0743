"""Both engines on a tiny random gpt-oss (attention sinks, sliding and full attention
alternating, YaRN, biased router and experts with the clamped SwiGLU): greedy continuations
equal transformers' ``generate`` token for token on a left-padded batch longer than the
sliding window, through the static and the paged engine, and prefill then decode steps give
the whole forward's logits."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.sampling import SamplingConfig, generate, generate_paged
from tests.interop._tiny import hf_greedy
from tests.interop.test_gpt_oss import tiny_gpt_oss

GREEDY = SamplingConfig(greedy=True, temperature=1.0)
RNG = np.random.default_rng(0)
# prompts longer and shorter than the window (5)
PROMPTS = [RNG.integers(3, 96, size=int(n)).tolist() for n in (19, 4, 11)]
NEW = 12


@pytest.fixture(scope="module")
def hf_and_loaded():
    hf = tiny_gpt_oss(seed=8)  # seeds 3-7 and 9 greedily repeat one or two tokens a row
    return hf, interop.from_hf_model(hf)


def test_greedy_generation_of_both_engines_equals_transformers_generate(hf_and_loaded):
    hf, loaded = hf_and_loaded
    config = dataclasses.replace(loaded.config, eos_token_ids=())
    ref = hf_greedy(hf, PROMPTS, NEW)
    assert ref.shape == (3, NEW)
    assert all(len(set(row)) >= 3 for row in ref.tolist())  # not a degenerate repetition
    static = generate(
        loaded.params, config, PROMPTS, sampling=GREEDY, num_samples=1, max_new_tokens=NEW
    )
    np.testing.assert_array_equal(np.asarray(static.tokens), ref)
    paged = generate_paged(
        loaded.params,
        config,
        PROMPTS,
        sampling=GREEDY,
        num_samples=1,
        max_new_tokens=NEW,
        num_slots=2,
        page_size=4,
        chunk_steps=3,
    )
    np.testing.assert_array_equal(np.asarray(paged.tokens), ref)
    np.testing.assert_allclose(
        np.asarray(paged.logprobs), np.asarray(static.logprobs), atol=1e-5, rtol=0
    )


def test_prefill_then_steps_equal_the_whole_forward():
    config = M.ModelConfig.tiny("gpt_oss")
    params = M.init_params(config, jax.random.PRNGKey(1))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 3 else x, params)
    layers = dict(params["layers"])
    layers["sinks"] = {"logit": jax.random.normal(jax.random.PRNGKey(3), (4, 3))}
    params = {**params, "layers": layers}
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 21), 3, 97)
    mask = jnp.ones((2, 21), bool).at[1, :6].set(False)
    full, _ = M.forward(params, toks, config=config, attention_mask=mask)
    pos = M.default_positions(mask)
    cache = M.init_cache(config, 2, 21)
    logits, cache = M.forward(
        params,
        toks[:, :15],
        config=config,
        positions=pos[:, :15],
        attention_mask=mask[:, :15],
        cache=cache,
    )
    steps = [logits]
    for t in range(15, 21):
        logits, cache = M.forward(
            params,
            toks[:, t : t + 1],
            config=config,
            positions=pos[:, t : t + 1],
            attention_mask=mask[:, t : t + 1],
            cache=cache,
        )
        steps.append(logits)
    got = jnp.concatenate(steps, axis=1)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(full)[real], atol=1e-5)

"""The paged continuous-batching engine on other model families (tiny random models): a
sliding-window model equals the static engine; Gemma 2 / 3 / 4 (per-layer windows and RoPE
bases, soft caps; Gemma 4's heads of two sizes) equal the trainer's teacher-forced forward, and
the static engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig, forward, init_params
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import SamplingConfig, generate, generate_paged

GREEDY = SamplingConfig(greedy=True, temperature=0.7)
SAMPLED = SamplingConfig(temperature=0.7, top_k=40)
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(1, 96, size=int(n)).tolist() for n in (3, 11, 1, 7)]


def test_sliding_window_model_equals_static_engine():
    """Mistral's local attention (window 5 < the rows' lengths) over pages, with refills."""
    config = ModelConfig.tiny("mistral", sliding_window=5, eos_token_ids=(96,), pad_token_id=0)
    p = init_params(config, jax.random.PRNGKey(0))
    p = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)
    a = generate(p, config, PROMPTS, sampling=SAMPLED, num_samples=2, max_new_tokens=14)
    b = generate_paged(
        p,
        config,
        PROMPTS,
        sampling=SAMPLED,
        num_samples=2,
        max_new_tokens=14,
        num_slots=4,
        page_size=4,
        chunk_steps=3,
    )
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "gemma4_text"])
def test_gemma_through_pages_equals_the_trainer(family):
    """Gemma's per-layer windows and RoPE bases, post-norms, scaled embeddings and (Gemma 2)
    soft caps through the paged engine: greedy tokens are the argmax of the trainer's
    teacher-forced logits and the log-probs equal its log-probs, with refills; the static
    engine gives the same rows."""
    config = ModelConfig.tiny(family, eos_token_ids=(96,), pad_token_id=0)
    p = init_params(config, jax.random.PRNGKey(0))
    # weights x4, not the norms' (Gemma 2 / 3's are 0 anyway; Gemma 4's plain ones x4 would
    # make its unscaled attention scores 16x larger and the log-probs' rounding 1e-5)
    p = jax.tree_util.tree_map_with_path(
        lambda path, x: x if x.ndim < 2 or "norm" in jax.tree_util.keystr(path) else x * 4.0, p
    )
    out = generate_paged(
        p,
        config,
        PROMPTS,
        sampling=GREEDY,
        num_samples=2,
        max_new_tokens=12,
        num_slots=4,
        page_size=4,
        chunk_steps=3,
    )
    tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
    logits, _ = forward(p, tokens, config=config, attention_mask=mask)
    logits = logits[:, out.prompt_tokens.shape[1] - 1 : -1]
    m = np.asarray(out.mask) > 0
    np.testing.assert_array_equal(np.asarray(out.tokens)[m], np.asarray(logits.argmax(-1))[m])
    lp = token_logprobs(logits, out.tokens, temperature=0.7)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(lp)[m], atol=1e-5)
    # the static engine (Gemma 2's final soft cap included) samples the same rows
    ref = generate(p, config, PROMPTS, sampling=GREEDY, num_samples=2, max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(ref.tokens)[m], np.asarray(out.tokens)[m])
    np.testing.assert_allclose(np.asarray(ref.logprobs)[m], np.asarray(lp)[m], atol=1e-5)

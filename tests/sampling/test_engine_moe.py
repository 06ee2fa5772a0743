"""Sampling a mixture-of-experts model (tiny Qwen3-MoE, 8 experts, top-2) with both engines: the
paged engine's greedy tokens are the argmax of the trainer's teacher-forced logits and its
log-probs the trainer's, with refills; the static engine samples the same rows."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import ModelConfig, forward, init_params
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import SamplingConfig, generate, generate_paged

GREEDY = SamplingConfig(greedy=True, temperature=0.7)
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(1, 96, size=int(n)).tolist() for n in (3, 11, 1, 7)]


def test_moe_model_samples_through_both_engines():
    config = ModelConfig.tiny("qwen3_moe", eos_token_ids=(96,), pad_token_id=0)
    p = init_params(config, jax.random.PRNGKey(0))
    p = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)
    out = generate_paged(
        p,
        config,
        PROMPTS,
        sampling=GREEDY,
        num_samples=2,
        max_new_tokens=10,
        num_slots=4,
        page_size=4,
        chunk_steps=3,
    )
    tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
    logits, _ = jax.jit(forward, static_argnames=("config",))(
        p, tokens, config=config, attention_mask=mask
    )
    logits = logits[:, out.prompt_tokens.shape[1] - 1 : -1]
    m = np.asarray(out.mask) > 0
    assert m.sum() > len(PROMPTS) * 2  # rows ran for more than one step
    np.testing.assert_array_equal(np.asarray(out.tokens)[m], np.asarray(logits.argmax(-1))[m])
    lp = token_logprobs(logits, out.tokens, temperature=0.7)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(lp)[m], atol=1e-5)
    ref = generate(p, config, PROMPTS, sampling=GREEDY, num_samples=2, max_new_tokens=10)
    np.testing.assert_array_equal(np.asarray(ref.tokens)[m], np.asarray(out.tokens)[m])
    np.testing.assert_allclose(np.asarray(ref.logprobs)[m], np.asarray(lp)[m], atol=1e-5)

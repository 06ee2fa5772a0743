"""Both engines on a hybrid Qwen3.5 model. Static: prefill writes the Gated DeltaNet layers'
conv windows and delta-rule states beside the KV cache, each decode step updates them; greedy
continuations equal transformers' ``generate`` token for token on a left-padded batch, and the
sampled log-probs equal the trainer's teacher-forced ones. Paged: each slot's row carries its
state (refills, multi-turn extension) and the engine equals the static one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import PagedEngine, SamplingConfig, generate, generate_paged
from tests.interop._tiny import hf_greedy
from tests.interop.test_qwen3_5 import tiny_qwen3_5, tiny_qwen3_5_moe

GREEDY = SamplingConfig(greedy=True, temperature=1.0)
RNG = np.random.default_rng(0)
# One prompt longer than the delta rule's chunk (64), so prefill runs the chunked form.
PROMPTS = [RNG.integers(3, 96, size=int(n)).tolist() for n in (70, 9, 23)]
NEW = 12


def test_prefill_then_steps_equal_the_whole_forward():
    """A prompt prefilled into the cache then fed one token at a time gives the logits of one
    forward over the whole sequence (the conv window and delta-rule state carried per layer)."""
    config = M.ModelConfig.tiny("qwen3_5_text", delta_chunk_size=8)
    params = M.init_params(config, jax.random.PRNGKey(1))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 3 else x, params)
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
    assert cache.conv.shape == (3, 2, 3, config.linear_conv_channels)
    assert cache.k.shape[0] == 1  # one full-attention layer keeps keys


@pytest.mark.parametrize("make", [tiny_qwen3_5, tiny_qwen3_5_moe], ids=["dense", "moe"])
def test_greedy_generation_equals_transformers_generate(make):
    hf = make(seed=5)
    loaded = interop.from_hf_model(hf)
    config = dataclasses.replace(loaded.config, eos_token_ids=())
    out = generate(
        loaded.params, config, PROMPTS, sampling=GREEDY, num_samples=1, max_new_tokens=NEW
    )
    ref = hf_greedy(hf, PROMPTS, NEW)
    assert ref.shape == (3, NEW)
    assert all(len(set(row)) >= 4 for row in ref.tolist())  # not a degenerate repetition
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)


def test_sampled_logprobs_equal_the_trainers():
    """Sampled (not greedy) rows, G = 2 per prompt: the engine's log-probs are the trainer's
    teacher-forced log-probs of the same tokens."""
    hf = tiny_qwen3_5(seed=6)
    loaded = interop.from_hf_model(hf)
    config = dataclasses.replace(loaded.config, eos_token_ids=(96,))
    sampling = SamplingConfig(temperature=0.8, top_k=40)
    out = generate(
        loaded.params, config, PROMPTS, sampling=sampling, num_samples=2, max_new_tokens=NEW
    )
    tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
    logits, _ = M.forward(loaded.params, tokens, config=config, attention_mask=mask)
    logits = logits[:, out.prompt_tokens.shape[1] - 1 : -1]
    lp = token_logprobs(logits, out.tokens, temperature=0.8)
    m = np.asarray(out.mask) > 0
    assert m.sum() > 20
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(lp)[m], atol=1e-4)


# ----- the paged engine: each slot's row keeps its recurrent state ----------------------------

HYBRID = M.ModelConfig.tiny("qwen3_5_text", eos_token_ids=(96,), pad_token_id=0, delta_chunk_size=4)
MANY = [RNG.integers(1, 96, size=int(n)).tolist() for n in (3, 11, 1, 7, 14, 5, 9)]


@pytest.fixture(scope="module")
def hybrid_params():
    p = M.init_params(HYBRID, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 3 else x, p)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=0.7, top_k=40)])
def test_paged_engine_equals_the_static_engine_with_refills(hybrid_params, sampling):
    """7 prompts x 2 samples through 4 slots (refills into slots whose previous row left its
    state behind): tokens and log-probs equal the static engine's, row for row."""
    kw = dict(sampling=sampling, num_samples=2, max_new_tokens=12)
    a = generate(hybrid_params, HYBRID, MANY, **kw)
    b = generate_paged(hybrid_params, HYBRID, MANY, **kw, num_slots=4, page_size=4, chunk_steps=3)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    assert len(set(np.asarray(a.tokens)[:, 0].tolist())) > 1  # not one repeated token


def test_paged_multi_turn_continuation_equals_prefilling_the_conversation(hybrid_params):
    """A kept row's recurrent state outlives its slot: the appended tokens continue it (padded
    to a bucket: the padding leaves it unchanged) and the next turn equals greedy decoding
    from the whole conversation prefilled."""
    eng = PagedEngine(
        hybrid_params,
        HYBRID,
        sampling=GREEDY,
        seed=3,
        num_slots=2,
        page_size=4,
        max_len=48,
        gen_len=16,
        chunk_steps=3,
    )
    (a,) = eng.submit(MANY[1], prompt_id=0, max_new_tokens=5, keep=True)
    (b,) = eng.submit(MANY[3], prompt_id=1, max_new_tokens=4, keep=True)
    (c,) = eng.submit(MANY[4], prompt_id=2, max_new_tokens=6)  # takes a freed slot
    eng.run()
    reply = [7, 8, 9, 10, 11, 12, 13]
    logits = eng.extend(a, reply, max_new_tokens=6)
    convo = MANY[1] + eng.rows[a].tokens
    ref, _ = M.forward(hybrid_params, jnp.asarray([convo]), config=HYBRID)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref[0, -1]), atol=1e-4, rtol=0)
    eng.extend(b, reply[:2], max_new_tokens=3)
    rows = eng.run()
    for r, n_first, n_reply, turn in ((a, 5, 7, 6), (b, 4, 2, 3)):
        row = rows[r]
        assert row.mask == [1] * n_first + [0] * n_reply + [1] * turn
        prefix = (MANY[1] if r == a else MANY[3]) + row.tokens[: n_first + n_reply]
        want = generate(hybrid_params, HYBRID, [prefix], sampling=GREEDY, max_new_tokens=turn)
        assert row.tokens[n_first + n_reply :] == np.asarray(want.tokens[0]).tolist()
        np.testing.assert_allclose(row.logprobs[n_first + n_reply :], want.logprobs[0], atol=1e-4)
        eng.release(r)
    assert rows[c].done

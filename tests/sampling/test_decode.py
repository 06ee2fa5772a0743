"""Tests of jaxrl_llm/sampling/decode.py on a tiny random model: exact log-probs, greedy
consistency, stop tokens, prefix sharing, per-row keys, bucketing, sampling frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.models import ModelConfig, forward, init_params
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import (
    Rollout,
    SamplingConfig,
    decode,
    generate,
    init_decode_state,
    pad_prompts,
    prefill,
    row_keys,
    trace_counts,
)

CONFIG = ModelConfig.tiny(eos_token_ids=(96,), pad_token_id=0)
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 30, 8, 1], [60], [7, 7, 7, 7, 7]]
SAMPLED = SamplingConfig(temperature=0.7, top_k=40)
GREEDY = SamplingConfig(greedy=True, temperature=0.7)


@pytest.fixture(scope="module")
def params():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    # Sharper logits than the 0.02-std init so greedy / sampling are far from uniform.
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)


def teacher_forced_logprobs(params, out: Rollout, temperature):
    tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
    logits, _ = forward(params, tokens, config=CONFIG, attention_mask=mask)
    p = out.prompt_tokens.shape[1]
    logits = logits[:, p - 1 : -1]
    return logits, token_logprobs(logits, out.tokens, temperature=temperature)


def test_logprobs_equal_teacher_forced_logprobs(params):
    out = generate(
        params, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=2, seed=1, max_new_tokens=16
    )
    assert out.tokens.shape == (8, 16) and out.prompt_tokens.shape == (8, 16)
    _, lp = teacher_forced_logprobs(params, out, 0.7)
    mask = np.asarray(out.mask) > 0
    assert mask.sum() > 40
    np.testing.assert_array_equal(np.asarray(out.lengths), mask.sum(-1))
    np.testing.assert_allclose(np.asarray(out.logprobs)[mask], np.asarray(lp)[mask], atol=1e-4)
    assert np.all(np.asarray(out.logprobs)[~mask] == 0.0)
    # samples of one group differ (it is sampling, not greedy)
    assert not np.array_equal(out.tokens[0], out.tokens[1])


def test_layered_cache_samples_what_the_stacked_cache_samples(params, monkeypatch):
    """The static engine's layered KV cache (one buffer per layer, unrolled layers: what it
    runs on TPU and GPU) samples the same tokens and log-probs as the stacked one (CPU)."""
    import importlib

    decode_module = importlib.import_module("jaxrl_llm.sampling.decode")  # not the function

    def run():
        return generate(
            params, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=2, seed=3, max_new_tokens=8
        )

    stacked = run()
    monkeypatch.setattr(decode_module, "use_layered_cache", lambda config: True)
    jax.clear_caches()  # prefill traces again, now with the layered cache
    before = trace_counts()["prefill"]
    layered = run()
    assert trace_counts()["prefill"] == before + 1
    np.testing.assert_array_equal(np.asarray(layered.tokens), np.asarray(stacked.tokens))
    np.testing.assert_allclose(
        np.asarray(layered.logprobs), np.asarray(stacked.logprobs), atol=2e-5
    )


def test_greedy_tokens_are_argmax_of_teacher_forced_logits_and_top_k_one_equals_greedy(params):
    out = generate(params, CONFIG, PROMPTS, sampling=GREEDY, max_new_tokens=12)
    logits, lp = teacher_forced_logprobs(params, out, 0.7)
    mask = np.asarray(out.mask) > 0
    np.testing.assert_array_equal(
        np.asarray(out.tokens)[mask], np.asarray(jnp.argmax(logits, -1))[mask]
    )
    np.testing.assert_allclose(np.asarray(out.logprobs)[mask], np.asarray(lp)[mask], atol=1e-4)
    k1 = generate(
        params,
        CONFIG,
        PROMPTS,
        sampling=SamplingConfig(top_k=1, temperature=0.7),
        max_new_tokens=12,
        seed=5,
    )
    np.testing.assert_array_equal(k1.tokens, out.tokens)
    np.testing.assert_allclose(k1.logprobs, out.logprobs, atol=1e-6)


def test_stop_token_ends_row_and_later_positions_are_masked(params):
    free = generate(params, CONFIG, PROMPTS, sampling=GREEDY, max_new_tokens=12)
    assert not np.any(free.finished)
    stop = int(free.tokens[1, 3])
    cut = generate(
        params,
        CONFIG,
        PROMPTS,
        max_new_tokens=12,
        sampling=SamplingConfig(greedy=True, temperature=0.7, stop_token_ids=(stop,)),
    )
    toks, free_toks = np.asarray(cut.tokens), np.asarray(free.tokens)
    for row in range(len(PROMPTS)):
        hits = np.flatnonzero(free_toks[row] == stop)
        n = hits[0] + 1 if hits.size else 12
        assert int(cut.lengths[row]) == n
        assert bool(cut.finished[row]) == bool(hits.size)
        assert bool(cut.truncated[row]) == (not hits.size)
        np.testing.assert_array_equal(toks[row, :n], free_toks[row, :n])
        np.testing.assert_array_equal(np.asarray(cut.mask[row]), np.arange(12) < n)
        assert np.all(toks[row, n:] == CONFIG.pad_token_id)
        assert np.all(np.asarray(cut.logprobs[row, n:]) == 0.0)
    assert int(cut.lengths[1]) <= 4 and bool(cut.finished[1])
    np.testing.assert_array_equal(np.asarray(cut.lengths), np.asarray(cut.mask).sum(-1))


def test_loop_stops_early_when_every_row_is_done(params):
    free = generate(params, CONFIG, PROMPTS, sampling=GREEDY, max_new_tokens=12)
    free_toks = np.asarray(free.tokens)
    stops = {int(free_toks[r, 2]) for r in range(len(PROMPTS))}
    # each row ends at the first stop token it emits; the loop runs until the last row ends
    ends = [
        int(np.flatnonzero(np.isin(free_toks[r], list(stops)))[0]) + 1 for r in range(len(PROMPTS))
    ]
    assert max(ends) <= 3
    tokens, mask = pad_prompts(PROMPTS)
    logits, cache, pos = prefill(params, tokens, mask, config=CONFIG, cache_len=16 + 16)
    state = init_decode_state(
        logits, cache, pos, jnp.arange(4), seed=0, num_samples=1, gen_len=16, max_new_tokens=12
    )
    state = decode(params, state, config=CONFIG, sampling=GREEDY, stop_ids=tuple(stops))
    assert int(state.step) == max(ends)
    assert int(state.cache.index) == 16 + max(ends)
    np.testing.assert_array_equal(np.asarray(state.lengths), ends)
    assert bool(np.all(state.done))


def test_prefix_shared_group_equals_repeated_prompt_batch_with_same_keys(params):
    g = 2
    shared = generate(
        params, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=g, seed=4, max_new_tokens=10
    )
    # Reference: every prompt repeated G times and prefilled G times, with the same row keys.
    repeated = [p for p in PROMPTS for _ in range(g)]
    tokens, mask = pad_prompts(repeated)
    logits, cache, pos = prefill(params, tokens, mask, config=CONFIG, cache_len=16 + 16)
    state = init_decode_state(
        logits,
        cache,
        pos,
        jnp.arange(len(repeated)),
        seed=4,
        num_samples=1,
        gen_len=16,
        max_new_tokens=10,
    )
    prompt_ids = jnp.repeat(jnp.arange(len(PROMPTS)), g)
    sample_ids = jnp.tile(jnp.arange(g), len(PROMPTS))
    state = state._replace(keys=row_keys(4, prompt_ids, sample_ids))
    state = decode(params, state, config=CONFIG, sampling=SAMPLED, stop_ids=(96,))
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(state.tokens)[:, :10])
    np.testing.assert_allclose(
        np.asarray(shared.logprobs), np.asarray(state.logprobs)[:, :10], atol=1e-5
    )
    np.testing.assert_array_equal(shared.prompt_tokens, tokens)
    np.testing.assert_array_equal(shared.prompt_ids, prompt_ids)
    np.testing.assert_array_equal(shared.sample_ids, sample_ids)


def test_row_sample_does_not_change_when_other_prompts_join_the_batch(params):
    others = [[9, 8, 7, 6, 5, 4, 3, 2, 1, 12, 13], [44, 45], [70, 71, 72]]
    a = generate(
        params,
        CONFIG,
        [PROMPTS[0]] + others,
        prompt_ids=[7, 20, 21, 22],
        sampling=SAMPLED,
        num_samples=2,
        seed=3,
        max_new_tokens=10,
    )
    b = generate(
        params,
        CONFIG,
        [PROMPTS[1], PROMPTS[2], PROMPTS[0], PROMPTS[3]],
        prompt_ids=[2, 9, 7, 5],
        sampling=SAMPLED,
        num_samples=2,
        seed=3,
        max_new_tokens=10,
    )
    np.testing.assert_array_equal(a.tokens[0:2], b.tokens[4:6])
    np.testing.assert_allclose(a.logprobs[0:2], b.logprobs[4:6], atol=1e-5)
    assert not np.array_equal(a.tokens[0], a.tokens[1])
    c = generate(
        params,
        CONFIG,
        [PROMPTS[0]] + others,
        prompt_ids=[7, 20, 21, 22],
        sampling=SAMPLED,
        num_samples=2,
        seed=4,
        max_new_tokens=10,
    )
    assert not np.array_equal(a.tokens[0:2], c.tokens[0:2])


def test_bucketing_keeps_compile_count_fixed_across_prompt_and_generation_lengths(params):
    generate(params, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=2, max_new_tokens=9)
    before = trace_counts()
    assert before["prefill"] >= 1 and before["decode"] >= 1
    for prompts, m in [
        ([[1], [2], [3], [4]], 9),
        ([[1] * 9, [2] * 13, [3], [4] * 2], 12),
        ([[3] * 16, [4], [5] * 5, [6] * 15], 16),
    ]:
        out = generate(params, CONFIG, prompts, sampling=SAMPLED, num_samples=2, max_new_tokens=m)
        assert out.tokens.shape == (8, m)
        assert out.prompt_tokens.shape == (8, 16)
    assert trace_counts() == before
    out = generate(
        params, CONFIG, [[1] * 17, [2], [3], [4]], sampling=SAMPLED, num_samples=2, max_new_tokens=9
    )
    assert out.prompt_tokens.shape == (8, 32)
    after = trace_counts()
    assert after["prefill"] == before["prefill"] + 1  # a new prompt bucket (32) compiles once
    assert after["decode"] == before["decode"] + 1


def test_first_token_frequencies_match_tempered_softmax(params):
    # 2000 samples of one prompt; the first token's empirical distribution vs softmax(z / τ).
    g, tau = 2000, 0.25
    out = generate(
        params,
        CONFIG,
        [PROMPTS[1]],
        sampling=SamplingConfig(temperature=tau),
        num_samples=g,
        seed=11,
        max_new_tokens=1,
    )
    logits, _ = forward(params, jnp.asarray([PROMPTS[1]]), config=CONFIG)
    probs = np.asarray(jax.nn.softmax(logits[0, -1] / tau))
    freq = np.bincount(np.asarray(out.tokens[:, 0]), minlength=CONFIG.vocab_size) / g
    # Tolerance: 5 binomial standard errors per token plus 1e-3 (max over 97 tokens).
    se = np.sqrt(probs * (1 - probs) / g)
    assert np.all(np.abs(freq - probs) <= 5 * se + 1e-3), np.max(np.abs(freq - probs))
    assert probs.max() > 0.05  # the test distribution is far from uniform (1/97)
    np.testing.assert_allclose(
        np.asarray(out.logprobs[:, 0]), np.log(probs)[np.asarray(out.tokens[:, 0])], atol=1e-4
    )


def test_bad_arguments_raise_clear_errors(params):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(params, CONFIG, PROMPTS, max_new_tokens=0)
    with pytest.raises(ConfigError, match="num_samples"):
        generate(params, CONFIG, PROMPTS, num_samples=0)
    with pytest.raises(DataError, match="prompt 1 is empty"):
        generate(params, CONFIG, [[1], []])
    with pytest.raises(DataError, match="outside"):
        generate(params, CONFIG, [[1, 500]])
    with pytest.raises(ConfigError, match="prompt_ids"):
        generate(params, CONFIG, PROMPTS, prompt_ids=[1])

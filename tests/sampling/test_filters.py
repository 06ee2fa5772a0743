"""Tests of jaxrl_llm/sampling/filters.py: truncation filters on hand-made distributions,
greedy / top-k selection, sampling frequencies, per-row keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import (
    SamplingConfig,
    filtered_logits,
    min_p_filter,
    row_keys,
    select_tokens,
    top_k_filter,
    top_p_filter,
)

# A hand-made distribution in shuffled vocabulary order: p = [0.05, 0.5, 0.15, 0.3].
PROBS = np.array([0.05, 0.5, 0.15, 0.3])
LOGITS = jnp.asarray(np.log(PROBS)[None, :] + 1.7, jnp.float32)  # shift: softmax-invariant


def support(z):
    return set(np.flatnonzero(np.isfinite(np.asarray(z)[0])).tolist())


@pytest.mark.parametrize(
    "p, expected",
    [
        (1.0, {0, 1, 2, 3}),
        (0.3, {1}),  # mass before the top token is 0 < 0.3; before the 2nd it is 0.5
        (0.5, {1}),  # mass before the 2nd token = 0.5, not < 0.5
        (0.51, {1, 3}),
        (0.8, {1, 3}),  # 0.5 + 0.3 = 0.8 reaches p: the 3rd token is not needed
        (0.81, {1, 3, 2}),
        (0.96, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_smallest_nucleus(p, expected):
    assert support(top_p_filter(LOGITS, p)) == expected


@pytest.mark.parametrize(
    "min_p, expected",
    [
        (0.0, {0, 1, 2, 3}),
        (0.5, {1, 3}),  # threshold 0.25
        (0.3, {1, 2, 3}),  # threshold 0.15 (0.15 kept: >=)
        (0.61, {1}),  # threshold 0.305
    ],
)
def test_min_p_keeps_tokens_above_fraction_of_max(min_p, expected):
    # min_p = 0.3 sits exactly on a boundary; nudge the logit of token 2 up by a hair
    z = LOGITS.at[0, 2].add(1e-5)
    assert support(min_p_filter(z, min_p)) == expected


@pytest.mark.parametrize(
    "k, expected", [(1, {1}), (2, {1, 3}), (3, {1, 2, 3}), (0, {0, 1, 2, 3}), (9, {0, 1, 2, 3})]
)
def test_top_k_keeps_k_largest(k, expected):
    assert support(top_k_filter(LOGITS, k)) == expected


def test_filters_keep_values_of_surviving_tokens_and_compose():
    s = SamplingConfig(temperature=0.5, top_k=3, top_p=0.9, min_p=0.4)
    z = filtered_logits(LOGITS, s)
    # τ=0.5 squares and renormalises: p ∝ [.0025, .25, .0225, .09]; top-k 3 drops token 0;
    # renormalised over the survivors [.25, .0225, .09] / .3625 = [.690, .062, .248]: top-p 0.9
    # keeps {1, 3}; min-p 0.4 (of .690 -> .276) drops token 3.
    assert support(z) == {1}
    z2 = filtered_logits(LOGITS, SamplingConfig(temperature=0.5, top_k=3, top_p=0.9))
    assert support(z2) == {1, 3}
    np.testing.assert_allclose(
        np.asarray(z2)[0, [1, 3]], np.asarray(LOGITS)[0, [1, 3]] / 0.5, rtol=1e-6
    )


def test_greedy_and_top_k_one_pick_argmax_and_logprob_matches_ops():
    logits = jax.random.normal(jax.random.PRNGKey(0), (6, 11)) * 3
    keys = row_keys(0, jnp.arange(6), jnp.zeros(6, jnp.int32))
    greedy_tok, greedy_lp = select_tokens(
        logits, keys, SamplingConfig(greedy=True, temperature=0.7)
    )
    k1_tok, k1_lp = select_tokens(logits, keys, SamplingConfig(top_k=1, temperature=0.7))
    np.testing.assert_array_equal(greedy_tok, np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(k1_tok, greedy_tok)
    expected = token_logprobs(logits, greedy_tok, temperature=0.7)
    np.testing.assert_allclose(greedy_lp, expected, atol=1e-6)
    np.testing.assert_allclose(k1_lp, expected, atol=1e-6)


def test_sampling_frequencies_follow_filtered_softmax():
    # 20000 rows, one draw each, from the hand-made distribution at τ = 2 with top-p 0.85.
    n = 20000
    logits = jnp.repeat(LOGITS, n, axis=0)
    s = SamplingConfig(temperature=2.0, top_p=0.85)
    keys = row_keys(123, jnp.arange(n), jnp.zeros(n, jnp.int32))
    tok, lp = jax.jit(select_tokens, static_argnums=2)(logits, keys, s)
    q = PROBS**0.5 / np.sum(PROBS**0.5)  # τ = 2: [.1198, .3790, .2076, .2936]
    # descending: .3790, .2936, .2076, .1198; the mass before token 0 is .8802 >= .85, so the
    # nucleus drops it and the rest is renormalised by .8802.
    expected = np.where(np.arange(4) == 0, 0.0, q) / q[1:].sum()
    freq = np.bincount(np.asarray(tok), minlength=4) / n
    # 5 standard errors of a binomial proportion at n = 20000 is <= 0.018.
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 5 * se + 1e-9), (freq, expected)
    # recorded log-probs are the unfiltered tempered ones
    np.testing.assert_allclose(np.asarray(lp), np.log(q)[np.asarray(tok)], atol=1e-5)


def test_row_keys_depend_only_on_prompt_and_sample_ids():
    a = row_keys(7, jnp.array([3, 5, 5]), jnp.array([0, 0, 1]))
    b = row_keys(7, jnp.array([5, 1]), jnp.array([1, 0]))
    np.testing.assert_array_equal(a[2], b[0])
    assert not np.array_equal(a[1], a[2])
    c = row_keys(8, jnp.array([3]), jnp.array([0]))
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize(
    "s",
    [
        SamplingConfig(top_p=0.9),
        SamplingConfig(temperature=0.7, top_k=40, top_p=0.95),
        SamplingConfig(min_p=0.05),
        SamplingConfig(top_k=300),  # top-k wider than the candidates: the whole-vocabulary path
    ],
)
def test_candidate_draws_stay_in_the_filtered_support_and_ignore_the_batch(s):
    """Peaked rows draw from the most likely CANDIDATES tokens, a flat row over the whole
    vocabulary; every token is one the full-vocabulary filter keeps, and a row draws the same
    token alone as in a batch with rows that take the other path."""
    from jaxrl_llm.sampling.filters import CANDIDATES

    v, n = 4 * CANDIDATES, 64
    peaked = jax.random.normal(jax.random.PRNGKey(0), (n, v)) * 4.0
    flat = jax.random.normal(jax.random.PRNGKey(1), (2, v)) * 0.01  # kept set > CANDIDATES
    logits = jnp.concatenate([peaked, flat])
    keys = row_keys(5, jnp.arange(n + 2), jnp.zeros(n + 2, jnp.int32))
    pick = jax.jit(select_tokens, static_argnums=2)
    tok, lp = pick(logits, keys, s)
    allowed = np.isfinite(np.asarray(filtered_logits(logits, s)))
    assert allowed[np.arange(n + 2), np.asarray(tok)].all()
    np.testing.assert_allclose(
        lp, token_logprobs(logits, tok, temperature=s.temperature), atol=1e-5
    )
    alone, _ = pick(peaked[:8], keys[:8], s)  # no flat row: the whole-vocabulary pass is skipped
    np.testing.assert_array_equal(alone, tok[:8])
    flat_alone, _ = pick(flat, keys[n:], s)
    np.testing.assert_array_equal(flat_alone, tok[n:])
    if s.top_k == 0:  # the flat rows keep more than CANDIDATES tokens: drawn over all of them
        assert allowed[n:].sum(-1).min() > CANDIDATES


def test_untruncated_sampling_frequencies_over_a_large_vocabulary():
    """τ only: the inverse-CDF draw over the whole vocabulary follows softmax(z / τ)."""
    v, n = 1000, 20000
    z = jnp.asarray(np.where(np.arange(v) < 3, [2.0, 1.0, 0.5] + [0.0] * (v - 3), -30.0))[None]
    logits = jnp.repeat(z.astype(jnp.float32), n, axis=0)
    keys = row_keys(9, jnp.arange(n), jnp.zeros(n, jnp.int32))
    tok, _ = jax.jit(select_tokens, static_argnums=2)(logits, keys, SamplingConfig(temperature=1.0))
    expected = np.asarray(jax.nn.softmax(z[0]))[:3]
    freq = np.bincount(np.asarray(tok), minlength=v)[:3] / n
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 5 * se), (freq, expected)

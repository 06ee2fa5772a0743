"""Weights that change between chunks (partial rollouts, :meth:`PagedEngine.swap`): tokens
record the version that drew them; a swap to the same weights changes nothing but the
versions; a swap to other weights changes only the tokens after it."""

import jax
import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.sampling import SamplingConfig, generate_paged

CONFIG = ModelConfig.tiny(eos_token_ids=(), pad_token_id=0)
SAMPLED = SamplingConfig(temperature=0.7, use_model_eos=False)
PROMPTS = [[5, 9, 11], [7, 3, 2, 8, 1], [4]]
CHUNK, NEW, G = 4, 14, 2


@pytest.fixture(scope="module")
def weights():
    a = init_params(CONFIG, jax.random.PRNGKey(0))
    b = init_params(CONFIG, jax.random.PRNGKey(1))
    return a, b


def _run(params, refresh=None):
    return generate_paged(
        params,
        CONFIG,
        PROMPTS,
        sampling=SAMPLED,
        num_samples=G,
        seed=3,
        max_new_tokens=NEW,
        num_slots=8,
        page_size=4,
        chunk_steps=CHUNK,
        refresh=refresh,
        return_versions=True,
    )


def _refresh(first, second, calls):
    """refresh(): ``first`` before the first ``calls`` chunks, then ``second``."""
    n = [0]

    def refresh():
        n[0] += 1
        return first if n[0] <= calls else second

    return refresh


def test_versions_split_where_the_weights_changed_and_same_weights_draw_the_same_tokens(weights):
    a, _ = weights
    plain, v0 = _run(a)
    assert (v0[np.asarray(plain.mask) > 0] == 0).all()
    swapped, v = _run(a, _refresh((a, 0), (a, 7), calls=2))
    # the same weights under a new version: bit for bit the same rows
    np.testing.assert_array_equal(np.asarray(swapped.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(swapped.logprobs), np.asarray(plain.logprobs))
    # two chunks of version 0, then version 7: the first token of the third chunk is drawn
    # from logits the old weights computed, so 2·CHUNK + 1 tokens carry version 0
    keep = 2 * CHUNK + 1
    for row, n in zip(v, np.asarray(swapped.lengths)):
        assert n == NEW
        assert (row[:keep] == 0).all() and (row[keep:n] == 7).all()


def test_other_weights_change_only_the_tokens_after_the_swap(weights):
    a, b = weights
    plain, _ = _run(a)
    swapped, v = _run(a, _refresh((a, 0), (b, 1), calls=2))
    keep = 2 * CHUNK + 1
    t0, t1 = np.asarray(plain.tokens), np.asarray(swapped.tokens)
    np.testing.assert_array_equal(t1[:, :keep], t0[:, :keep])
    np.testing.assert_array_equal(
        np.asarray(swapped.logprobs)[:, :keep], np.asarray(plain.logprobs)[:, :keep]
    )
    assert (t1[:, keep:] != t0[:, keep:]).any()  # the new weights drew the rest
    assert (v[:, keep:] == 1).all()

"""Reward-model scoring equals the scalar head at the last real token, computed directly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, apply, init_params
from jaxrl_llm.objectives import last_token_index
from jaxrl_llm.rewards import make_reward_model_reward, reward_model_scores


@pytest.fixture(scope="module")
def rm():
    cfg = ModelConfig.tiny(num_labels=1)
    params = init_params(cfg, jax.random.PRNGKey(0))
    return cfg, params


def test_last_token_index_left_and_right_padding():
    mask = jnp.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(last_token_index(mask), [2, 4, 2, -1])  # -1: no token


def test_scores_match_scalar_head_at_last_real_token(rm):
    cfg, params = rm
    seq = [5, 9, 13, 2]
    tokens = np.zeros((4, 16), np.int32)
    mask = np.zeros((4, 16), np.int32)
    tokens[0, :4], mask[0, :4] = seq, 1  # right padded
    tokens[1, -4:], mask[1, -4:] = seq, 1  # the same sequence, left padded
    tokens[2, :], mask[2, :] = np.arange(16) * 5 % 97, 1  # no padding
    tokens[3, :7], mask[3, :7] = [7, 7, 8, 31, 44, 60, 1], 1
    scores = reward_model_scores(params, jnp.asarray(tokens), jnp.asarray(mask), config=cfg)
    scalar = apply(params, jnp.asarray(tokens), config=cfg, attention_mask=jnp.asarray(mask)).scalar
    np.testing.assert_allclose(
        scores, [scalar[0, 3], scalar[1, 15], scalar[2, 15], scalar[3, 6]], rtol=1e-6
    )
    # Padding never changes a score: right- and left-padded copies agree.
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5, atol=1e-6)
    assert scores.shape == (4,) and scores.dtype == jnp.float32


def test_reward_function_with_tokenizer_and_token_field(rm):
    cfg, params = rm
    tok = lambda s: [ord(ch) % 97 for ch in s]  # noqa: E731
    fn = make_reward_model_reward(params, cfg, tokenizer=tok, batch_size=4)
    prompts, comps = ["ab", "c", "hello"], ["cd", "d", " world"]
    got = fn(prompts, comps)
    # Direct: one right-padded batch through the model, head read at each row's last token.
    ids = [tok(p + c) for p, c in zip(prompts, comps)]
    tokens = np.zeros((4, 16), np.int32)  # the shape the reward function compiles
    mask = np.zeros((4, 16), np.int32)
    for i, x in enumerate(ids):
        tokens[i, : len(x)], mask[i, : len(x)] = x, 1
    scalar = apply(params, jnp.asarray(tokens), config=cfg, attention_mask=jnp.asarray(mask)).scalar
    want = [scalar[i, len(x) - 1] for i, x in enumerate(ids)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    by_ids = make_reward_model_reward(params, cfg, batch_size=4)
    np.testing.assert_allclose(
        by_ids(prompts, comps, reward_token_ids=ids), got, rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ConfigError, match="reward_token_ids"):
        by_ids(prompts, comps)


def test_language_model_without_head_is_rejected():
    cfg = ModelConfig.tiny()
    with pytest.raises(ConfigError, match="num_labels"):
        make_reward_model_reward({}, cfg)

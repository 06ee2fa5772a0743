import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError

R = jnp.array([1.0, 0.0, 1.0, 2.0, 2.0, 2.0])


# ---------------------------------------------------------------- GRPO
def test_grpo_group_scale_unbiased_hand_values(run):
    got = run(obj.grpo_advantages, R, group_size=3, eps=0.0)
    s = math.sqrt(1.0 / 3.0)  # unbiased std of [1, 0, 1]
    np.testing.assert_allclose(got, [1 / 3 / s, -2 / 3 / s, 1 / 3 / s, 0, 0, 0], rtol=1e-5)
    assert np.isfinite(np.asarray(got)).all()


def test_grpo_biased_std():
    got = obj.grpo_advantages(R, group_size=3, eps=0.0, unbiased=False)
    s = math.sqrt(2.0 / 9.0)
    np.testing.assert_allclose(got[:3], [1 / 3 / s, -2 / 3 / s, 1 / 3 / s], rtol=1e-5)


def test_grpo_batch_and_none_scale():
    batch = obj.grpo_advantages(R, group_size=3, scale="batch", eps=0.0)
    s = float(np.std(np.asarray(R), ddof=1))
    np.testing.assert_allclose(batch, np.array([1 / 3, -2 / 3, 1 / 3, 0, 0, 0]) / s, rtol=1e-5)
    none = obj.grpo_advantages(R, group_size=3, scale=obj.GRPOScale.NONE)
    np.testing.assert_allclose(none, [1 / 3, -2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)


def test_grpo_eps_conventions():
    # TRL eps 1e-4 vs verl 1e-6: the same formula with a different eps.
    trl = obj.grpo_advantages(R, group_size=3, eps=1e-4)
    s = math.sqrt(1.0 / 3.0)
    assert float(trl[0]) == pytest.approx((1 / 3) / (s + 1e-4), rel=1e-6)


def test_grpo_zero_mean_per_group_and_errors():
    r = jax.random.normal(jax.random.PRNGKey(0), (12,))
    a = obj.grpo_advantages(r, group_size=4).reshape(3, 4)
    np.testing.assert_allclose(a.mean(axis=1), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.std(np.asarray(a), axis=1, ddof=1), 1.0, rtol=1e-4)
    with pytest.raises(ConfigError, match="group_size=4"):
        obj.grpo_advantages(jnp.ones(6), group_size=4)
    with pytest.raises(ConfigError, match="scale"):
        obj.grpo_advantages(R, group_size=3, scale="global")


# ---------------------------------------------------------------- RLOO / ReMax
def test_rloo_hand_values(run):
    got = run(obj.rloo_advantages, jnp.array([1.0, 0.0, 1.0, 4.0]), group_size=4)
    np.testing.assert_allclose(got, [-2 / 3, -2.0, -2 / 3, 10 / 3], rtol=1e-6)
    with pytest.raises(ConfigError, match="group_size >= 2"):
        obj.rloo_advantages(jnp.ones(3), group_size=1)


def test_remax():
    got = obj.remax_advantages(jnp.array([1.0, 0.5]), jnp.array([0.5, 0.5]))
    np.testing.assert_allclose(got, [0.5, 0.0])


# ---------------------------------------------------------------- returns / REINFORCE++
def test_discounted_returns_hand_and_interior_padding():
    got = obj.discounted_returns(
        jnp.array([[1.0, 2.0, 3.0, 9.0]]), jnp.array([[1, 1, 1, 0]]), gamma=0.5
    )
    np.testing.assert_allclose(got, [[2.75, 3.5, 3.0, 0.0]])
    padded = obj.discounted_returns(
        jnp.array([[1.0, 9.0, 2.0, 3.0]]), jnp.array([[1, 0, 1, 1]]), gamma=0.5
    )
    np.testing.assert_allclose(padded, [[2.75, 0.0, 3.5, 3.0]])


def test_reinforce_pp_hand_values(run):
    r = jnp.array([[0.0, 0.0, 1.0, 7.0], [0.0, 2.0, 5.0, 5.0]])
    m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    # returns {1,1,1,2,2}: mean 1.4, unbiased var 0.3, biased var 0.24
    got = run(obj.reinforce_pp_advantages, r, m, gamma=1.0)
    k = 1.0 / math.sqrt(0.3 + 1e-8)
    np.testing.assert_allclose(got, [[-0.4 * k] * 3 + [0], [0.6 * k] * 2 + [0, 0]], rtol=1e-5)
    biased = obj.reinforce_pp_advantages(r, m, gamma=1.0, unbiased=False)
    k = 1.0 / math.sqrt(0.24 + 1e-8)
    np.testing.assert_allclose(biased[1, :2], [0.6 * k] * 2, rtol=1e-5)


def test_reinforce_pp_baseline_hand_values(run):
    rewards = jnp.array([1.0, 0.0, 3.0, 3.0])
    m = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
    got = run(obj.reinforce_pp_baseline_advantages, rewards, m, group_size=2)
    vals = np.array([0.5, 0.5, -0.5, 0, 0, 0, 0])  # group-centred, per valid token
    mean, var = vals.mean(), vals.var(ddof=1)
    k = 1.0 / math.sqrt(var + 1e-8)
    expected = (
        np.array([[0.5 - mean] * 2 + [0], [-0.5 - mean, 0, 0], [-mean] * 3, [-mean, 0, 0]])
        * k
        * np.asarray(m)
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert float(got[0, 0]) == pytest.approx(1.242118, rel=1e-5)  # (0.5 − 1/14)·rsqrt(5/42)


# ---------------------------------------------------------------- GAE
def test_gae_hand_values(run):
    adv, ret = run(
        obj.gae,
        jnp.array([[0.0, 0.0, 1.0]]),
        jnp.array([[0.5, 0.6, 0.7]]),
        jnp.ones((1, 3)),
        gamma=1.0,
        lam=0.5,
    )
    np.testing.assert_allclose(adv, [[0.225, 0.25, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[0.725, 0.85, 1.0]], rtol=1e-6)


def _random_episode():
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    r = jax.random.normal(k1, (3, 6))
    v = jax.random.normal(k2, (3, 6))
    m = jnp.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    return r, v, m


def test_gae_lambda_one_is_mc_return_minus_value():
    r, v, m = _random_episode()
    adv, ret = obj.gae(r, v, m, gamma=0.9, lam=1.0)
    mc = obj.discounted_returns(r, m, gamma=0.9)
    np.testing.assert_allclose(adv, (mc - v) * m, atol=1e-5)
    np.testing.assert_allclose(ret, mc, atol=1e-5)


def test_gae_lambda_zero_is_td_error():
    r, v, m = _random_episode()
    adv, _ = obj.gae(r, v, m, gamma=0.9, lam=0.0)
    vn = np.asarray(v * m)
    next_v = np.concatenate([vn[:, 1:], np.zeros((3, 1))], axis=1)
    td = (np.asarray(r) + 0.9 * next_v - vn) * np.asarray(m)
    np.testing.assert_allclose(adv, td, atol=1e-5)


def test_gae_interior_padding_changes_nothing():
    r, v, m = _random_episode()
    adv, ret = obj.gae(r, v, m, gamma=0.9, lam=0.8)
    ins = lambda x, fill: jnp.concatenate([x[:, :1], jnp.full((3, 2), fill), x[:, 1:]], 1)  # noqa
    adv2, ret2 = obj.gae(ins(r, 5.0), ins(v, -3.0), ins(m, 0), gamma=0.9, lam=0.8)
    np.testing.assert_allclose(np.delete(np.asarray(adv2), [1, 2], 1), adv, atol=1e-5)
    np.testing.assert_allclose(np.delete(np.asarray(ret2), [1, 2], 1), ret, atol=1e-5)
    assert (np.asarray(adv2)[:, 1:3] == 0).all()


def test_whiten_matches_verl_formula():
    x = jnp.array([1.0, 2.0, 3.0, 4.0, 100.0])
    m = jnp.array([1, 1, 1, 1, 0])
    w = obj.whiten(x, m, eps=0.0)
    np.testing.assert_allclose(
        w[:4], (np.arange(1, 5) - 2.5) / np.std([1, 2, 3, 4], ddof=1), rtol=1e-6
    )
    assert float(w[4]) == 0.0
    w2 = obj.whiten(x, m, eps=0.0, shift_mean=False)
    np.testing.assert_allclose(w2[:4], np.asarray(w[:4]) + 2.5, rtol=1e-6)


# ---------------------------------------------------------------- process supervision
def test_process_advantages_hand_values(run):
    step_r = jnp.array([[1.0, 0.0, 0.5], [0.5, 2.0, 9.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    step_m = jnp.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
    ids = jnp.array(
        [
            [-1, 0, 0, 1, 2, 2],
            [-1, 0, 1, 1, -1, -1],
            [-1, 0, 0, -1, -1, -1],
            [0, -1, -1, -1, -1, -1],
        ]
    )
    got = np.asarray(run(obj.process_advantages, step_r, step_m, ids, group_size=2, eps=0.0))
    # group 0 steps {1, 0, .5, .5, 2}: mean 0.8, unbiased var 2.3/4
    s = math.sqrt(2.3 / 4)
    n = lambda x: (x - 0.8) / s  # noqa: E731
    row0 = [n(1.0) + n(0.0) + n(0.5), n(0.0) + n(0.5), n(0.5)]
    row1 = [n(0.5) + n(2.0), n(2.0)]
    np.testing.assert_allclose(
        got[0], [0, row0[0], row0[0], row0[1], row0[2], row0[2]], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(got[1], [0, row1[0], row1[1], row1[1], 0, 0], rtol=1e-5)
    # group 1: all step rewards equal -> zeros, never NaN
    np.testing.assert_array_equal(got[2:], 0.0)


# ---------------------------------------------------------------- shaping / filters
def test_kl_shaped_rewards_hand_values(run):
    scores = jnp.array([2.0, 5.0, 7.0])
    logp = jnp.array([[-1.0, -2.0, -1.0, 0.0], [-1.0, 3.0, 3.0, 3.0], [0.0] * 4])
    ref = jnp.array([[-1.5, -2.0, -0.5, 0.0], [-1.0, 0.0, 0.0, 0.0], [1.0] * 4])
    m = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    got = run(obj.kl_shaped_rewards, scores, logp, ref, m, kl_coef=0.1)
    np.testing.assert_allclose(
        got, [[-0.05, 0.0, 2.05, 0.0], [5.0, 0, 0, 0], [0, 0, 0, 0]], rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize(
    "length, expected",
    [
        (10, 0.0),
        (16, 0.0),
        (17, -0.25),
        (18, -0.5),
        (19, -0.75),
        (20, -1.0),
        (21, -1.0),
        (100, -1.0),
    ],
)
def test_overlong_penalty_dapo(length, expected):
    got = obj.overlong_penalty(jnp.array([length]), max_len=20, buffer=4)
    assert float(got[0]) == pytest.approx(expected)


def test_overlong_penalty_errors():
    with pytest.raises(ConfigError, match="buffer"):
        obj.overlong_penalty(jnp.array([1]), max_len=4, buffer=8)


def test_informative_groups(run):
    r = jnp.array([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])
    np.testing.assert_array_equal(
        run(obj.informative_groups, r, group_size=2), [False, True, False]
    )
    np.testing.assert_array_equal(
        obj.informative_groups(r, group_size=2, per_row=True),
        [False, False, True, True, False, False],
    )


def test_vmap_over_independent_batches():
    r = jax.random.normal(jax.random.PRNGKey(5), (3, 8))
    got = jax.vmap(lambda x: obj.grpo_advantages(x, group_size=4))(r)
    for i in range(3):
        np.testing.assert_allclose(got[i], obj.grpo_advantages(r[i], group_size=4), rtol=1e-6)

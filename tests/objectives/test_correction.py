import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError
from tests.objectives._helpers import batch


def _pair(ratios):
    """Learner/engine log-probs of one row with the given ratios π/μ."""
    rollout = jnp.full((1, len(ratios)), -1.5)
    return rollout + jnp.log(jnp.array([ratios], jnp.float32)), rollout


def test_token_truncate_hand_values(run):
    logp, rollout = _pair([0.5, 1.5, 3.0])
    m = jnp.ones((1, 3))
    w, met = run(obj.rollout_correction, logp, rollout, m)  # TIS: cap 2, no floor
    np.testing.assert_allclose(w, [[0.5, 1.5, 2.0]], rtol=1e-6)
    assert float(met["outside_frac"]) == pytest.approx(1 / 3)
    assert float(met["weight_max"]) == pytest.approx(2.0)
    assert float(met["ratio_max"]) == pytest.approx(3.0, rel=1e-5)
    assert float(met["weight_mean"]) == pytest.approx(4.0 / 3, rel=1e-6)
    d = np.log([0.5, 1.5, 3.0])
    assert float(met["mismatch_kl"]) == pytest.approx(np.mean(np.expm1(d) - d), rel=1e-5)
    w, met = run(obj.rollout_correction, logp, rollout, m, low=0.8)
    np.testing.assert_allclose(w, [[0.8, 1.5, 2.0]], rtol=1e-6)
    assert float(met["outside_frac"]) == pytest.approx(2 / 3)


def test_token_mask_hand_values(run):
    logp, rollout = _pair([0.5, 1.5, 3.0, 0.9])
    w, met = run(
        obj.rollout_correction, logp, rollout, jnp.ones((1, 4)), mode="mask", low=0.8, high=2.0
    )
    np.testing.assert_allclose(w, [[0.0, 1.5, 0.0, 0.9]], rtol=1e-6)
    assert float(met["outside_frac"]) == pytest.approx(0.5)


def test_sequence_level_broadcasts_the_row_product(run):
    logp = jnp.log(jnp.array([[1.2, 1.5, 9.0], [0.5, 0.9, 1.0]]))
    rollout = jnp.zeros((2, 3))
    m = jnp.array([[1, 1, 0], [1, 1, 1]])  # 9.0 is padding
    w, met = run(
        obj.rollout_correction, logp, rollout, m, level="sequence", mode="mask", low=0.5, high=2.0
    )
    np.testing.assert_allclose(w, [[1.8, 1.8, 0.0], [0.0, 0.0, 0.0]], rtol=1e-5)
    assert float(met["seq_outside_frac"]) == pytest.approx(0.5)
    assert float(met["outside_frac"]) == pytest.approx(3 / 5)
    w, _ = run(obj.rollout_correction, logp, rollout, m, level="sequence", high=1.5)
    np.testing.assert_allclose(w, [[1.5, 1.5, 0.0], [0.45, 0.45, 0.45]], rtol=1e-5)


def test_weights_carry_no_gradient_and_padding_is_harmless():
    logp, old, _, m = batch(0)
    g = jax.grad(lambda x: jnp.sum(obj.rollout_correction(x, old, m)[0]))(logp)
    assert float(jnp.max(jnp.abs(g))) == 0.0
    bad_logp = jnp.where(m > 0, logp, jnp.nan)
    bad_old = jnp.where(m > 0, old, jnp.inf)
    for level, mode in (("token", "truncate"), ("sequence", "mask")):
        kw = dict(level=level, mode=mode, low=0.5, high=2.0)
        w, met = obj.rollout_correction(logp, old, m, **kw)
        w2, met2 = obj.rollout_correction(bad_logp, bad_old, m, **kw)
        np.testing.assert_array_equal(w, w2)
        assert (np.asarray(w)[np.asarray(m) == 0] == 0).all()
        for k in met:
            assert float(met[k]) == pytest.approx(float(met2[k])), k


def test_truncation_above_every_ratio_is_the_plain_weighted_loss():
    logp, old, adv, m = batch(1)
    learner = old + 0.2 * jnp.sin(jnp.arange(6.0))  # recomputed log-probs of the samples
    w, met = obj.rollout_correction(learner, old, m, high=1e6)
    assert float(met["outside_frac"]) == 0.0
    raw = jnp.where(m > 0, jnp.exp(learner - old), 0.0)
    np.testing.assert_allclose(w, raw, rtol=1e-6)
    a, _ = obj.policy_loss(logp, learner, adv, m, is_weights=w)
    b, _ = obj.policy_loss(logp, learner, adv, m, is_weights=raw)
    assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_bounds_are_validated():
    logp, rollout = _pair([1.0])
    m = jnp.ones((1, 1))
    for kw in (dict(low=-0.1), dict(high=0.0), dict(low=3.0, high=2.0)):
        with pytest.raises(ConfigError, match="rollout correction"):
            obj.rollout_correction(logp, rollout, m, **kw)
    with pytest.raises(ConfigError, match="level"):
        obj.rollout_correction(logp, rollout, m, level="geometric")
    w, _ = obj.rollout_correction(logp + math.log(100.0), rollout, m, high=None)
    assert float(w[0, 0]) == pytest.approx(100.0, rel=1e-5)

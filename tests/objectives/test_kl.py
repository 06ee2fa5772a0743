import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError

LOGP = jnp.array([[-1.0, -3.0, -2.0]])
REF = jnp.array([[-1.5, -2.0, -2.0]])  # d = [0.5, -1, 0]


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("k1", [0.5, -1.0, 0.0]),
        ("k2", [0.125, 0.5, 0.0]),
        ("k3", [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]),
        ("abs", [0.5, 1.0, 0.0]),
    ],
)
def test_kl_kinds_hand_values(run, kind, expected):
    got = run(obj.kl_penalty, LOGP, REF, kind=kind)
    np.testing.assert_allclose(got[0], expected, rtol=1e-6, atol=1e-7)


def test_kind_accepts_enum_and_string_and_rejects_unknown():
    a = obj.kl_penalty(LOGP, REF, kind=obj.KLKind.K3)
    b = obj.kl_penalty(LOGP, REF, kind="k3")
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match="kind='k4'"):
        obj.kl_penalty(LOGP, REF, kind="k4")


def test_k3_nonnegative_and_gradient():
    d = jnp.linspace(-5.0, 5.0, 11)
    k3 = obj.kl_penalty(d, jnp.zeros_like(d), kind="k3")
    assert (np.asarray(k3) >= 0).all()
    g = jax.grad(lambda x: obj.kl_penalty(x, jnp.zeros_like(x), kind="k3").sum())(d)
    np.testing.assert_allclose(g, 1.0 - np.exp(-np.asarray(d)), rtol=1e-5)


def test_clamp():
    got = obj.kl_penalty(jnp.array([-20.0]), jnp.array([0.0]), kind="k3", clamp=10.0)
    assert float(got[0]) == 10.0


def test_k1_is_unbiased_k3_mean_matches_true_kl():
    # samples from p = Bernoulli-like categorical; E_p[k1] = E_p[k3] = KL(p||q)
    p = np.array([0.7, 0.2, 0.1])
    q = np.array([0.5, 0.25, 0.25])
    kl_true = float(np.sum(p * np.log(p / q)))
    lp, lq = jnp.log(jnp.array(p)), jnp.log(jnp.array(q))
    for kind in ("k1", "k3"):
        est = float(jnp.sum(jnp.array(p) * obj.kl_penalty(lp, lq, kind=kind)))
        assert est == pytest.approx(kl_true, rel=1e-5)

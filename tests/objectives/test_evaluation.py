from fractions import Fraction
from math import comb

import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError


def _exact(n, c, k):
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def test_k_one_is_the_fraction_correct():
    n = np.array([1, 4, 16, 300, 300])
    c = np.array([1, 3, 5, 0, 299])
    np.testing.assert_array_equal(obj.pass_at_k(n, c, k=1), c / n)


def test_matches_exact_binomials_up_to_hundreds_of_samples():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 400, size=300)
    c = rng.integers(0, n + 1)
    k = 7
    n = np.maximum(n, k)
    c = np.minimum(c, n)
    got = obj.pass_at_k(n, c, k=k)
    want = np.array([float(_exact(int(a), int(b), k)) for a, b in zip(n, c)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert got.dtype == np.float64


def test_edges_and_broadcasting():
    assert float(obj.pass_at_k(16, 4, k=8)) == pytest.approx(1 - 495 / 12870, rel=1e-14)
    assert float(obj.pass_at_k(10, 0, k=5)) == 0.0
    assert float(obj.pass_at_k(10, 6, k=5)) == 1.0  # n − c < k: a correct one is always drawn
    assert float(obj.pass_at_k(10, 10, k=10)) == 1.0
    out = obj.pass_at_k(np.array([[8], [16]]), np.array([0, 1, 2]), k=2)
    assert out.shape == (2, 3)
    assert out[1, 1] == pytest.approx(2 / 16)
    assert obj.pass_at_k(np.array([], int), np.array([], int), k=1).shape == (0,)


def test_invalid_inputs_raise():
    for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 2, 5), (4, 2, 0), (4.5, 2, 1)):
        with pytest.raises(ConfigError, match="pass_at_k"):
            obj.pass_at_k(n, c, k=k)

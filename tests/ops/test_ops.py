import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import ops


def test_masked_mean_ignores_padding_and_nan():
    x = jnp.array([[1.0, 2.0, jnp.nan], [4.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 0], [1, 0, 0]])
    assert float(ops.masked_mean(x, m)) == pytest.approx(7.0 / 3.0)
    np.testing.assert_allclose(ops.masked_mean(x, m, axis=1), [1.5, 4.0])
    g = jax.grad(lambda x: ops.masked_mean(x, m))(x)
    assert np.isfinite(np.asarray(g)).all()


def test_masked_mean_empty_mask_is_zero():
    assert float(ops.masked_mean(jnp.ones(3), jnp.zeros(3))) == 0.0


def test_masked_var_bessel_and_whiten():
    x = jnp.array([1.0, 2.0, 3.0, 4.0, 100.0])
    m = jnp.array([1, 1, 1, 1, 0])
    assert float(ops.masked_var(x, m)) == pytest.approx(np.var([1, 2, 3, 4], ddof=1))
    assert float(ops.masked_var(x, m, unbiased=False)) == pytest.approx(np.var([1, 2, 3, 4]))
    w = ops.masked_whiten(x, m, eps=0.0)
    np.testing.assert_allclose(
        w[:4], (np.arange(1, 5) - 2.5) / np.std([1, 2, 3, 4], ddof=1), rtol=1e-6
    )
    assert float(w[4]) == 0.0


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_logprobs_match_full(chunk):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    h = jax.random.normal(k1, (2, 7, 5))
    w = jax.random.normal(k2, (5, 11))
    tok = jax.random.randint(k3, (2, 7), 0, 11)
    logits = h @ w
    full = ops.token_logprobs(logits, tok, temperature=0.7)
    got = ops.token_logprobs_from_hidden(h, w, tok, temperature=0.7, chunk_size=chunk)
    np.testing.assert_allclose(got, full, atol=1e-5)
    ent = ops.entropy_from_hidden(h, w, chunk_size=chunk)
    np.testing.assert_allclose(ent, ops.entropy_from_logits(logits), atol=1e-5)
    lp2, ent2 = ops.logprobs_and_entropy_from_hidden(h, w, tok, temperature=0.7, chunk_size=chunk)
    np.testing.assert_allclose(lp2, full, atol=1e-5)
    np.testing.assert_allclose(ent2, ops.entropy_from_logits(logits, temperature=0.7), atol=1e-5)
    # gradients agree too
    gf = jax.grad(lambda h: ops.token_logprobs(h @ w, tok).sum())(h)
    gc = jax.grad(lambda h: ops.token_logprobs_from_hidden(h, w, tok, chunk_size=chunk).sum())(h)
    np.testing.assert_allclose(gc, gf, atol=1e-5)

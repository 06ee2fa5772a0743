"""Shared test helpers for the objectives tests: batches, finite differences, padding."""

import jax
import jax.numpy as jnp
import numpy as np


def batch(seed=0, b=4, t=6, scale=0.3):
    """Random ``(logp, old, adv [B], mask)`` with rows of lengths t, t−2, 3, 1."""
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    logp = -jax.random.uniform(k[0], (b, t), minval=0.1, maxval=3.0)
    old = logp + scale * jax.random.normal(k[1], (b, t))
    adv = jax.random.normal(k[2], (b,))
    lens = jnp.array([t, t - 2, 3, 1])[:b]
    mask = (jnp.arange(t)[None, :] < lens[:, None]).astype(jnp.int32)
    return logp, old, adv, mask


def tokens(ratios, advs):
    """One row of tokens with the given ratios π/π_old and per-token advantages."""
    old = jnp.full((1, len(ratios)), -1.0)
    logp = old + jnp.log(jnp.array([ratios], jnp.float32))
    return logp, old, jnp.array([advs], jnp.float32), jnp.ones((1, len(ratios)))


def check_grad_fd(f, x, mask, *, seed=0, h=1e-3, rtol=3e-3, atol=1e-5, n_dirs=3):
    """Directional derivatives of scalar ``f`` at ``x`` along random masked directions match
    central finite differences (float32, so a loose tolerance)."""
    g = jax.jit(jax.grad(f))(x)
    f = jax.jit(f)
    for i in range(n_dirs):
        v = jax.random.normal(jax.random.PRNGKey(seed + i), x.shape) * mask
        fd = (float(f(x + h * v)) - float(f(x - h * v))) / (2 * h)
        ad = float(jnp.sum(g * v))
        np.testing.assert_allclose(ad, fd, rtol=rtol, atol=atol)
    return g


def pad_with_garbage(logp, old, adv, mask):
    """The same batch with NaN/Inf at every padded position and an extra all-padding row."""
    bad = lambda x, v: jnp.where(mask > 0, x, v)  # noqa: E731
    pad = lambda x, v: jnp.concatenate([x, jnp.full((1,) + x.shape[1:], v)], 0)  # noqa: E731
    return (
        pad(bad(logp, -jnp.inf), jnp.nan),
        pad(bad(old, jnp.nan), 0.0),
        jnp.concatenate([adv, jnp.array([jnp.nan])]),
        pad(mask, 0),
    )

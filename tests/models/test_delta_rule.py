"""The gated delta rule (models/delta_rule.py): chunked form against the recurrence, values
and gradients; padding tokens (g = 0, β = 0) leave the state unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.delta_rule import (
    delta_rule_chunked,
    delta_rule_recurrent,
    gated_delta_rule,
)

B, H, DK, DV = 2, 3, 8, 5


def _inputs(t, seed=0, with_state=True):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    q = jax.random.normal(ks[0], (B, t, H, DK)) / np.sqrt(DK)
    k = jax.random.normal(ks[1], (B, t, H, DK))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(ks[2], (B, t, H, DV))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (B, t, H)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (B, t, H)))
    s0 = 0.3 * jax.random.normal(ks[5], (B, H, DK, DV)) if with_state else None
    return q, k, v, g, beta, s0


def _naive(q, k, v, g, beta, s0):
    """The recurrence written with numpy loops, in float64."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    b, t, h, dk = q.shape
    s = np.zeros((b, h, dk, v.shape[-1])) if s0 is None else np.asarray(s0, np.float64).copy()
    out = np.zeros((b, t, h, v.shape[-1]))
    for i in range(t):
        for r in range(b):
            for n in range(h):
                st = np.exp(g[r, i, n]) * s[r, n]
                st = st + beta[r, i, n] * np.outer(k[r, i, n], v[r, i, n] - st.T @ k[r, i, n])
                s[r, n] = st
                out[r, i, n] = st.T @ q[r, i, n]
    return out, s


@pytest.mark.parametrize("with_state", [False, True])
def test_recurrence_matches_the_equation(with_state):
    args = _inputs(7, with_state=with_state)
    o, s = delta_rule_recurrent(*args)
    o_ref, s_ref = _naive(*args)
    np.testing.assert_allclose(o, o_ref, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, atol=1e-5)


@pytest.mark.parametrize("t,chunk", [(37, 16), (64, 16), (5, 16), (50, 64), (1, 4)])
@pytest.mark.parametrize("jit", [False, True])
def test_chunked_equals_recurrence(t, chunk, jit):
    args = _inputs(t, seed=t)
    chunked = (
        jax.jit(delta_rule_chunked, static_argnames="chunk_size") if jit else delta_rule_chunked
    )
    o, s = chunked(*args, chunk_size=chunk)
    o_ref, s_ref = delta_rule_recurrent(*args)
    assert o.shape == (B, t, H, DV) and s.shape == (B, H, DK, DV)
    np.testing.assert_allclose(o, o_ref, atol=1e-5)
    np.testing.assert_allclose(s, s_ref, atol=1e-5)


def test_chunked_gradients_equal_recurrence():
    t, chunk = 29, 8
    args = _inputs(t, seed=3)
    w_o = jax.random.normal(jax.random.PRNGKey(9), (B, t, H, DV))
    w_s = jax.random.normal(jax.random.PRNGKey(10), (B, H, DK, DV))

    def loss(fn, *a):
        o, s = fn(*a)
        return jnp.sum(o * w_o) + jnp.sum(s * w_s)

    def chunked(*a):
        return delta_rule_chunked(*a, chunk_size=chunk)

    argnums = tuple(range(6))
    grads = jax.grad(lambda *a: loss(chunked, *a), argnums)(*args)
    grads_ref = jax.grad(lambda *a: loss(delta_rule_recurrent, *a), argnums)(*args)
    for got, want in zip(grads, grads_ref):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_padding_tokens_leave_state_and_outputs_unchanged():
    """Left padding (and padding mid-sequence) with g = 0, β = 0: the real tokens' outputs and
    the final state equal those of the unpadded sequence, in both forms, gradients too."""
    t, pad, chunk = 23, 9, 8
    q, k, v, g, beta, s0 = _inputs(t, seed=5)
    real = jnp.arange(t + pad) >= pad
    noise = jax.random.normal(jax.random.PRNGKey(7), (B, pad, H, DK))

    def padded(x, fill):
        return jnp.concatenate([fill, x], axis=1)

    qp, kp = padded(q, noise), padded(k, noise)
    vp = padded(v, jax.random.normal(jax.random.PRNGKey(8), (B, pad, H, DV)))
    gp = padded(g, jnp.zeros((B, pad, H)))
    bp = padded(beta, jnp.zeros((B, pad, H)))
    o_ref, s_ref = delta_rule_recurrent(q, k, v, g, beta, s0)
    for fn in (delta_rule_recurrent, lambda *a: delta_rule_chunked(*a, chunk_size=chunk)):
        o, s = fn(qp, kp, vp, gp, bp, s0)
        np.testing.assert_allclose(o[:, real], o_ref, atol=1e-5)
        np.testing.assert_allclose(s, s_ref, atol=1e-5)

    def loss_padded(v_):
        o, s = delta_rule_chunked(qp, kp, padded(v_, vp[:, :pad]), gp, bp, s0, chunk_size=chunk)
        return jnp.sum(o[:, pad:] ** 2) + jnp.sum(s**2)

    def loss_plain(v_):
        o, s = delta_rule_recurrent(q, k, v_, g, beta, s0)
        return jnp.sum(o**2) + jnp.sum(s**2)

    np.testing.assert_allclose(jax.grad(loss_padded)(v), jax.grad(loss_plain)(v), atol=1e-5)


def test_dispatch_one_token_is_the_recurrence_and_prefix_then_step_is_the_whole():
    """A T-token call then a 1-token call from its state equals one T+1-token call."""
    q, k, v, g, beta, s0 = _inputs(12, seed=11)
    o_all, s_all = gated_delta_rule(q, k, v, g, beta, s0, chunk_size=4)
    o1, s1 = gated_delta_rule(
        q[:, :11], k[:, :11], v[:, :11], g[:, :11], beta[:, :11], s0, chunk_size=4
    )
    o2, s2 = gated_delta_rule(q[:, 11:], k[:, 11:], v[:, 11:], g[:, 11:], beta[:, 11:], s1)
    np.testing.assert_allclose(jnp.concatenate([o1, o2], axis=1), o_all, atol=1e-5)
    np.testing.assert_allclose(s2, s_all, atol=1e-5)

"""Attention sinks (gpt-oss; jaxrl_llm/models/attention.py and blockwise.py): the naive path
equals a hand-written softmax over the scores and one more logit per head; the one-query and
blockwise paths (forward, and the blockwise custom backward for q, k, v and the sinks) equal
the naive one; no fused kernel is chosen with sinks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import attention as A
from jaxrl_llm.models.config import AttentionImpl

B, T, H, K, E = 2, 37, 6, 2, 8


def _inputs(seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (B, T, H, E))
    k = jax.random.normal(ks[1], (B, T, K, E))
    v = jax.random.normal(ks[2], (B, T, K, E))
    sinks = 2.0 * jax.random.normal(ks[3], (H,))
    mask = jnp.ones((B, T), bool).at[1, :9].set(False)
    pos = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    return q, k, v, sinks, A.causal_self_mask(mask, pos)


def _by_hand(q, k, v, sinks, attn_mask, window=None):
    """softmax over [scores, sink] per query head, the sink's column dropped."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = H // K
    out = np.zeros(q.shape)
    valid = np.asarray(attn_mask.k_valid)
    pos = np.asarray(attn_mask.k_positions)
    for b in range(B):
        for h in range(H):
            s = q[b, :, h] @ k[b, :, h // g].T / math.sqrt(E)  # [T, S]
            ok = np.tril(np.ones((T, T), bool)) & valid[b][None, :]
            if window is not None:
                ok &= pos[b][:, None] - pos[b][None, :] < window
            s = np.where(ok, s, -np.inf)
            full = np.concatenate([s, np.full((T, 1), float(sinks[h]))], axis=1)
            p = np.exp(full - full.max(1, keepdims=True))
            p = p / p.sum(1, keepdims=True)
            out[b, :, h] = p[:, :-1] @ v[b, :, h // g]
    return out


@pytest.mark.parametrize("window", [None, 5])
def test_naive_and_blockwise_with_sinks_equal_the_hand_softmax(window):
    q, k, v, sinks, mask = _inputs()
    want = _by_hand(q, k, v, sinks, mask, window)
    real = np.asarray(mask.k_valid)
    naive = A.naive_attention(q, k, v, mask, window=window, sinks=sinks)
    np.testing.assert_allclose(np.asarray(naive)[real], want[real], atol=1e-5)
    blockwise = A.blockwise_attention(
        q, k, v, mask, window=window, sinks=sinks, block_q=8, block_k=16
    )
    np.testing.assert_allclose(np.asarray(blockwise)[real], want[real], atol=1e-5)
    without = A.naive_attention(q, k, v, mask, window=window)
    assert np.abs(np.asarray(without) - want)[real].max() > 1e-2  # the sinks matter


def test_blockwise_backward_with_sinks_equals_the_naive_gradient():
    q, k, v, sinks, mask = _inputs(1)
    w = jax.random.normal(jax.random.PRNGKey(9), (B, T, H, E)) * mask.k_valid[:, :, None, None]

    def loss(fn):
        return lambda q, k, v, s: jnp.sum(fn(q, k, v, mask, sinks=s) * w)

    blockwise = lambda *a, **kw: A.blockwise_attention(*a, **kw, block_q=8, block_k=16)  # noqa: E731
    want = jax.grad(loss(A.naive_attention), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    got = jax.grad(loss(blockwise), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    assert float(jnp.abs(want[3]).max()) > 1e-3
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_one_query_attention_with_sinks_equals_naive():
    q, k, v, sinks, mask = _inputs(2)
    last = A.AttentionMask(q_index=None, k_valid=mask.k_valid)
    want = A.naive_attention(q[:, -1:], k, v, last, sinks=sinks)
    got = A.one_query_attention(q[:, -1:], k, v, last, sinks=sinks)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


@pytest.mark.parametrize("backend,dtype", [("cuda", jnp.bfloat16), ("tpu", jnp.bfloat16)])
def test_no_fused_kernel_is_chosen_with_sinks(backend, dtype):
    kw = dict(num_queries=1024, num_keys=1024, head_dim=128, dtype=dtype)
    assert A.select_attention_impl(backend, **kw) in (AttentionImpl.CUDNN, AttentionImpl.SPLASH)
    assert A.select_attention_impl(backend, **kw, sinks=True) == AttentionImpl.BLOCKWISE

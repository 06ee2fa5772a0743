"""jaxrl_llm.models.attention: blockwise == naive for every mask kind (values and gradients),
the model's forward / cache / shared-prefix paths through blockwise attention, O(T) memory of
the blockwise backward, the backend selection, and the splash kernel (Pallas interpreter)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.models import AttentionImpl, AttentionMask

ATOL = 1e-5


def _qkv(seed, b, t, s, kh, g, e, dtype=jnp.float32):
    """Random q ``[B, T, K·G, E]``, k, v ``[B, S, K, E]`` (numpy: no compile per shape)."""
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
        for shape in ((b, t, kh * g, e), (b, s, kh, e), (b, s, kh, e))
    )


def _value_and_grads(fn, q, k, v, w):
    """Output and d(sum(out · w))/d(q, k, v), jitted once."""

    def f(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _compare(
    q, k, v, mask, *, window=None, softcap=None, block_q=8, block_k=16, rows=None, grads=True
):
    """Max |blockwise − naive| over outputs (rows where ``rows`` [B, T] is true) and, with
    ``grads``, the gradients."""
    w = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    if rows is not None:
        w = w * np.asarray(rows)[:, :, None, None]
    naive = lambda q, k, v: M.naive_attention(q, k, v, mask, window=window, softcap=softcap)
    block = lambda q, k, v: M.blockwise_attention(
        q, k, v, mask, window=window, softcap=softcap, block_q=block_q, block_k=block_k
    )
    if grads:
        out_n, g_n = _value_and_grads(naive, q, k, v, w)
        out_b, g_b = _value_and_grads(block, q, k, v, w)
    else:
        out_n, out_b = jax.jit(naive)(q, k, v), jax.jit(block)(q, k, v)
        g_n = g_b = ()
    keep = np.ones(q.shape[:2], bool) if rows is None else np.asarray(rows)
    diff = np.asarray(out_n) - np.asarray(out_b)
    errs = [float(np.max(np.abs(np.where(keep[:, :, None, None], diff, 0.0))))]
    errs += [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(g_n, g_b)]
    return errs, out_n


MASK_KINDS = ["causal", "left_padding", "segment_ids", "sliding_window", "softcap", "all"]


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_blockwise_equals_naive_for_each_mask_kind(kind):
    b, t, kh, g, e = 2, 37, 2, 3, 8  # GQA: 6 query heads on 2 KV heads; T not a block multiple
    q, k, v = _qkv(0, b, t, t, kh, g, e)
    attn = jnp.ones((b, t), bool)
    seg = None
    window = softcap = None
    if kind in ("left_padding", "all"):
        attn = attn.at[1, :6].set(False)
    if kind in ("segment_ids", "all"):
        seg = jnp.array([[0] * 15 + [1] * 22, [0] * 30 + [1] * 7])
    if kind in ("sliding_window", "all"):
        window = 5
    if kind in ("softcap", "all"):
        softcap = 2.5
    pos = M.default_positions(attn, seg)
    mask = M.causal_self_mask(attn if not attn.all() else None, pos, seg)
    errs, out = _compare(q, k, v, mask, window=window, softcap=softcap)
    assert max(errs) <= ATOL, errs
    # The mask really is in force: full (non-causal, unmasked) attention differs.
    full = M.naive_attention(q, k, v, AttentionMask())
    assert float(jnp.max(jnp.abs(full - out))) > 1e-2


def test_blockwise_matches_hand_computed_attention():
    # One head, T = 3, E = 1: q = k = 1, v = [1, 2, 4] -> causal means 1, 1.5, 7/3.
    q = jnp.ones((1, 3, 1, 1))
    k = jnp.ones((1, 3, 1, 1))
    v = jnp.array([1.0, 2.0, 4.0]).reshape(1, 3, 1, 1)
    mask = M.causal_self_mask(None, num_tokens=3)
    out = M.blockwise_attention(q, k, v, mask, block_q=1, block_k=2)
    np.testing.assert_allclose(out[0, :, 0, 0], [1.0, 1.5, 7.0 / 3.0], rtol=1e-6)
    # Soft cap 1 on scores of 1: every score becomes tanh(1), still uniform.
    out = M.blockwise_attention(q, k, v, mask, softcap=1.0, block_q=2, block_k=1)
    np.testing.assert_allclose(out[0, :, 0, 0], [1.0, 1.5, 7.0 / 3.0], rtol=1e-6)


@pytest.mark.slow
def test_blockwise_equals_naive_over_random_configs():
    """A seeded property test: random shapes, cache offsets, masks, windows and caps (values
    for all 20, gradients for every fourth: the backward's compile is the slow part)."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        b = int(rng.integers(1, 3))
        kh, g = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        e = int(rng.choice([4, 8]))
        t = int(rng.integers(1, 24))
        offset = int(rng.integers(0, 10))  # queries written at slot `offset`
        s = offset + t + int(rng.integers(0, 8))  # cache slots (some never filled)
        q, k, v = _qkv(trial, b, t, s, kh, g, e)
        k_valid = rng.random((b, s)) > 0.3
        k_pos = np.cumsum(rng.integers(0, 2, (b, s)), axis=1).astype(np.int32)
        q_index = np.arange(offset, offset + t, dtype=np.int32)
        window = int(rng.integers(1, 6)) if rng.random() < 0.5 else None
        softcap = float(rng.uniform(0.5, 5.0)) if rng.random() < 0.5 else None
        causal = rng.random() < 0.8
        rows = None
        if not causal:
            # Without causality a row may see no key at all; such rows are the caller's to
            # avoid (the model's masks always let a query see itself), so leave them out.
            window = None
            rows = np.any(k_valid, axis=1)[:, None] & np.ones((b, t), bool)
        mask = AttentionMask(
            q_index=q_index if causal else None,
            k_valid=k_valid,
            q_positions=k_pos[:, offset : offset + t],
            k_positions=k_pos,
        )
        bq, bk = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        errs, _ = _compare(
            q,
            k,
            v,
            mask,
            window=window,
            softcap=softcap,
            block_q=bq,
            block_k=bk,
            rows=rows,
            grads=trial % 4 == 0,
        )
        assert max(errs) <= ATOL, (trial, errs)


def test_blockwise_backward_does_not_store_scores():
    """XLA's compiled memory of value_and_grad at T = 4096: the naive path holds T² floats
    (64 MiB for one head), the blockwise path only O(T) plus one block of scores."""
    t, e = 4096, 16
    x = jax.ShapeDtypeStruct((1, t, 1, e), jnp.float32)
    mask = M.causal_self_mask(None, num_tokens=t)

    def temp_bytes(fn):
        g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, mask)), argnums=(0, 1, 2)))
        return g.lower(x, x, x).compile().memory_analysis().temp_size_in_bytes

    naive = temp_bytes(M.naive_attention)
    block = temp_bytes(
        lambda q, k, v, m: M.blockwise_attention(q, k, v, m, block_q=256, block_k=256)
    )
    assert naive >= t * t * 4
    assert block < 8 * 2**20, block


# ----- the model through blockwise attention -------------------------------------------------


def _configs(family="llama", **kw):
    c = M.ModelConfig.tiny(family, **kw)
    return (
        dataclasses.replace(c, attention=AttentionImpl.NAIVE),
        dataclasses.replace(c, attention=AttentionImpl.BLOCKWISE),
    )


@pytest.mark.parametrize("family,kw", [("llama", {}), ("mistral", {"sliding_window": 200})])
def test_model_forward_blockwise_equals_naive(family, kw):
    # T = 530 > the default block of 512: two query/key blocks, the second mostly padding.
    naive, block = _configs(family, **kw)
    p = M.init_params(naive, jax.random.PRNGKey(0))
    b, t = 2, 530
    toks = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, naive.vocab_size)
    mask = jnp.ones((b, t), bool).at[1, :40].set(False)
    fwd = lambda c: jax.jit(lambda p, x, m: M.forward(p, x, config=c, attention_mask=m)[0])
    ln, lb = fwd(naive)(p, toks, mask), fwd(block)(p, toks, mask)
    diff = jnp.where(mask[..., None], ln - lb, 0.0)
    assert float(jnp.max(jnp.abs(diff))) <= ATOL


def test_model_packing_and_gradients_blockwise_equal_naive():
    naive, block = _configs("qwen3")
    p = M.init_params(naive, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (1, 13), 0, naive.vocab_size)
    seg = jnp.array([[0] * 6 + [1] * 7])

    def loss(c):
        return jax.jit(
            jax.value_and_grad(
                lambda p: jnp.sum(jnp.sin(M.forward(p, toks, config=c, segment_ids=seg)[0]))
            )
        )

    (vn, gn), (vb, gb) = loss(naive)(p), loss(block)(p)
    np.testing.assert_allclose(vb, vn, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(gn), jax.tree.leaves(gb)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_kv_cache_prefill_and_decode_blockwise_equal_full_naive():
    naive, block = _configs("mistral", sliding_window=4)
    p = M.init_params(naive, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, naive.vocab_size)
    mask = jnp.ones((2, 9), bool).at[1, :3].set(False)
    full, _ = M.forward(p, toks, config=naive, attention_mask=mask)
    pos = M.default_positions(mask)
    step = jax.jit(
        lambda p, t, m, ps, cache: M.forward(
            p, t, config=block, attention_mask=m, positions=ps, cache=cache
        )
    )
    cache = M.init_cache(block, 2, 16)
    outs = []
    lg, cache = step(p, toks[:, :5], mask[:, :5], pos[:, :5], cache)
    outs.append(lg)
    for i in range(5, 9):
        lg, cache = step(p, toks[:, i : i + 1], mask[:, i : i + 1], pos[:, i : i + 1], cache)
        outs.append(lg)
    inc = jnp.concatenate(outs, 1)
    diff = jnp.where(mask[..., None], inc - full, 0.0)
    assert float(jnp.max(jnp.abs(diff))) <= ATOL


def test_shared_prefix_trunk_blockwise_equals_plain_naive():
    naive, block = _configs()
    p = M.init_params(naive, jax.random.PRNGKey(0))
    g, tp, t = 2, 6, 10
    prompt = jax.random.randint(jax.random.PRNGKey(1), (2, tp), 0, naive.vocab_size)
    comp = jax.random.randint(jax.random.PRNGKey(2), (4, t - tp), 0, naive.vocab_size)
    toks = jnp.concatenate([jnp.repeat(prompt, g, axis=0), comp], axis=1)
    mask = jnp.ones((4, t), bool).at[2:, :2].set(False).at[1, 9].set(False)
    ref, _ = M.trunk(p, toks, config=naive, attention_mask=mask)
    got = M.trunk_shared_prefix(
        p, toks, config=block, prefix_len=tp, group_size=g, attention_mask=mask
    )
    diff = jnp.where(mask[..., None], got - ref, 0.0)
    assert float(jnp.max(jnp.abs(diff))) <= ATOL


def test_config_attention_option_round_trips_and_validates():
    c = M.ModelConfig.tiny(attention="blockwise")
    assert c.attention is AttentionImpl.BLOCKWISE
    with pytest.raises(ValueError):
        M.ModelConfig.tiny(attention="flash3")


# ----- which implementation runs -------------------------------------------------------------


def _select(backend, **kw):
    base = dict(num_queries=1024, num_keys=1024, head_dim=64, dtype=jnp.bfloat16)
    base.update(kw)
    return M.select_attention_impl(backend, **base)


def test_select_cpu_naive_for_small_and_decode_blockwise_for_long():
    assert _select("cpu") == AttentionImpl.BLOCKWISE
    assert _select("cpu", num_queries=256, num_keys=256) == AttentionImpl.NAIVE
    assert _select("cpu", num_queries=1, num_keys=8192, self_attention=False) == AttentionImpl.NAIVE
    assert _select("cpu", requested="cudnn") == AttentionImpl.BLOCKWISE
    assert _select("cpu", requested="splash") == AttentionImpl.BLOCKWISE
    assert _select("cpu", requested="naive") == AttentionImpl.NAIVE
    assert (
        _select("tpu", num_queries=256, num_keys=256, requested="blockwise")
        == AttentionImpl.BLOCKWISE
    )


@pytest.mark.parametrize("backend", ["gpu", "cuda"])
def test_select_gpu_cudnn_and_each_unsupported_feature_falls_back(backend):
    assert _select(backend) == AttentionImpl.CUDNN
    assert _select(backend, requested="cudnn") == AttentionImpl.CUDNN
    unsupported = [
        dict(key_mask=True),
        dict(segment_ids=True),
        dict(window=128),
        dict(softcap=50.0),
        dict(dtype=jnp.float32),
        dict(head_dim=100),
        dict(head_dim=256),
        dict(self_attention=False),
        dict(causal=False),
        dict(num_queries=1024, num_keys=2048),
    ]
    for kw in unsupported:
        assert _select(backend, **kw) == AttentionImpl.BLOCKWISE, kw
        assert _select(backend, requested="cudnn", **kw) == AttentionImpl.BLOCKWISE, kw
    assert _select("rocm") == AttentionImpl.BLOCKWISE


def test_select_tpu_splash_and_each_unsupported_feature_falls_back():
    kw = dict(head_dim=128)
    assert _select("tpu", **kw) == AttentionImpl.SPLASH
    for extra in (
        dict(key_mask=True),
        dict(segment_ids=True),
        dict(softcap=30.0),
        dict(dtype=jnp.float32),
    ):
        assert _select("tpu", **kw, **extra) == AttentionImpl.SPLASH, extra
    for extra in (
        dict(window=64),
        dict(head_dim=64),
        dict(num_queries=1000, num_keys=1000),
        dict(self_attention=False),
        dict(causal=False),
    ):
        assert _select("tpu", **{**kw, **extra}) == AttentionImpl.BLOCKWISE, extra
    assert _select("tpu", requested="cudnn", **kw) == AttentionImpl.BLOCKWISE


def test_attention_dispatch_follows_the_selection(monkeypatch):
    from jaxrl_llm.models import attention as attn_lib

    calls = []
    monkeypatch.setattr(attn_lib, "cudnn_attention", lambda q, k, v: calls.append("cudnn") or q)
    monkeypatch.setattr(
        attn_lib, "splash_attention", lambda q, k, v, m, softcap=None: calls.append("splash") or q
    )
    q, k, v = _qkv(0, 1, 128, 128, 1, 2, 128, jnp.bfloat16)
    mask = M.causal_self_mask(None, num_tokens=128)
    M.dot_product_attention(q, k, v, mask, backend="cuda")
    M.dot_product_attention(q, k, v, mask, backend="tpu")
    out = M.dot_product_attention(
        q, k, v, mask, backend="cuda", softcap=10.0
    )  # cuDNN has no soft cap
    assert calls == ["cudnn", "splash"]
    ref = M.naive_attention(q, k, v, mask, softcap=10.0)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)


def test_splash_kernel_in_interpreter_matches_naive_on_real_tokens():
    b, t, kh, g, e = 2, 256, 1, 2, 128
    q, k, v = _qkv(3, b, t, t, kh, g, e)
    attn = jnp.ones((b, t), bool).at[1, :50].set(False)
    seg = jnp.array([[0] * 100 + [1] * 156, [0] * 256])
    mask = M.causal_self_mask(attn, None, seg)
    got = M.splash_attention(q, k, v, mask, softcap=5.0, interpret=True)
    ref = M.naive_attention(q, k, v, mask, softcap=5.0)
    diff = jnp.where(attn[:, :, None, None], got - ref, 0.0)
    assert float(jnp.max(jnp.abs(diff))) <= 1e-4


def test_blockwise_bfloat16_close_to_naive():
    q, k, v = _qkv(5, 1, 40, 40, 1, 3, 16, jnp.bfloat16)
    mask = M.causal_self_mask(None, num_tokens=40)
    ref = M.naive_attention(q, k, v, mask)
    got = M.blockwise_attention(q, k, v, mask, block_q=16, block_k=8)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=2e-2)


def test_cudnn_unavailable_falls_back_to_blockwise_with_a_warning():
    # On this CPU, cuDNN raises while tracing ("cuDNN is not detected"): blockwise runs instead.
    q, k, v = _qkv(6, 1, 600, 600, 1, 2, 64, jnp.bfloat16)
    mask = M.causal_self_mask(None, num_tokens=600)
    assert (
        M.select_attention_impl(
            "cuda", num_queries=600, num_keys=600, head_dim=64, dtype=jnp.bfloat16
        )
        == AttentionImpl.CUDNN
    )
    with pytest.warns(RuntimeWarning, match="blockwise"):
        got = M.dot_product_attention(q, k, v, mask, backend="cuda")
    ref = M.blockwise_attention(q, k, v, mask)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(ref, np.float32))


def test_one_query_attention_equals_naive_for_decode_masks():
    """The paged decode step's attention (products and sums, T = 1) computes what the naive
    einsum path does: ragged valid slots, a sliding window over positions, a soft cap, GQA."""
    from jaxrl_llm.models.attention import one_query_attention

    b, s, kh, g, e = 3, 40, 2, 3, 16
    q, k, v = _qkv(0, b, 1, s, kh, g, e)
    last = jnp.array([5, 39, 17])
    slots = jnp.arange(s)
    mask = AttentionMask(
        q_index=None,
        k_valid=slots[None, :] <= last[:, None],
        q_positions=last[:, None],
        k_positions=jnp.broadcast_to(slots, (b, s)),
    )
    for window, softcap in [(None, None), (8, None), (None, 5.0), (8, 5.0)]:
        want = M.naive_attention(q, k, v, mask, window=window, softcap=softcap)
        got = jax.jit(
            lambda q, k, v: one_query_attention(q, k, v, mask, window=window, softcap=softcap)
        )(q, k, v)
        np.testing.assert_allclose(got, want, atol=ATOL)
    with pytest.raises(ValueError, match="one query"):
        one_query_attention(*_qkv(1, b, 2, s, kh, g, e), mask)

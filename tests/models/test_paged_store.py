"""Tests of jaxrl_llm/models/paged_store.py: paged attention equals dense-cache attention
(ragged lengths, shared prompt pages), and the paged trunk equals the dense forward token by
token and on a multi-token continuation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import (
    NULL_PAGE,
    AttentionMask,
    ModelConfig,
    copy_pages,
    forward,
    init_paged_cache,
    init_params,
    naive_attention,
    paged_attention,
    paged_trunk,
    write_prompt_pages,
)
from jaxrl_llm.sampling import pad_prompts, prefill
from jaxrl_llm.sampling.paged import PageTable

CONFIG = ModelConfig.tiny(eos_token_ids=(96,), pad_token_id=0)


@pytest.fixture(scope="module")
def params():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)


def test_paged_attention_equals_dense_attention_with_ragged_lengths_and_shared_pages():
    rng = np.random.default_rng(0)
    z, kh, h, e, n_pages = 4, 1, 3, 16, 12
    k_pool = jnp.asarray(rng.normal(size=(n_pages, z, kh, e)), jnp.float32)
    v_pool = jnp.asarray(rng.normal(size=(n_pages, z, kh, e)), jnp.float32)
    # rows 0 and 1 share prompt pages 1, 2 and own their last pages; row 2 is alone; the
    # table is padded with the null page to N = 4 pages
    table = np.array([[1, 2, 3, 0], [1, 2, 4, 5], [6, 7, 0, 0]], np.int32)
    start = np.array([9, 13, 5], np.int32)  # ragged: 10, 14 and 6 keys visible
    q = jnp.asarray(rng.normal(size=(3, 1, h, e)), jnp.float32)
    out = paged_attention(q, k_pool, v_pool, jnp.asarray(table), jnp.asarray(start), config=CONFIG)
    for r in range(3):
        n = start[r] + 1
        k_dense = np.concatenate([np.asarray(k_pool)[p] for p in table[r]])[:n]
        v_dense = np.concatenate([np.asarray(v_pool)[p] for p in table[r]])[:n]
        # the dense cache: the row's keys in a cache of 20 slots, the rest masked out
        pad = 20 - n
        kd = np.concatenate([k_dense, rng.normal(size=(pad, kh, e))])[None]
        vd = np.concatenate([v_dense, rng.normal(size=(pad, kh, e))])[None]
        valid = (np.arange(20) < n)[None]
        ref = naive_attention(
            q[r : r + 1],
            jnp.asarray(kd),
            jnp.asarray(vd),
            AttentionMask(k_valid=jnp.asarray(valid)),
        )
        np.testing.assert_allclose(np.asarray(out[r]), np.asarray(ref[0]), atol=1e-5, rtol=0)


def test_paged_forward_equals_dense_forward_token_by_token(params):
    prompts = [[5, 17, 3, 8, 9, 1], [40, 2, 9], [60, 61, 62, 63, 64, 65, 66, 67]]
    g, z, steps = 2, 4, 7
    tokens, mask = pad_prompts(prompts, length=16)
    _, dense, _ = prefill(params, tokens, mask, config=CONFIG, cache_len=16)
    book = PageTable(64, z)
    cache = init_paged_cache(CONFIG, 64, z)
    lens = [len(p) for p in prompts]
    group_pages, cow = [], []
    for i, plen in enumerate(lens):
        pages, pairs = book.add_group([i * g + s for s in range(g)], plen)
        group_pages.append(pages + [NULL_PAGE] * (3 - len(pages)))
        cow += pairs
    assert len(cow) == 2  # prompts of 6 and 3 tokens end in a partial page, 8 fills two pages
    dense_k, dense_v = dense.stacked_kv()  # as the paged engine's prefill writes its pages
    cache = write_prompt_pages(
        cache, dense_k, dense_v, jnp.asarray(lens, jnp.int32), jnp.asarray(group_pages, jnp.int32)
    )
    src, dst = (jnp.asarray(x, jnp.int32) for x in zip(*cow))
    cache = copy_pages(cache, src, dst)
    rows = list(range(len(prompts) * g))
    for r in rows:
        book.grow(r, lens[r // g] + steps)
    table = jnp.asarray(book.table(rows, 4))
    feed = np.random.default_rng(1).integers(1, 96, size=(len(rows), steps)).astype(np.int32)
    start = np.repeat(lens, g).astype(np.int32)
    step = jax.jit(lambda c, t, s: paged_trunk(params, t, c, table, s, config=CONFIG))
    got = []
    for t in range(steps):
        hidden, cache = step(cache, jnp.asarray(feed[:, t : t + 1]), jnp.asarray(start + t))
        got.append(np.asarray(hidden[:, 0] @ params["embed"]["embedding"].T))
    for r in rows:
        seq = np.concatenate([prompts[r // g], feed[r]])[None]
        ref, _ = forward(params, jnp.asarray(seq), config=CONFIG)
        want = np.asarray(ref[0, lens[r // g] :])
        np.testing.assert_allclose(np.stack([x[r] for x in got]), want, atol=1e-5, rtol=0)
    # a multi-token continuation of one row (T > 1, causal inside the chunk)
    more = feed[:1, :3]
    book.grow(0, lens[0] + steps + 3)
    s0 = jnp.asarray([lens[0] + steps], jnp.int32)
    hidden, cache = paged_trunk(
        params, jnp.asarray(more), cache, jnp.asarray(book.table([0], 4)), s0, config=CONFIG
    )
    seq = np.concatenate([prompts[0], feed[0], more[0]])[None]
    ref, _ = forward(params, jnp.asarray(seq), config=CONFIG)
    logits = hidden[0] @ params["embed"]["embedding"].T
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref[0, -3:]), atol=1e-5, rtol=0)

"""jaxrl_llm.models.ring_attention: ring attention over the ``context`` mesh axis equals
single-device naive attention (values and gradients) for every mask kind, on ``data=2 ×
context=4`` and ``fsdp=2 × context=4``; token sharding splits rows and tokens. The model's
attention through the ring: tests/parallel/test_context_model.py. 8 forced CPU devices
(tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.models import AttentionMask
from jaxrl_llm.parallel import (
    batch_sharding_tree,
    make_mesh,
    ring_attention,
    token_sharding,
)

ATOL = 1e-5
B, T, KH, G, E = 2, 16, 2, 3, 8  # 6 query heads over 2 KV heads; T splits over 4 devices


def _qkv(seed):
    rng = np.random.default_rng(seed)
    shapes = ((B, T, KH * G, E), (B, T, KH, E), (B, T, KH, E))
    return tuple(jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes)


def _lengths_mask(lengths):
    return jnp.asarray(np.arange(T)[None, :] < np.asarray(lengths)[:, None])


def _value_and_grads(fn, q, k, v, w):
    def f(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(out * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return np.asarray(out), [np.asarray(g) for g in grads]


def _masks():
    valid = _lengths_mask([T, 11])  # row 1 right-padded
    left = jnp.asarray(np.arange(T)[None, :] >= np.asarray([[0], [5]]))  # row 1 left-padded
    seg = jnp.asarray(np.repeat([[0, 1, 2, 3], [0, 0, 1, 1]], 4, axis=1))  # packed rows
    pos = M.default_positions(jnp.ones((B, T), bool), seg)
    return {
        "causal": (M.causal_self_mask(None, num_tokens=T), {}),
        "causal+right-padding": (M.causal_self_mask(valid), {}),
        "causal+left-padding": (M.causal_self_mask(left), {}),
        "segments": (M.causal_self_mask(None, pos, seg), {}),
        "window+softcap": (
            M.causal_self_mask(valid, M.default_positions(valid)),
            {"window": 5, "softcap": 2.0},
        ),
        "bidirectional+padding": (
            AttentionMask(k_valid=valid, self_attention=True),
            {},
        ),
    }


MASKS = _masks()


@pytest.mark.parametrize(
    "mesh_kw,block_size",
    [(dict(data=2, context=4), 512), (dict(fsdp=2, context=4), 2)],  # 2: 2 blocks per device
)
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_ring_equals_naive_values_and_grads(kind, mesh_kw, block_size):
    mask, kw = MASKS[kind]
    q, k, v = _qkv(0)
    w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape, np.float32))
    ref, ref_g = _value_and_grads(
        lambda q, k, v: M.naive_attention(q, k, v, mask, **kw), q, k, v, w
    )
    mesh = make_mesh(**mesh_kw)
    with jax.set_mesh(mesh):
        out, g = _value_and_grads(
            lambda q, k, v: ring_attention(q, k, v, mask, block_size=block_size, **kw), q, k, v, w
        )
    np.testing.assert_allclose(out, ref, atol=ATOL, rtol=0)
    for a, b_ in zip(g, ref_g):
        np.testing.assert_allclose(a, b_, atol=ATOL, rtol=0)


def test_ring_takes_the_mesh_explicitly_and_checks_its_inputs():
    q, k, v = _qkv(2)
    mask = M.causal_self_mask(_lengths_mask([T, 7]))
    mesh = make_mesh(data=2, context=4)
    out = jax.jit(lambda q, k, v: ring_attention(q, k, v, mask, mesh=mesh))(q, k, v)
    np.testing.assert_allclose(out, M.naive_attention(q, k, v, mask), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="do not split"):
        ring_attention(
            q[:, :6], k[:, :6], v[:, :6], M.causal_self_mask(None, num_tokens=6), mesh=mesh
        )
    cache_mask = AttentionMask(q_index=jnp.arange(T, dtype=jnp.int32))  # not self-attention
    with pytest.raises(ValueError, match="self-attention"):
        ring_attention(q, k, v, cache_mask, mesh=mesh)
    with pytest.raises(ValueError, match="'context' axis"):
        ring_attention(q, k, v, mask)  # no ambient mesh


def test_token_sharding_splits_rows_and_tokens():
    mesh = make_mesh(fsdp=2, context=4)
    s = token_sharding(mesh)
    assert s.spec == jax.sharding.PartitionSpec(("data", "fsdp"), "context")
    batch = {
        "input_ids": np.zeros((4, T), np.int32),
        "ragged": np.zeros((4, T - 1), np.int32),  # T − 1 does not split: rows only
        "rewards": np.zeros((4,), np.float32),
        "loss_denominator": np.float32(3),
    }
    tree = batch_sharding_tree(batch, mesh)
    assert tree["input_ids"] == s
    assert (
        tree["ragged"].spec == tree["rewards"].spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    )
    assert tree["loss_denominator"].spec == jax.sharding.PartitionSpec()
    x = jax.device_put(batch["input_ids"], s)
    assert {sh.data.shape for sh in x.addressable_shards} == {(2, T // 4)}
    # without a context axis of size > 1 the tree is the rows-only sharding, as before
    plain = batch_sharding_tree(batch, make_mesh(data=8))
    assert plain["input_ids"].spec == jax.sharding.PartitionSpec(("data", "fsdp"))

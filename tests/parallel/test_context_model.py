"""The model's attention through ring attention (jaxrl_llm.models.ring_attention): AUTO / RING go
round the ring only under a mesh with a ``context`` axis, and a tiny model's forward, token
log-probs, token-mean loss (an exact (sum, count) pair) and parameter gradients with its tokens
split over ``context=4`` (and ``fsdp=2 × context=4``) equal the single-device ones. 8 forced
CPU devices (tests/conftest.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm import ops
from jaxrl_llm.models import AttentionImpl, AttentionMask
from jaxrl_llm.parallel import DEFAULT_RULES, batch_sharding_tree, logical_to_sharding, make_mesh

ATOL = 1e-5
T = 16  # splits over 4 devices


def _qkv(seed, b=2, kh=2, g=3, e=8):
    rng = np.random.default_rng(seed)
    shapes = ((b, T, kh * g, e), (b, T, kh, e), (b, T, kh, e))
    return tuple(jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes)


def _lengths_mask(lengths):
    return jnp.asarray(np.arange(T)[None, :] < np.asarray(lengths)[:, None])


def test_dispatch_goes_round_the_ring_only_under_a_context_mesh():
    q, k, v = _qkv(3)
    mask = M.causal_self_mask(_lengths_mask([T, 9]))
    ref = M.naive_attention(q, k, v, mask)

    def jaxpr(impl):
        fn = functools.partial(M.dot_product_attention, impl=impl)
        return str(jax.make_jaxpr(fn)(q, k, v, mask))

    for impl in (AttentionImpl.AUTO, AttentionImpl.RING):
        assert "ppermute" not in jaxpr(impl)  # no mesh: RING falls back to AUTO's choice
        np.testing.assert_allclose(
            M.dot_product_attention(q, k, v, mask, impl=impl), ref, atol=ATOL, rtol=0
        )
    with jax.set_mesh(make_mesh(data=2, context=4)):
        assert "ppermute" in jaxpr(AttentionImpl.AUTO)
        assert "ppermute" in jaxpr(AttentionImpl.RING)
        assert "ppermute" not in jaxpr(AttentionImpl.BLOCKWISE)  # a forced impl stays itself
        decode = AttentionMask(q_index=jnp.full((1,), T - 1, jnp.int32), k_valid=mask.k_valid)
        assert "ppermute" not in jaxpr_of(q[:, -1:], k, v, decode)  # KV-cache step: no ring


def jaxpr_of(q, k, v, mask):
    return str(jax.make_jaxpr(M.dot_product_attention)(q, k, v, mask))


# ----- a tiny model with its tokens split over devices -----------------------------------------

CFG = M.ModelConfig.tiny()  # 2 layers, d=48, 3 heads, 1 KV head, vocab 97


def _batch():
    rng = np.random.default_rng(4)
    rows, t = 4, T
    ids = rng.integers(0, CFG.vocab_size, size=(rows, t)).astype(np.int32)
    lengths = np.asarray([t, 13, 9, 16])
    attn = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    loss = attn * (np.arange(t)[None, :] >= np.asarray([[3], [2], [1], [5]]))
    return {"input_ids": ids * attn, "attention_mask": attn, "loss_mask": loss.astype(np.int32)}


def _loss(params, batch):
    """Token-mean NLL as an exact (sum, count) pair, plus the logits and token log-probs."""
    out = M.apply(params, batch["input_ids"], config=CFG, attention_mask=batch["attention_mask"])
    logits = M.logits_from_hidden(params, out.hidden, CFG)
    logp = ops.token_logprobs_from_hidden(
        out.hidden[:, :-1], out.unembed, batch["input_ids"][:, 1:], chunk_size=4
    )
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    total, count = ops.masked_sum(-logp, mask), jnp.sum(mask)
    return total / count, (logits, logp, total, count)


def _run(params, batch):
    (loss, aux), grads = jax.jit(jax.value_and_grad(_loss, has_aux=True))(params, batch)
    return jax.device_get((loss, aux, grads))


@pytest.fixture(scope="module")
def single_device():
    params = M.init_params(CFG, jax.random.PRNGKey(0))
    batch = _batch()
    return params, batch, _run(params, batch)


@pytest.mark.parametrize("mesh_kw", [dict(data=2, context=4), dict(fsdp=2, context=4)])
def test_model_forward_logprobs_and_grads_match_single_device(single_device, mesh_kw):
    params, batch, (loss0, aux0, grads0) = single_device
    mesh = make_mesh(**mesh_kw)
    axes = M.param_logical_axes(CFG)
    sharded_params = jax.device_put(params, logical_to_sharding(axes, mesh, shapes=params))
    shardings = batch_sharding_tree(batch, mesh, DEFAULT_RULES)
    sharded_batch = jax.device_put(batch, shardings)
    assert {s.data.shape for s in sharded_batch["input_ids"].addressable_shards} == {
        (4 // mesh.shape["data"] // mesh.shape["fsdp"], T // 4)
    }
    with jax.set_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(_loss)(sharded_params, sharded_batch))
        assert "ppermute" in jaxpr  # the model's attention went round the ring
        loss, aux, grads = _run(sharded_params, sharded_batch)
    real = np.asarray(batch["attention_mask"], bool)
    logits, logp, total, count = aux
    logits0, logp0, total0, count0 = aux0
    np.testing.assert_allclose(logits[real], logits0[real], atol=ATOL, rtol=0)
    target = np.asarray(batch["loss_mask"][:, 1:], bool)
    np.testing.assert_allclose(logp[target], logp0[target], atol=ATOL, rtol=0)
    assert count == count0
    np.testing.assert_allclose(total, total0, rtol=1e-6)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        g0 = _at(grads0, path)
        scale = max(float(np.max(np.abs(g0))), 1e-12)
        err = float(np.max(np.abs(np.asarray(g) - np.asarray(g0))))
        assert err <= 1e-4 * scale, (jax.tree_util.keystr(path), err, scale)


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree

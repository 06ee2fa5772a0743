"""The model pieces Gemma 3's images need (:mod:`jaxrl_llm.models.families.gemma.vision`, the
bidirectional ``blocks`` of :class:`~jaxrl_llm.models.AttentionMask`): hand-computed block ids
and insertion, the block mask by hand, blockwise attention equal to naive attention with
blocks that straddle its key blocks (values and gradients), and a prompt's cached prefill
equal to the uncached forward. The parity with transformers is tests/interop/test_vision_gemma3.py.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models as M
from jaxrl_llm.models import AttentionMask
from jaxrl_llm.models.attention_mask import causal_self_mask, mask_allows
from jaxrl_llm.models.blockwise import blockwise_attention
from jaxrl_llm.models.families.gemma import vision as V


def test_image_blocks_number_each_run_of_placeholders():
    tokens = jnp.asarray([[1, 9, 9, 3, 9, 9, 9, 4], [9, 5, 5, 5, 5, 5, 9, 9]])
    want = [[-1, 0, 0, -1, 1, 1, 1, -1], [0, -1, -1, -1, -1, -1, 1, 1]]
    np.testing.assert_array_equal(np.asarray(V.image_blocks(tokens, 9)), want)


def test_insert_image_features_fills_placeholders_in_reading_order():
    tokens = jnp.asarray([[1, 9, 9, 3], [9, 9, 4, 5]])
    embeds = jnp.zeros((2, 4, 2))
    feats = jnp.asarray([[[1.0, 1.0], [2.0, 2.0]], [[3.0, 3.0], [4.0, 4.0]]])  # 2 images, m=2
    out = np.asarray(V.insert_image_features(embeds, tokens, feats, 9))
    np.testing.assert_array_equal(out[:, :, 0], [[0, 1, 2, 0], [3, 4, 0, 0]])


def test_block_mask_by_hand():
    # tokens: text, image block 0 (slots 1-2), text: slot 1 sees slot 2 (later, same block)
    blocks = jnp.asarray([[-1, 0, 0, -1]])
    mask = causal_self_mask(None, blocks=blocks, num_tokens=4)
    idx = jnp.arange(4)
    ok = np.asarray(mask_allows(mask, idx, idx, lambda x: x, lambda x: x, None))[0]
    want = np.tril(np.ones((4, 4), bool))
    want[1, 2] = True
    np.testing.assert_array_equal(ok, want)
    assert not mask.self_attention  # no fused kernel takes it


def test_blockwise_equals_naive_with_blocks_across_key_blocks():
    rng = np.random.default_rng(0)
    b, t, kh, g, e = 2, 13, 1, 3, 8
    q, k, v = (
        jnp.asarray(rng.standard_normal(s, np.float32))
        for s in ((b, t, kh * g, e), (b, t, kh, e), (b, t, kh, e))
    )
    blocks = jnp.asarray([[-1, 0, 0, 0, 0, 0, -1, -1, 1, 1, 1, -1, -1], [-1] * 6 + [0] * 7])
    valid = jnp.asarray([[True] * 13, [False, False] + [True] * 11])
    mask = causal_self_mask(valid, blocks=blocks)

    def run(fn):
        def f(q, k, v):
            return jnp.sum(fn(q, k, v) * jnp.cos(jnp.arange(e)))

        return jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v)

    naive = run(lambda q, k, v: M.naive_attention(q, k, v, mask))
    block = run(lambda q, k, v: blockwise_attention(q, k, v, mask, block_q=4, block_k=4))
    for a, c in zip(jax.tree.leaves(naive), jax.tree.leaves(block), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-5)
    causal = run(lambda q, k, v: M.naive_attention(q, k, v, causal_self_mask(valid)))
    assert abs(float(causal[0]) - float(naive[0])) > 1e-3  # the blocks changed the result


def test_cached_prefill_with_blocks_equals_the_uncached_forward():
    config = M.ModelConfig.tiny(M.Family.GEMMA3)
    params = M.init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.asarray([[0, 1, 5, 5, 5, 7, 8], [3, 5, 5, 2, 5, 5, 4]])
    mask = jnp.asarray([[0, 1, 1, 1, 1, 1, 1], [1] * 7])
    blocks = jnp.where(mask > 0, V.image_blocks(tokens, 5), -1)
    embeds = M.embed_tokens(config, params, tokens) * 1.5  # stand-in image features
    kw = dict(config=config, attention_mask=mask, embeds=embeds, blocks=blocks)
    full, _ = M.forward(params, tokens, **kw)
    cached, _ = M.forward(
        params,
        tokens,
        positions=M.default_positions(mask),
        cache=M.init_cache(config, 2, 10),
        **kw,
    )
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(cached)[real], np.asarray(full)[real], atol=1e-5)
    out = M.apply(params, tokens, **kw)  # the training forward takes them too
    logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full), atol=1e-5)
    plain, _ = M.forward(params, tokens, config=config, attention_mask=mask, embeds=embeds)
    assert np.abs(np.asarray(plain)[real] - np.asarray(full)[real]).max() > 1e-3


def test_attention_mask_keeps_blocks_as_pytree_leaves():
    m = AttentionMask(q_blocks=jnp.zeros((1, 2), jnp.int32), k_blocks=jnp.zeros((1, 2), jnp.int32))
    assert len(jax.tree.leaves(m)) == 2

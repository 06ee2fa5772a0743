import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_stepwise_equals_full_forward(family):
    c = M.ModelConfig.tiny(family)
    p = M.init_params(c, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, c.vocab_size)
    mask = jnp.ones((2, 9), bool).at[1, :3].set(False)  # left padding on row 1
    full, _ = M.forward(p, toks, config=c, attention_mask=mask)
    pos = M.default_positions(mask)
    cache = M.init_cache(c, 2, 16)
    step = jax.jit(
        lambda p, t, m, ps, cache: M.forward(
            p, t, config=c, attention_mask=m, positions=ps, cache=cache
        )
    )
    outs = []
    lg, cache = step(p, toks[:, :5], mask[:, :5], pos[:, :5], cache)
    outs.append(lg)
    for i in range(5, 9):
        lg, cache = step(p, toks[:, i : i + 1], mask[:, i : i + 1], pos[:, i : i + 1], cache)
        outs.append(lg)
    inc = jnp.concatenate(outs, 1)
    diff = jnp.where(mask[..., None], inc - full, 0.0)
    assert float(jnp.max(jnp.abs(diff))) <= 1e-5
    assert int(cache.index) == 9


def test_left_padding_does_not_change_real_token_logits():
    c = M.ModelConfig.tiny("llama")
    p = M.init_params(c, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (1, 6), 0, c.vocab_size)
    ref, _ = M.forward(p, toks, config=c)
    padded = jnp.concatenate([jnp.zeros((1, 3), toks.dtype), toks], 1)
    mask = jnp.arange(9)[None] >= 3
    got, _ = M.forward(p, padded, config=c, attention_mask=mask)
    np.testing.assert_allclose(got[:, 3:], ref, atol=1e-5)


def test_packing_with_segment_ids_equals_separate_sequences():
    c = M.ModelConfig.tiny("qwen3")
    p = M.init_params(c, jax.random.PRNGKey(0))
    a = jax.random.randint(jax.random.PRNGKey(1), (1, 4), 0, c.vocab_size)
    b = jax.random.randint(jax.random.PRNGKey(2), (1, 5), 0, c.vocab_size)
    la, _ = M.forward(p, a, config=c)
    lb, _ = M.forward(p, b, config=c)
    packed = jnp.concatenate([a, b], 1)
    seg = jnp.array([[0] * 4 + [1] * 5])
    lp, _ = M.forward(p, packed, config=c, segment_ids=seg)
    np.testing.assert_allclose(lp[:, :4], la, atol=1e-5)
    np.testing.assert_allclose(lp[:, 4:], lb, atol=1e-5)


def test_param_count_and_logical_axes_cover_every_parameter():
    for fam in FAMILIES:
        c = M.ModelConfig.tiny(fam, num_labels=1)
        p = M.init_params(c, jax.random.PRNGKey(0))
        axes = M.param_logical_axes(c)
        flat_p = jax.tree_util.tree_leaves_with_path(p)
        flat_a = dict(
            jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))
        )
        assert c.num_params() == sum(x.size for _, x in flat_p)
        for path, leaf in flat_p:
            assert len(flat_a[path]) == leaf.ndim, path
        out = M.apply(p, jnp.zeros((2, 3), jnp.int32), config=c)
        assert out.scalar.shape == (2, 3) and out.hidden.shape == (2, 3, c.hidden_size)


def test_config_validation_errors_are_clear():
    with pytest.raises(ValueError, match="num_kv_heads"):
        M.ModelConfig.tiny(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="dtype"):
        M.ModelConfig.tiny(param_dtype="float64x")


def test_bfloat16_compute_runs_and_is_close():
    c32 = M.ModelConfig.tiny("llama")
    c16 = M.ModelConfig.tiny("llama", compute_dtype="bfloat16")
    p = M.init_params(c32, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, c32.vocab_size)
    a, _ = M.forward(p, toks, config=c32)
    b, _ = M.forward(p, toks, config=c16)
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=5e-2)


def _grouped_batch(c, groups=2, g=3, tp=5, tc=4, seed=1):
    """Left-padded prompts shared by G rows each, then completions with padding after EOS."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    prompts = jax.random.randint(k1, (groups, tp), 0, c.vocab_size)
    p_mask = jnp.ones((groups, tp), bool).at[1, :2].set(False)
    comps = jax.random.randint(k2, (groups * g, tc), 0, c.vocab_size)
    c_mask = jnp.ones((groups * g, tc), bool).at[1, 2:].set(False).at[4, 1:].set(False)
    toks = jnp.concatenate([jnp.repeat(prompts, g, 0), comps], 1)
    mask = jnp.concatenate([jnp.repeat(p_mask, g, 0), c_mask], 1)
    return toks, mask


#: Gemma 4 with KV sharing (the last 2 of 4 layers reuse layers 0 and 1's keys/values).
GEMMA4_KV_SHARED = dict(
    layer_types=("sliding_attention", "full_attention") * 2,
    kv_shared_layers=2,
    double_wide_mlp=True,
    intermediate_size=160,
)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma4_kv_shared"])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_shared_prefix_trunk_equals_plain_trunk_values_and_grads(family, remat):
    if family == "gemma4_kv_shared":
        c = M.ModelConfig.tiny("gemma4_text", num_labels=1, **GEMMA4_KV_SHARED)
    else:
        c = M.ModelConfig.tiny(family, num_labels=1)
    p = M.init_params(c, jax.random.PRNGKey(0))
    toks, mask = _grouped_batch(c)
    w = jax.random.normal(jax.random.PRNGKey(3), (toks.shape[0], toks.shape[1], c.hidden_size))
    real = mask[..., None]

    def objective(params, shared):
        out = M.apply(
            params,
            toks,
            config=c,
            attention_mask=mask,
            remat=remat,
            shared_prefix=(5, 3) if shared else None,
        )
        return jnp.sum(jnp.where(real, out.hidden * w, 0.0)) + jnp.sum(out.scalar * mask), out

    (v0, o0), g0 = jax.value_and_grad(objective, has_aux=True)(p, False)
    (v1, o1), g1 = jax.value_and_grad(objective, has_aux=True)(p, True)
    np.testing.assert_allclose(
        np.where(real, o1.hidden, 0), np.where(real, o0.hidden, 0), atol=2e-5
    )
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        # float32 rounding scales with the leaf's gradients (Gemma 4's reach |g| ~ 75 here)
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, atol=1e-4 * scale, rtol=1e-4)


def test_shared_prefix_rejects_a_batch_that_is_not_whole_groups():
    c = M.ModelConfig.tiny("llama")
    p = M.init_params(c, jax.random.PRNGKey(0))
    toks, mask = _grouped_batch(c)
    with pytest.raises(ValueError, match="whole number of groups"):
        M.trunk_shared_prefix(p, toks[:5], config=c, prefix_len=5, group_size=3)
    with pytest.raises(ValueError, match="prefix_len"):
        M.trunk_shared_prefix(p, toks, config=c, prefix_len=9, group_size=3)


@pytest.mark.parametrize("separate", [False, True], ids=["stacked weights", "separate layers"])
def test_layered_cache_equals_the_stacked_cache(separate):
    # one [1, B, S, K, E] buffer per layer (the samplers' cache, read in place on TPU) holds
    # and returns what the stacked [L, B, S, K, E] cache does, step by step
    c = M.ModelConfig.tiny("llama")
    p = M.init_params(c, jax.random.PRNGKey(0))
    if separate:
        p = M.separate_layers(p, c)
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, c.vocab_size)
    mask = jnp.ones((2, 8), bool).at[1, :2].set(False)
    pos = M.default_positions(mask)
    step = jax.jit(
        lambda p, t, m, ps, cache: M.forward(
            p, t, config=c, attention_mask=m, positions=ps, cache=cache
        )
    )
    caches = {lay: M.init_cache(c, 2, 12, layered=lay) for lay in (False, True)}
    assert isinstance(caches[True].k, tuple) and len(caches[True].k) == c.num_layers
    assert caches[True].max_len == caches[False].max_len == 12
    for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 8)]:
        out = {}
        for lay in (False, True):
            out[lay], caches[lay] = step(
                p, toks[:, lo:hi], mask[:, lo:hi], pos[:, lo:hi], caches[lay]
            )
        np.testing.assert_allclose(out[True], out[False], rtol=1e-6, atol=1e-6)
    stacked = jnp.concatenate(caches[True].k, axis=0)
    np.testing.assert_array_equal(stacked, caches[False].k)
    np.testing.assert_array_equal(jnp.concatenate(caches[True].v, axis=0), caches[False].v)


def test_layered_cache_refuses_a_stack_it_cannot_index():
    # a hybrid stack scans its periods (its attention layers at a traced index)
    with pytest.raises(ValueError, match="layered"):
        M.init_cache(M.ModelConfig.tiny("qwen3_5_text"), 1, 4, layered=True)
    assert M.layered_cache_supported(M.ModelConfig.tiny("llama"))

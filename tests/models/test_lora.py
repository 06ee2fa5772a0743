import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.models.lora import LoRAConfig, attach_lora, init_lora, lora_logical_axes, merge_lora


def test_lora_starts_at_base_and_merge_is_low_rank_update():
    c = M.ModelConfig.tiny("qwen2")
    base = M.init_params(c, jax.random.PRNGKey(0))
    lc = LoRAConfig(rank=2, alpha=4.0)
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, c.vocab_size)
    ref, _ = M.forward(base, toks, config=c)
    got, _ = M.forward(merge_lora(base, ad, lc), toks, config=c)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    leaves, tdef = jax.tree.flatten(ad)
    keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
    ad = jax.tree.unflatten(
        tdef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    )
    merged = merge_lora(base, ad, lc)
    delta = merged["layers"]["o_proj"]["kernel"] - base["layers"]["o_proj"]["kernel"]
    L, H, E, D = delta.shape
    assert np.linalg.matrix_rank(np.asarray(delta[0]).reshape(H * E, D)) == 2
    expected = 2.0 * np.einsum(
        "ir,ro->io", ad["layers"]["o_proj"]["a"][0], ad["layers"]["o_proj"]["b"][0]
    )
    np.testing.assert_allclose(
        np.asarray(delta[0]).reshape(H * E, D), expected, rtol=1e-4, atol=1e-6
    )


def test_gradients_reach_adapters_only():
    c = M.ModelConfig.tiny("llama")
    base = M.init_params(c, jax.random.PRNGKey(0))
    lc = LoRAConfig(rank=3, targets=("q_proj", "down_proj"))
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, c.vocab_size)

    def loss(ad):
        lg, _ = M.forward(merge_lora(base, ad, lc), toks, config=c)
        return jnp.mean(lg**2)

    g = jax.grad(loss)(ad)
    assert set(g["layers"]) == {"q_proj", "down_proj"}
    assert float(jnp.abs(g["layers"]["q_proj"]["b"]).sum()) > 0  # B gets gradient at B = 0
    axes = lora_logical_axes(lc)
    for name in ("q_proj", "down_proj"):
        assert len(axes["layers"][name]["a"]) == ad["layers"][name]["a"].ndim


def test_bad_lora_config():
    with pytest.raises(ValueError, match="rank"):
        LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        LoRAConfig(targets=("qkv",))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_attached_adapters_equal_the_merged_tree_in_value_and_gradient(arch):
    """attach_lora (training: x W + (x A) B) and merge_lora (W + A B) are the same function of the
    adapters: equal logits, equal adapter gradients; with the shared-prompt trunk too."""
    c = M.ModelConfig.tiny(arch)
    base = M.init_params(c, jax.random.PRNGKey(0))
    lc = LoRAConfig(rank=2, alpha=6.0)
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    leaves, tdef = jax.tree.flatten(ad)
    keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
    ad = jax.tree.unflatten(
        tdef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    )
    toks = jax.random.randint(jax.random.PRNGKey(2), (4, 7), 0, c.vocab_size)
    mask = jnp.ones_like(toks).at[1, :2].set(0)

    def loss(ad, put):
        out = M.apply(put(base, ad, lc), toks, config=c, attention_mask=mask)
        lg = M.logits_from_hidden(put(base, ad, lc), out.hidden, c)
        return jnp.mean(jnp.tanh(lg) * jnp.arange(lg.shape[-1]) / lg.shape[-1])

    v_m, g_m = jax.value_and_grad(loss)(ad, merge_lora)
    v_a, g_a = jax.value_and_grad(loss)(ad, attach_lora)
    np.testing.assert_allclose(v_a, v_m, rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_m)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_a)) > 0
    # The attached tree is a plain params tree plus adapters: the shared-prompt trunk agrees.
    same = jnp.broadcast_to(toks[:1, :4], (4, 4))
    grouped = jnp.concatenate([same, toks[:, 4:]], axis=1)
    full, _ = M.trunk(attach_lora(base, ad, lc), grouped, config=c)
    shared = M.trunk_shared_prefix(
        attach_lora(base, ad, lc), grouped, config=c, prefix_len=4, group_size=4
    )
    np.testing.assert_allclose(shared, full, rtol=1e-4, atol=1e-5)


def test_attached_adapters_form_no_kernel_sized_gradient():
    """Differentiating through attach_lora never builds a [in, out] weight gradient: the
    compiled backward's dot products are all thin (rank-sized) or input gradients."""
    c = M.ModelConfig.tiny("llama")
    base = M.init_params(c, jax.random.PRNGKey(0))
    lc = LoRAConfig(rank=2)
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, c.vocab_size)

    def flops(put):
        def f(ad):
            out = M.apply(put(base, ad, lc), toks, config=c)
            return jnp.sum(out.hidden**2)

        ca = jax.jit(jax.grad(f)).lower(ad).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return float(ca["flops"])

    assert flops(attach_lora) < 0.9 * flops(merge_lora)

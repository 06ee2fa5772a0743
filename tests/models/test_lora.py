import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.models.lora import LoRAConfig, init_lora, lora_logical_axes, merge_lora


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
    ad = jax.tree.unflatten(tdef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    merged = merge_lora(base, ad, lc)
    delta = merged["layers"]["o_proj"]["kernel"] - base["layers"]["o_proj"]["kernel"]
    L, H, E, D = delta.shape
    assert np.linalg.matrix_rank(np.asarray(delta[0]).reshape(H * E, D)) == 2
    expected = 2.0 * np.einsum("ir,ro->io", ad["layers"]["o_proj"]["a"][0], ad["layers"]["o_proj"]["b"][0])
    np.testing.assert_allclose(np.asarray(delta[0]).reshape(H * E, D), expected, rtol=1e-4, atol=1e-6)


def test_gradients_reach_adapters_only():
    c = M.ModelConfig.tiny("llama")
    base = M.init_params(c, jax.random.PRNGKey(0))
    lc = LoRAConfig(rank=3, targets=("q_proj", "down_proj"))
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, c.vocab_size)

    def loss(ad):
        lg, _ = M.forward(merge_lora(base, ad, lc), toks, config=c)
        return jnp.mean(lg ** 2)

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

"""A tiny random Gemma 4 trains: the zero padding of its smaller heads, and the unused k/v
weights and MLP half of a KV-sharing stack, get no gradient (so they stay zero), an online GRPO step with either engine (the sampler's log-probs equal the
learner's in float32) and offline DPO steps that lower the DPO loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.models.params import padding_masks
from tests.models import family_steps

TINY = dict(family="gemma4_text")
# E2B / E4B's KV sharing: layers 2, 3 reuse the keys/values of layers 0, 1 (no k/v weights of
# their own), and their MLP is twice as wide (the other layers' second half stays zero).
KV_SHARED = dict(
    TINY,
    layer_types=["sliding_attention", "full_attention"] * 2,
    kv_shared_layers=2,
    double_wide_mlp=True,
    intermediate_size=160,
)


@pytest.mark.parametrize("tiny", [TINY, KV_SHARED], ids=["padded_heads", "kv_shared"])
def test_padding_is_zero_and_gets_no_gradient(tiny):
    config = models.ModelConfig.tiny(**tiny)
    assert config.has_padded_heads
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 23), 3, 97)
    mask = jnp.ones((2, 23), bool).at[1, :7].set(False)

    def loss(p):
        out = models.apply(p, toks, config=config, attention_mask=mask)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    grads = jax.grad(loss)(params)
    masks = padding_masks(config)
    assert ("gate_proj" in masks) == bool(config.double_wide_mlp)
    for name, sub in masks.items():
        for leaf, m in sub.items():
            w, g = params["layers"][name][leaf], grads["layers"][name][leaf]
            m = np.broadcast_to(m, w.shape)
            assert np.all(np.asarray(w)[m == 0] == 0), (name, leaf)
            assert np.all(np.asarray(g)[m == 0] == 0), (name, leaf)
            assert np.abs(np.asarray(g)[m == 1]).max() > 0, (name, leaf)
    assert not np.any(np.asarray(grads["layers"]["layer_scalar"]["value"]))


def test_gradients_reach_the_experts_and_the_per_layer_inputs():
    """With the MoE block beside the MLP and per-layer inputs, every parameter but the layer
    scalars gets a gradient."""
    config = models.ModelConfig.tiny(
        **TINY,
        moe_beside_mlp=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=40,
        per_layer_input_size=8,
    )
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 19), 3, 97)

    def loss(p):
        out = models.apply(p, toks, config=config)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1))

    grads = jax.grad(loss)(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        if "layer_scalar" in jax.tree_util.keystr(path):
            continue
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    family_steps.write_data(d)
    return d


@pytest.mark.parametrize("engine", ["static", "paged"])
@pytest.mark.parametrize("tiny", [TINY, KV_SHARED], ids=["padded_heads", "kv_shared"])
def test_grpo_step_and_sampler_logprobs_equal_the_learners(data, tmp_path, engine, tiny):
    _, config, before, after = family_steps.grpo_step(data, tmp_path / "grpo", tiny, engine)
    assert config.family == models.Family.GEMMA4
    assert config.kv_shared_layers == tiny.get("kv_shared_layers", 0)
    assert family_steps.moved(after, before, "k_proj") > 0


@pytest.mark.parametrize("tiny", [TINY, KV_SHARED], ids=["padded_heads", "kv_shared"])
def test_dpo_steps_lower_the_loss(data, tmp_path, tiny):
    config = family_steps.dpo_steps(data, tmp_path / "dpo", tiny)
    assert config.family == models.Family.GEMMA4 and config.has_padded_heads
    assert config.kv_shared_layers == tiny.get("kv_shared_layers", 0)

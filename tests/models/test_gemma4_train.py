"""A tiny random Gemma 4 trains: the zero padding of its smaller heads gets no gradient (so it
stays zero), an online GRPO step with either engine (the sampler's log-probs equal the
learner's in float32) and offline DPO steps that lower the DPO loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.models.transformer import head_padding_masks
from tests.models import family_steps

TINY = dict(family="gemma4_text")


def test_padding_is_zero_and_gets_no_gradient():
    config = models.ModelConfig.tiny(**TINY)
    assert config.has_padded_heads
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 23), 3, 97)
    mask = jnp.ones((2, 23), bool).at[1, :7].set(False)

    def loss(p):
        out = models.apply(p, toks, config=config, attention_mask=mask)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    grads = jax.grad(loss)(params)
    for name, sub in head_padding_masks(config).items():
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
def test_grpo_step_and_sampler_logprobs_equal_the_learners(data, tmp_path, engine):
    _, config, before, after = family_steps.grpo_step(data, tmp_path / "grpo", TINY, engine)
    assert config.family == models.Family.GEMMA4
    assert family_steps.moved(after, before, "k_proj") > 0


def test_dpo_steps_lower_the_loss(data, tmp_path):
    config = family_steps.dpo_steps(data, tmp_path / "dpo", TINY)
    assert config.family == models.Family.GEMMA4 and config.has_padded_heads

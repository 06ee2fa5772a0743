"""A tiny random Qwen3.5 (hybrid Gated DeltaNet + gated attention) trains: an online GRPO step
with either engine, where the sampler's log-probs equal the learner's recomputed ones
(``rollout.correction`` in float32: importance weights of one), and offline DPO steps that
lower the DPO loss; gradients reach every Gated DeltaNet parameter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from tests.models import family_steps

TINY = dict(family="qwen3_5_text", delta_chunk_size=16)


def test_gradients_reach_every_linear_layer_parameter():
    config = models.ModelConfig.tiny(**TINY)
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 37), 3, 97)
    mask = jnp.ones((2, 37), bool).at[1, :9].set(False)

    def loss(p):
        out = models.apply(p, toks, config=config, attention_mask=mask, remat="full")
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    grads = jax.grad(loss)(params)
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv", "delta", "out_proj"):
        for path, g in jax.tree_util.tree_leaves_with_path(grads["layers"][name]):
            assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, (name, path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    family_steps.write_data(d)
    return d


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_grpo_step_and_sampler_logprobs_equal_the_learners(data, tmp_path, engine):
    _, config, before, after = family_steps.grpo_step(data, tmp_path / "grpo", TINY, engine)
    assert config.is_hybrid
    assert family_steps.moved(after, before, "in_proj_qkv") > 0


def test_dpo_steps_lower_the_loss(data, tmp_path):
    config = family_steps.dpo_steps(data, tmp_path / "dpo", TINY)
    assert config.is_hybrid and config.family == models.Family.QWEN3_5

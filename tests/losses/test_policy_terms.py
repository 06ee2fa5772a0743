"""losses/policy_terms.py: the clipped policy-gradient loss reads the batch's rollout-correction
entries (``is_weights``, ``proximal_logp``) into objectives.policy_loss, and refuses them under
entropy control. (KL-Cov / Clip-Cov over parameters: tests/losses/test_policy.py.)"""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import losses
from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.policy_terms import surrogate_parts
from tests.losses.batches import loss_and_grad, rl_batch


def _with_den(batch, config):
    return {**batch, "loss_denominator": losses.policy_gradient_denominator(batch, config)}


def _weights(mask):
    m = np.asarray(mask) > 0
    return jnp.asarray(np.where(m, np.linspace(0.2, 1.8, m.size).reshape(m.shape), 0.0))


@pytest.mark.parametrize("entry", ["is_weights", "proximal_logp"])
def test_correction_entries_reach_the_objective(lm, entry):
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn, seed=2)
    cfg = losses.dapo_config()
    m = batch["loss_mask"]
    value = _weights(m) if entry == "is_weights" else batch["ref_logp"]  # any other policy
    corrected = _with_den({**batch, entry: value}, cfg)
    (loss, metrics), _ = loss_and_grad("dapo", cfg, apply_fn)(params, corrected)
    logp = losses.sequence_logps(params, batch, apply_fn=apply_fn)
    want, _ = obj.policy_loss(
        logp,
        batch["old_logp"],
        batch["advantages"],
        m,
        clip_eps=0.2,
        clip_eps_high=0.28,
        **{entry: value},
    )
    assert float(loss) == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    (plain, _), _ = loss_and_grad("dapo", cfg, apply_fn)(params, _with_den(batch, cfg))
    assert float(plain) != pytest.approx(float(loss), rel=1e-3)  # the entry changed the loss
    name = "pg/is_weight_mean" if entry == "is_weights" else "pg/behav_weight_mean"
    assert name in metrics


@pytest.mark.parametrize("control", ["kl_cov", "clip_cov"])
def test_entropy_control_refuses_correction_entries(control):
    logp = jnp.zeros((2, 3))
    mask = jnp.ones((2, 3))
    cfg = losses.grpo_config(entropy_control=control)
    batch = {"input_ids": jnp.zeros((2, 3), jnp.int32), "is_weights": mask}
    with pytest.raises(ConfigError, match="use one or the other"):
        surrogate_parts(logp, logp, jnp.ones((2,)), mask, batch, cfg, None)

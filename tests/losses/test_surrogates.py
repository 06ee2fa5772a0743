"""losses/surrogates.py: CISPO, SAPO and GMPO over parameters are the objectives of
objectives/surrogates.py on the model's log-probs, with the preset's hyperparameters and the
batch's rollout-correction weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import losses
from jaxrl_llm import objectives as obj
from tests.losses.batches import loss_and_grad, rl_batch

OBJECTIVES = {
    # the presets: CISPO with no lower bound (the paper's setting), ε_high 0.2; SAPO's τ;
    # GMPO's ε = 0.4
    "cispo": lambda *a, **kw: obj.cispo_loss(*a, clip_eps_low=None, clip_eps_high=0.2, **kw),
    "sapo": lambda *a, **kw: obj.sapo_loss(*a, tau_pos=1.0, tau_neg=1.05, **kw),
    "gmpo": lambda *a, **kw: obj.gmpo_loss(*a, clip_eps=0.4, **kw),
}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_loss_over_params_is_the_objective_on_the_models_logprobs(lm, name):
    _, params, apply_fn = lm
    spec, batch = losses.LOSSES[name], rl_batch(params, apply_fn)
    config = spec.preset()
    den = spec.denominator_fn(batch, config)
    args = (batch["old_logp"], batch["advantages"], batch["loss_mask"])
    want = lambda p: OBJECTIVES[name](  # noqa: E731
        losses.sequence_logps(p, batch, apply_fn=apply_fn), *args
    )[0]
    want_loss, want_grad = jax.jit(jax.value_and_grad(want))(params)
    (loss, metrics), grad = loss_and_grad(name, config, apply_fn)(
        params, {**batch, "loss_denominator": den}
    )
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5, abs=1e-7)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(want_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert "pg/approx_kl" in metrics and "entropy" in metrics


@pytest.mark.parametrize("name", ["cispo", "sapo"])
def test_rollout_weights_reach_the_objective(lm, name):
    _, params, apply_fn = lm
    spec, batch = losses.LOSSES[name], rl_batch(params, apply_fn, seed=1)
    config = spec.preset()
    m = np.asarray(batch["loss_mask"]) > 0
    w = jnp.asarray(np.where(m, np.linspace(0.0, 2.0, m.size).reshape(m.shape), 0.0), jnp.float32)
    batch = {**batch, "is_weights": w, "loss_denominator": spec.denominator_fn(batch, config)}
    (loss, metrics), _ = loss_and_grad(name, config, apply_fn)(params, batch)
    logp = losses.sequence_logps(params, batch, apply_fn=apply_fn)
    want, _ = OBJECTIVES[name](
        logp, batch["old_logp"], batch["advantages"], batch["loss_mask"], is_weights=w
    )
    assert float(loss) == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    assert float(metrics["pg/rollout_weight_mean"]) == pytest.approx(float(np.mean(w[m])))
    plain = loss_and_grad(name, config, apply_fn)(params, {**batch, "is_weights": jnp.ones_like(w)})
    assert float(plain[0][0]) != pytest.approx(float(loss), rel=1e-3)

"""Every registered loss: jit + value_and_grad with finite gradients; denominator contract."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import losses
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives.aggregation import AggregationMode
from tests.losses.batches import (
    kto_batch,
    loss_and_grad,
    pref_batch,
    rank_batch,
    rl_batch,
    seq_batch,
    tree_allclose,
)

EXPECTED = {
    "sft",
    "reward_model",
    "ppo_actor",
    "ppo_critic",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "reinforce",
    "reinforce_pp",
    "rloo",
    "remax",
    "dpo",
    "kto",
    "orpo",
    "simpo",
    "pairwise_rank",
    "cispo",
    "sapo",
    "gmpo",
    "distill",
}

PRESET_ARGS = {"pairwise_rank": dict(group_size=2), "dr_grpo": dict(max_len=8)}


def _batch_for(name, spec, params, apply_fn, config):
    kind = spec.batch_kind
    if kind == "sequence":
        batch = seq_batch()
    elif kind == "rl":
        batch = rl_batch(params, apply_fn)
    elif kind == "preference":
        batch = pref_batch()
    elif kind == "kto":
        batch = kto_batch()
    else:
        batch = rank_batch()
    if spec.reference_fn is not None:
        # A different "reference" model: perturbed params.
        ref_params = jax.tree.map(lambda p: p * 0.9, params)
        batch.update(spec.reference_fn(ref_params, batch, apply_fn=apply_fn, config=config))
    return batch


def test_registry_has_every_algorithm():
    assert set(losses.LOSSES) == EXPECTED


def test_get_loss_unknown_name_raises_config_error():
    with pytest.raises(ConfigError, match="available"):
        losses.get_loss("ppo2")
    assert losses.get_loss("dpo") is losses.LOSSES["dpo"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loss_jit_grad_finite_and_denominator(lm, name):
    _, params, apply_fn = lm
    spec = losses.LOSSES[name]
    config = spec.preset(**PRESET_ARGS.get(name, {}))
    assert isinstance(config, spec.config_cls)
    batch = _batch_for(name, spec, params, apply_fn, config)
    den = spec.denominator_fn(batch, config)
    assert den.shape == () and float(den) > 0
    vg = loss_and_grad(name, config, apply_fn)
    (loss, metrics), grads = vg(params, {**batch, "loss_denominator": den})
    assert loss.shape == () and np.isfinite(float(loss))
    assert float(metrics["loss"]) == pytest.approx(float(loss))
    for k, v in metrics.items():
        assert jnp.shape(v) == (), k
        assert np.isfinite(float(v)), k
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    assert sum(float(jnp.sum(jnp.abs(g))) for g in leaves) > 0
    # The loss is (sum) / loss_denominator: doubling the denominator halves loss and grads.
    (loss2, _), grads2 = vg(params, {**batch, "loss_denominator": 2 * den})
    np.testing.assert_allclose(float(loss2), float(loss) / 2, rtol=1e-5, atol=1e-7)
    tree_allclose(grads2, jax.tree.map(lambda g: g / 2, grads), rtol=1e-4, atol=1e-7)


def test_default_denominator_is_denominator_fn(lm):
    """Without loss_denominator a loss divides by its denominator_fn (checked un-jitted on a
    cheap loss of each reduction kind: tokens, pairs, groups)."""
    _, params, apply_fn = lm
    for name, batch in (
        ("sft", seq_batch()),
        ("simpo", pref_batch()),
        ("pairwise_rank", rank_batch()),
    ):
        spec = losses.LOSSES[name]
        config = spec.preset(**PRESET_ARGS.get(name, {}))
        (with_d, _), _ = loss_and_grad(name, config, apply_fn)(
            params, {**batch, "loss_denominator": spec.denominator_fn(batch, config)}
        )
        without, _ = spec.loss_fn(params, batch, apply_fn=apply_fn, config=config)
        np.testing.assert_allclose(float(without), float(with_d), rtol=1e-5)


def test_presets_encode_the_papers_differences():
    g = losses.grpo_config()
    assert (g.kl_coef, g.kl_kind.value, g.clip_eps) == (0.04, "k3", 0.2)
    assert g.aggregation is AggregationMode.SEQ_MEAN_TOKEN_MEAN
    d = losses.dapo_config()
    assert (d.clip_eps, d.clip_eps_high, d.kl_coef) == (0.2, 0.28, 0.0)
    assert d.aggregation is AggregationMode.TOKEN_MEAN
    dr = losses.dr_grpo_config(max_len=512)
    assert dr.aggregation is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM and dr.max_len == 512
    assert losses.ALGORITHMS["dr_grpo"].advantage is losses.AdvantageEstimator.GRPO_NO_STD
    gs = losses.gspo_config()
    assert gs.ratio_level.value == "sequence" and gs.clip_eps < 1e-3
    assert losses.reinforce_config().clip_eps is None
    assert losses.ppo_actor_config(entropy_coef=0.01).entropy_coef == 0.01


def test_configs_are_frozen_and_validated():
    c = losses.grpo_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.kl_coef = 0.0  # type: ignore[misc]
    c2 = dataclasses.replace(c, kl_coef=0.0)
    assert c.kl_coef == 0.04 and c2.kl_coef == 0.0
    with pytest.raises(ConfigError, match="aggregation"):
        losses.PolicyGradientConfig(aggregation="mean_of_everything")
    with pytest.raises(ConfigError, match="max_len"):
        losses.PolicyGradientConfig(aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ConfigError, match="kind"):
        losses.DPOConfig(kind="sigmoidal")
    with pytest.raises(ConfigError, match="label_smoothing"):
        losses.DPOConfig(kind="ipo", label_smoothing=0.1)
    with pytest.raises(ConfigError, match="group_size"):
        losses.PairwiseRankConfig(group_size=1)


def test_loss_configs_hold_only_hyperparameters():
    # How log-probs are computed (temperature, chunking, window, shared prompt) and which
    # advantage estimator the loop runs are not in any loss config.
    loop_fields = {"temperature", "chunk_size", "logprob_window", "prompt_group_size", "advantage"}
    for name, spec in losses.LOSSES.items():
        fields = {f.name for f in dataclasses.fields(spec.config_cls)}
        assert not fields & loop_fields, (name, fields & loop_fields)


def test_algorithm_table_states_what_each_algorithm_needs():
    A, F = losses.ALGORITHMS, losses.AlgorithmFamily
    assert set(A) >= {"ppo", "grpo", "online_dpo", "sft", "dpo", "ipo"}
    for name, algo in A.items():
        assert algo.loss in losses.LOSSES, name
        assert algo.online == (algo.family is not F.OFFLINE)
        if algo.family is F.GROUP_POLICY_GRADIENT:
            assert algo.advantage is not None, name
    assert A["ppo"].critic and A["ppo"].family is F.PPO and not A["ppo"].lora
    assert A["remax"].greedy_baseline and not A["grpo"].greedy_baseline
    assert A["online_dpo"].family is F.ONLINE_PAIRS and A["online_dpo"].min_group_size == 2
    assert A["ipo"].preset().kind.value == "ipo"
    assert A["reward_model"].trains_reward_head
    # the reference pass is asked of the loss config, not of the algorithm's name
    grpo = losses.LOSSES["grpo"]
    assert grpo.uses_reference(losses.grpo_config()) and not grpo.uses_reference(
        losses.grpo_config(kl_coef=0.0)
    )
    assert not losses.LOSSES["dpo"].uses_reference(losses.dpo_config(reference_free=True))
    with pytest.raises(ConfigError, match="allowed"):
        losses.get_algorithm("ppo2")


def test_traced_kl_coef_equals_the_config_value(lm):
    # hparams={"kl_coef": β} as a traced value gives the loss and gradient of config β.
    _, params, apply_fn = lm
    spec = losses.LOSSES["grpo"]
    cfg = losses.grpo_config(kl_coef=0.04)
    batch = _batch_for("grpo", spec, params, apply_fn, cfg)
    fixed = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, batch, apply_fn=apply_fn, config=losses.grpo_config(kl_coef=0.3)
    )
    traced = jax.jit(
        jax.value_and_grad(
            lambda p, beta: spec.loss_fn(
                p, batch, apply_fn=apply_fn, config=cfg, hparams={"kl_coef": beta}
            ),
            has_aux=True,
        )
    )(params, jnp.float32(0.3))
    np.testing.assert_allclose(traced[0][0], fixed[0][0], rtol=1e-5)
    tree_allclose(traced[1], fixed[1], atol=1e-5)
    with pytest.raises(ConfigError, match="cannot be traced"):
        spec.loss_fn(params, batch, apply_fn=apply_fn, config=cfg, hparams={"dual_clip": 2.0})


@pytest.mark.parametrize("old", sorted(losses.RENAMED))
def test_a_renamed_loss_resolves_by_its_old_name_with_a_warning(old):
    """The 8 losses renamed ``<algorithm>_model_loss`` in issue 41 (their old names clashed with
    ``objectives``' array-level functions) still resolve by the old name, and say the new one."""
    new = losses.RENAMED[old]
    assert new in losses.__all__ and old not in losses.__all__
    with pytest.warns(DeprecationWarning, match=f"jaxrl_llm.losses.{new}"):
        assert getattr(losses, old) is getattr(losses, new)
    assert losses.LOSSES[old.removesuffix("_loss")].loss_fn is getattr(losses, new)


def test_an_unknown_losses_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'dpo_losss'"):
        losses.dpo_losss  # noqa: B018

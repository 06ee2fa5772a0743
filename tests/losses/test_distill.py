"""The on-policy distillation loss (losses/distill.py): GKD's full-vocabulary JSD with the
teacher inside the loss, checked against the objective on logits computed straight from the
model, and the reverse-KL kind as the clipped policy gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import losses, models, objectives
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import DistillKind, LogprobSettings

P, M = 4, 5  # prompt columns (left-padded), completion columns (the log-prob window)


def online_batch(seed=0, n=4, vocab=64):
    """Rows as the online loop builds them: a left-padded prompt, then a right-padded
    completion in the last M columns."""
    rng = np.random.default_rng(seed)
    p_len = rng.integers(1, P + 1, n)
    c_len = rng.integers(1, M + 1, n)
    c_len[0] = M
    ids = rng.integers(3, vocab, (n, P + M)).astype(np.int32)
    col = np.arange(P + M)[None, :]
    prompt = (col >= P - p_len[:, None]) & (col < P)
    comp = (col >= P) & (col < P + c_len[:, None])
    attn = (prompt | comp).astype(np.int32)
    return {
        "input_ids": jnp.asarray(ids * attn),
        "attention_mask": jnp.asarray(attn),
        "loss_mask": jnp.asarray(comp.astype(np.int32)),
        "old_logp": jnp.zeros((n, P + M), jnp.float32),
        "advantages": jnp.zeros((n, P + M), jnp.float32),
    }


@pytest.fixture(scope="module")
def models_():
    cfg = models.ModelConfig.tiny()
    student = models.init_params(cfg, jax.random.PRNGKey(0))
    teacher = models.init_params(cfg, jax.random.PRNGKey(7))
    return cfg, student, teacher, functools.partial(models.apply, config=cfg)


def gkd(student, batch, apply_fn, teacher, config, lp=LogprobSettings(window=M)):
    return losses.distill_loss(
        student,
        batch,
        apply_fn=apply_fn,
        config=config,
        logprobs=lp,
        teacher=teacher,
        teacher_apply_fn=apply_fn,
    )


def full_logits(params, batch, apply_fn):
    out = apply_fn(params, batch["input_ids"], attention_mask=batch["attention_mask"])
    return jnp.einsum("btd,dv->btv", out.hidden, out.unembed)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gkd_loss_is_the_jsd_of_the_two_models_next_token_distributions(models_, beta):
    _, student, teacher, apply_fn = models_
    batch = online_batch()
    batch["teacher_input_ids"] = batch["input_ids"]
    batch["teacher_attention_mask"] = batch["attention_mask"]
    config = losses.distill_config(kind="gkd", beta=beta)
    loss, metrics = gkd(student, batch, apply_fn, teacher, config)
    # the same numbers from the objective on [B, T, V] logits (column t-1 predicts token t)
    s = full_logits(student, batch, apply_fn)[:, P - 1 : -1]
    t = full_logits(teacher, batch, apply_fn)[:, P - 1 : -1]
    want, _ = objectives.generalized_jsd_loss(s, t, batch["loss_mask"][:, P:], beta=beta)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    assert float(loss) > 0
    np.testing.assert_allclose(float(metrics["jsd"]), float(want), rtol=1e-5)
    assert float(metrics["pg/loss"]) == 0.0  # zero task advantages


def test_gkd_with_the_student_as_teacher_is_zero(models_):
    _, student, _, apply_fn = models_
    batch = online_batch(1)
    batch["teacher_input_ids"] = batch["input_ids"]
    batch["teacher_attention_mask"] = batch["attention_mask"]
    config = losses.distill_config(kind="gkd", beta=0.5)
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: gkd(p, batch, apply_fn, student, config), has_aux=True
    )(student)
    assert abs(float(loss)) < 1e-6
    assert float(metrics["teacher_student_top1_agree"]) == 1.0
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) < 1e-5


def test_gkd_teacher_prompt_of_another_width_scores_the_same_completion(models_):
    """The teacher's rows may be wider (its own prompt): left padding of the teacher's rows
    changes nothing, and the gradient flows into the student only."""
    _, student, teacher, apply_fn = models_
    batch = online_batch(2)
    batch["teacher_input_ids"] = batch["input_ids"]
    batch["teacher_attention_mask"] = batch["attention_mask"]
    config = losses.distill_config(kind="gkd", beta=0.3)
    ref, _ = gkd(student, batch, apply_fn, teacher, config)
    pad = 3
    wide = dict(batch)
    wide["teacher_input_ids"] = jnp.pad(batch["input_ids"], ((0, 0), (pad, 0)))
    wide["teacher_attention_mask"] = jnp.pad(batch["attention_mask"], ((0, 0), (pad, 0)))
    got, _ = gkd(student, wide, apply_fn, teacher, config)
    np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
    t_grad = jax.grad(lambda t: gkd(student, batch, apply_fn, t, config)[0])(teacher)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(t_grad))


def test_gkd_adds_the_task_surrogate_in_the_same_token_mean(models_):
    _, student, teacher, apply_fn = models_
    batch = online_batch(3)
    batch["teacher_input_ids"] = batch["input_ids"]
    batch["teacher_attention_mask"] = batch["attention_mask"]
    config = losses.distill_config(kind="gkd", beta=0.5)
    base, _ = gkd(student, batch, apply_fn, teacher, config)
    # on-policy (old_logp = logp, ratio 1): the surrogate of advantage A is -A per token
    lp = losses.sequence_logps(student, batch, apply_fn=apply_fn, window=M)
    with_adv = dict(batch, old_logp=lp, advantages=0.5 * batch["loss_mask"].astype(jnp.float32))
    got, metrics = gkd(student, with_adv, apply_fn, teacher, config)
    np.testing.assert_allclose(float(got), float(base) - 0.5, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["pg/loss"]), -0.5, rtol=1e-4)
    # the denominator contract: loss = sum / loss_denominator
    den = losses.distill_denominator(batch, config)
    assert float(den) == float(jnp.sum(batch["loss_mask"]))
    half, _ = gkd(student, {**batch, "loss_denominator": 2 * den}, apply_fn, teacher, config)
    np.testing.assert_allclose(float(half), float(base) / 2, rtol=1e-5)


def test_reverse_kl_kind_is_the_clipped_policy_gradient(models_):
    _, student, _, apply_fn = models_
    batch = online_batch(4)
    rng = np.random.default_rng(0)
    batch["advantages"] = jnp.asarray(rng.normal(size=batch["loss_mask"].shape), jnp.float32)
    batch["advantages"] = batch["advantages"] * batch["loss_mask"]
    lp = LogprobSettings(window=M)
    config = losses.distill_config(clip_eps=0.1)
    assert config.kind is DistillKind.REVERSE_KL
    got, _ = losses.distill_loss(student, batch, apply_fn=apply_fn, config=config, logprobs=lp)
    want, _ = losses.policy_gradient_loss(
        student,
        batch,
        apply_fn=apply_fn,
        config=losses.PolicyGradientConfig(clip_eps=0.1),
        logprobs=lp,
    )
    assert float(got) == float(want)


def test_distill_config_is_validated():
    with pytest.raises(ConfigError, match="beta=1.5"):
        losses.distill_config(kind="gkd", beta=1.5)
    with pytest.raises(ConfigError, match="kind='jsd'"):
        losses.distill_config(kind="jsd")
    with pytest.raises(ConfigError, match="needs kind='gkd'"):
        losses.distill_config(lmbda=0.5)
    assert losses.distill_config(kind="gkd", lmbda=0.5).lmbda == 0.5
    with pytest.raises(ConfigError, match="token_mean"):
        losses.distill_config(kind="gkd", aggregation="seq_mean_token_mean")
    spec = losses.LOSSES["distill"]
    assert spec.layout_kind(losses.distill_config()) == "rl"
    assert spec.layout_kind(losses.distill_config(kind="gkd")) == "distill"
    assert spec.uses_teacher(losses.distill_config(kind="gkd"))
    assert not spec.uses_teacher(losses.distill_config())

"""Policy-gradient family and PPO critic: hand values, config differences, accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import losses
from jaxrl_llm.errors import DataError
from tests.losses.batches import (
    logps,
    loss_and_grad,
    pad_rows,
    rl_batch,
    take_rows,
    tree_allclose,
    with_den,
)

GRPO = losses.grpo_config()
DR_GRPO = losses.dr_grpo_config(max_len=8)


def test_grpo_on_policy_value_is_minus_seq_mean_token_mean_advantage_plus_kl(lm):
    """ρ = 1 (old = current): L = mean_seq(mean_tok(−A)) + β·mean_seq(mean_tok(k3))."""
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    lp = np.asarray(logps(params, batch, apply_fn))
    batch["old_logp"] = jnp.asarray(lp)
    (loss, metrics), _ = loss_and_grad("grpo", GRPO, apply_fn)(
        params, with_den("grpo", batch, GRPO)
    )
    m = np.asarray(batch["loss_mask"]).astype(bool)
    adv, ref = np.asarray(batch["advantages"]), np.asarray(batch["ref_logp"])
    d = lp - ref
    k3 = np.exp(-d) + d - 1
    per_tok = -adv + 0.04 * k3
    expected = np.mean([per_tok[b][m[b]].mean() for b in range(m.shape[0])])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-6)
    assert float(metrics["pg/clipfrac"]) == 0.0
    np.testing.assert_allclose(float(metrics["kl"]), k3[m].mean(), rtol=1e-5)


def test_reinforce_gradient_is_vanilla_policy_gradient(lm):
    """Without old_logp the update is on-policy and the gradient is −∇ token_mean(A·log π)."""
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    cfg = losses.reinforce_config()
    on_policy = {k: v for k, v in batch.items() if k != "old_logp"}
    (_, _), g = jax.jit(
        jax.value_and_grad(
            lambda p, b: losses.policy_gradient_loss(p, b, apply_fn=apply_fn, config=cfg),
            has_aux=True,
        )
    )(params, on_policy)
    m = batch["loss_mask"]

    def vanilla(p):
        lp = losses.sequence_logps(p, batch, apply_fn=apply_fn)
        return -jnp.sum(batch["advantages"] * lp * m) / jnp.sum(m)

    tree_allclose(g, jax.jit(jax.grad(vanilla))(params), rtol=1e-4, atol=1e-7)


def test_clip_higher_is_data_dapo_keeps_gradient_where_grpo_clips(lm):
    """ρ = e^0.25 ≈ 1.284 > 1.2 with A > 0: PPO/GRPO-style clip (ε = 0.2) zeroes the
    gradient, DAPO's ε_high = 0.28 does not (1.284 > 1.28 too, so use ρ = e^0.22 ≈ 1.246)."""
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    m = np.asarray(batch["loss_mask"]).astype(bool)
    lp = np.asarray(logps(params, batch, apply_fn))
    batch["old_logp"] = jnp.asarray(np.where(m, lp - 0.22, 0.0))
    batch["advantages"] = jnp.asarray(np.where(m, 1.0, 0.0), jnp.float32)
    no_kl = losses.grpo_config(kl_coef=0.0, aggregation="token_mean")
    dapo = losses.dapo_config()
    (_, m_grpo), g_grpo = loss_and_grad("grpo", no_kl, apply_fn)(
        params, with_den("grpo", batch, no_kl)
    )
    (_, m_dapo), g_dapo = loss_and_grad("dapo", dapo, apply_fn)(
        params, with_den("dapo", batch, dapo)
    )
    norm = lambda g: sum(float(jnp.sum(jnp.abs(x))) for x in jax.tree.leaves(g))  # noqa: E731
    assert norm(g_grpo) == 0.0
    assert norm(g_dapo) > 0.0
    assert float(m_grpo["pg/clipfrac_high"]) == 1.0
    assert float(m_dapo["pg/clipfrac_high"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("grpo", GRPO), ("dr_grpo", DR_GRPO)])
def test_micro_batches_sum_to_full_batch(lm, name, config):
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    vg = loss_and_grad(name, config, apply_fn)
    full = with_den(name, batch, config)
    (l_full, _), g_full = vg(params, full)
    for k in (2, 4):
        tot_l, tot_g = 0.0, None
        for idx in np.array_split(np.arange(4), k):
            (l, _), g = vg(
                params, {**take_rows(batch, idx), "loss_denominator": full["loss_denominator"]}
            )
            tot_l += float(l)
            tot_g = g if tot_g is None else jax.tree.map(jnp.add, tot_g, g)
        np.testing.assert_allclose(tot_l, float(l_full), rtol=1e-5, atol=1e-7)
        tree_allclose(tot_g, g_full, rtol=1e-4, atol=1e-6)
    # Padding rows change nothing either.
    (l_pad, _), _ = vg(params, with_den(name, pad_rows(batch, 4), config))
    np.testing.assert_allclose(float(l_pad), float(l_full), rtol=1e-6)


def test_entropy_bonus_and_missing_reference(lm):
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    base = losses.ppo_actor_config()
    bonus = losses.ppo_actor_config(entropy_coef=0.5)
    (l0, m0), _ = loss_and_grad("ppo_actor", base, apply_fn)(
        params, with_den("ppo_actor", batch, base)
    )
    (l1, m1), _ = loss_and_grad("ppo_actor", bonus, apply_fn)(
        params, with_den("ppo_actor", batch, bonus)
    )
    assert float(m0["entropy"]) > 0
    np.testing.assert_allclose(float(l1), float(l0) - 0.5 * float(m0["entropy"]), rtol=1e-5)
    no_ref = {k: v for k, v in batch.items() if k != "ref_logp"}
    with pytest.raises(DataError, match="ref_logp"):
        losses.policy_gradient_loss(params, no_ref, apply_fn=apply_fn, config=GRPO)


def test_ppo_critic_clipped_value_loss_by_hand(lm):
    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    cfg = losses.ppo_critic_config(value_clip=0.2)
    (loss, metrics), _ = loss_and_grad("ppo_critic", cfg, apply_fn)(
        params, with_den("ppo_critic", batch, cfg)
    )
    out = apply_fn(params, batch["input_ids"], attention_mask=batch["attention_mask"])
    m = np.asarray(batch["loss_mask"]).astype(bool)
    v = np.zeros(m.shape)
    v[:, 1:] = np.asarray(out.scalar)[:, :-1]  # V(s_t) is the head at position t − 1
    old, ret = np.asarray(batch["values"]), np.asarray(batch["returns"])
    v_clip = old + np.clip(v - old, -0.2, 0.2)
    per = 0.5 * np.maximum((v - ret) ** 2, (v_clip - ret) ** 2)
    np.testing.assert_allclose(float(loss), per[m].mean(), rtol=1e-5)
    assert 0.0 < float(metrics["vf/clipfrac"]) <= 1.0
    np.testing.assert_allclose(
        np.asarray(losses.critic_values(params, batch, apply_fn=apply_fn)),
        np.where(m, v, 0.0),
        rtol=1e-5,
        atol=1e-6,
    )


# ----- entropy control (KL-Cov / Clip-Cov) as an option of the policy-gradient loss --------


def _objective_value_and_grad(params, batch, apply_fn, fn):
    """value_and_grad of ``fn(logp)`` with logp the policy's log-probs of ``batch``."""

    def f(p):
        lp = losses.sequence_logps(p, batch, apply_fn=apply_fn)
        return fn(lp)

    return jax.jit(jax.value_and_grad(f))(params)


def test_kl_cov_option_equals_the_objective(lm):
    """entropy_control=kl_cov: the loss and its gradient are objectives.kl_cov_loss's."""
    from jaxrl_llm import objectives

    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    cfg = losses.dapo_config(entropy_control="kl_cov", kl_cov_ratio=0.3, kl_cov_coef=0.5)
    (loss, metrics), g = loss_and_grad("dapo", cfg, apply_fn)(params, with_den("dapo", batch, cfg))
    m = batch["loss_mask"]

    def ref(lp):
        return objectives.kl_cov_loss(
            lp, batch["old_logp"], batch["advantages"], m, kl_cov_ratio=0.3, kl_coef=0.5
        )[0]

    want, g_want = _objective_value_and_grad(params, batch, apply_fn, ref)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    tree_allclose(g, g_want)
    # ⌊0.3·N⌋ of the N valid tokens are penalised
    n = int(np.asarray(m).sum())
    assert float(metrics["pg/kl_cov_frac"]) == pytest.approx(int(0.3 * n) / n)
    assert losses.policy_gradient_zero_batch(cfg) is None  # |log ρ| has a gradient at A = 0


def test_clip_cov_option_equals_the_objective_with_the_batch_key(lm):
    """entropy_control=clip_cov: the objective's loss and gradient with key=batch_key(ids);
    wide bounds and ratio 0.5 so that the detached subset changes the gradient."""
    from jaxrl_llm import objectives

    _, params, apply_fn = lm
    batch = rl_batch(params, apply_fn)
    kw = dict(clip_cov_ratio=0.5, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    cfg = losses.dapo_config(entropy_control="clip_cov", **kw)
    (loss, metrics), g = loss_and_grad("dapo", cfg, apply_fn)(params, with_den("dapo", batch, cfg))
    m = batch["loss_mask"]
    key = losses.batch_key(batch["input_ids"])

    def ref(lp, key=key):
        return objectives.clip_cov_loss(
            lp,
            batch["old_logp"],
            batch["advantages"],
            m,
            clip_eps=0.2,
            clip_eps_high=0.28,
            key=key,
            **kw,
        )[0]

    want, g_want = _objective_value_and_grad(params, batch, apply_fn, ref)
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    tree_allclose(g, g_want)
    assert float(metrics["pg/cov_clipfrac"]) > 0.3
    # another key detaches another subset: the gradient differs, so the key above is the one
    _, g_other = _objective_value_and_grad(
        params, batch, apply_fn, lambda lp: ref(lp, jax.random.PRNGKey(1))
    )
    diff = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_other))
    )
    assert diff > 1e-6
    # deterministic: the same batch gives the same key, another batch another
    assert jnp.array_equal(key, losses.batch_key(batch["input_ids"]))
    assert not jnp.array_equal(key, losses.batch_key(batch["input_ids"][::-1]))


def test_entropy_control_is_off_by_default_and_checked():
    from jaxrl_llm.errors import ConfigError

    assert losses.grpo_config().entropy_control is losses.EntropyControl.NONE
    with pytest.raises(ConfigError, match="token ratio"):
        losses.gspo_config(entropy_control="kl_cov")
    with pytest.raises(ConfigError, match="clip_cov_lb"):
        losses.grpo_config(entropy_control="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ConfigError, match="entropy_control"):
        losses.grpo_config(entropy_control="entropy")

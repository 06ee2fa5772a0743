"""Algorithm strategies: one small object per family that turns a step's
:class:`~jaxrl_llm.train.online.experience.Experience` into the learner's batch.

Every strategy implements :class:`~jaxrl_llm.train.online.strategy.Strategy`, built from
``(plan, policy, rollouts)``: what it needs is the plan's
(:attr:`~jaxrl_llm.train.config.plan.RunPlan.needs`), :meth:`Strategy.prepare` hands the learner
a batch in the plan's :attr:`~jaxrl_llm.train.config.plan.RunPlan.handover_layout`, and
:meth:`Strategy.companions` lists the models it trains beside the policy. The family comes
from the algorithm's registry entry (:class:`jaxrl_llm.losses.Algorithm`, ``family``);
:data:`STRATEGIES` is the one table from family to class:

* :class:`GroupPolicyGradient` — GRPO, Dr. GRPO, DAPO, GSPO, REINFORCE, REINFORCE++, RLOO,
  ReMax, CISPO, SAPO, GMPO: rewards → advantages with the entry's estimator (ReMax: the greedy
  completion's reward as baseline; process supervision: per-token advantages from step scores).
* :class:`PPOStrategy` — the critic's values, GAE on the KL-shaped reward (the critic's own
  update is a companion, :class:`Companion`).
* :class:`OnlinePairs` — online DPO: the best and worst sample of each group as a pair.
* :class:`~jaxrl_llm.train.online.distillation.Distillation` — on-policy distillation: a frozen
  teacher scores the student's samples (reverse-KL advantages, or GKD's teacher inputs for the
  step), plus ``distill.reward_weight`` × the rewards' group-normalised advantages.

A row that could not be scored (a failed episode or reward, ``Experience.valid`` false) carries
no gradient in any family: zero advantage in the group policy gradient, no pair in online DPO,
a zero loss weight in PPO and distillation; ``rewards/valid_frac`` counts it (the row
weights and advantages are :mod:`jaxrl_llm.train.online.advantages`').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives, ops
from jaxrl_llm import rewards as reward_lib
from jaxrl_llm.losses import AlgorithmFamily
from jaxrl_llm.parallel import over_processes
from jaxrl_llm.train.config.batch_layout import CRITIC_LAYOUT
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.online.advantages import (
    check_finite_output,
    estimate_advantages,
    invalid_to_zero,
    loss_weight,
    reference_cause,
    scored_weight,
    token_step_ids,
    with_valid_frac,
)
from jaxrl_llm.train.online.distillation import Distillation
from jaxrl_llm.train.online.experience import Experience, rl_batch
from jaxrl_llm.train.online.rollout import Rollouts
from jaxrl_llm.train.online.strategy import Companion, Prepared, Reference, Strategy
from jaxrl_llm.train.programs.builder import build_critic, critic_policy
from jaxrl_llm.train.programs.policy import Policy
from jaxrl_llm.train.programs.teacher import Teacher


class GroupPolicyGradient:
    """Group policy gradient: advantages from the rewards of each prompt's G samples."""

    def __init__(
        self,
        plan: RunPlan,
        policy: Policy,
        rollouts: Rollouts,
        *,
        log: Callable[[str], None] = print,
    ):
        self.plan, self.policy, self.rollouts, self.log = plan, policy, rollouts, log
        self.step_scorer: Any = None
        sec = plan.cfg.process_reward
        if sec is not None:
            assert rollouts.rewards is not None  # process supervision is single-turn (no env)
            self.step_scorer = reward_lib.build_step_scorer(
                sec.name, sec.kwargs, outcome=rollouts.rewards.specs[0].fn, delimiter=sec.delimiter
            )

    def companions(self) -> tuple[Companion, ...]:
        """None: the policy alone."""
        return ()

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """Advantages → the ``rl`` batch (+ ``ref_logp`` when the loss has a KL term)."""
        r, algo = self.plan.cfg.rollout, self.plan.algo
        metrics: dict[str, float] = {}
        if self.step_scorer is not None:
            adv, metrics = self.process_advantages(exp)
        else:
            baseline = self.rollouts.greedy_rewards(exp) if algo.greedy_baseline else None
            assert algo.advantage is not None
            adv = estimate_advantages(
                algo.advantage,
                exp.rewards,
                group_size=exp.group_size,
                scale=r.advantage_scale,
                mask=np.asarray(exp.rollout.mask),
                baseline=baseline,
            )
        adv = invalid_to_zero(adv, exp.valid)
        batch = rl_batch(exp, adv, loss_weight(r, exp))
        if self.plan.needs.reference_in_loss:
            assert reference is not None
            batch["ref_logp"] = np.asarray(reference(batch)["ref_logp"])
            check_finite_output(
                batch["ref_logp"],
                batch["loss_mask"],
                "the reference model's log-probs",
                reference_cause(self.plan),
            )
        return Prepared(batch, adv, with_valid_frac(exp, metrics))

    def process_advantages(self, exp: Experience) -> tuple[np.ndarray, dict]:
        """Token-level ``[N, M]`` GRPO process-supervision advantages from step scores."""
        sec = self.plan.cfg.process_reward
        assert sec is not None
        fields = {
            k: [e.get(k) for e in exp.extras] for k in sorted({k for e in exp.extras for k in e})
        }
        try:
            scores = reward_lib.process_rewards(
                self.step_scorer, exp.prompts, exp.texts, delimiter=sec.delimiter, **fields
            )
        except Exception as e:  # noqa: BLE001 - a failing scorer must not kill the run
            self.log(f"process reward failed for the whole batch ({type(e).__name__}: {e})")
            scores = [None] * len(exp.texts)
        scores = [None if s is None or not np.all(np.isfinite(s)) else s for s in scores]
        step_r, step_m = reward_lib.pad_step_rewards(scores)
        ro = exp.rollout
        ids, _ = token_step_ids(
            self.policy.tokenizer,
            np.asarray(ro.tokens),
            np.asarray(ro.lengths),
            exp.texts,
            sec.delimiter,
        )
        ids = np.where(ids < step_r.shape[1], ids, -1)
        adv = objectives.process_advantages(
            jnp.asarray(step_r), jnp.asarray(step_m), jnp.asarray(ids), group_size=exp.group_size
        )
        return np.asarray(adv), {
            "process/steps_mean": float(step_m.sum(1).mean()),
            "process/failed": sum(s is None for s in scores),
        }


class PPOStrategy:
    """PPO: a value head on a copy of the policy (its own optimizer and train step), GAE on the
    KL-shaped reward against a frozen reference (RLHF-PPO, Ouyang et al. 2022)."""

    def __init__(
        self,
        plan: RunPlan,
        policy: Policy,
        rollouts: Rollouts,
        *,
        log: Callable[[str], None] = print,
    ):
        self.plan = plan
        self.critic = critic_policy(plan, policy)
        self.critic_programs = build_critic(plan, self.critic)

    def companions(self) -> tuple[Companion, ...]:
        """The critic, updated on each of the policy's minibatches."""
        return (Companion("critic_checkpoints", self.critic, self.critic_update),)

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """KL-shaped token rewards → GAE with the critic's values (whitened advantages); the
        actor's batch keeps ``values``/``returns`` for the critic's update."""
        assert reference is not None
        cfg = self.plan.cfg
        scores = np.where(exp.valid, exp.rewards, 0.0)
        batch = rl_batch(exp, np.zeros(len(exp), np.float32), scored_weight(cfg.rollout, exp))
        ppo = cfg.ppo
        jb = {k: jnp.asarray(v) for k, v in batch.items()}
        ref_host = np.asarray(reference(batch)["ref_logp"])
        check_finite_output(
            ref_host,
            batch["loss_mask"],
            "the reference model's log-probs",
            reference_cause(self.plan),
        )
        ref_logp = jnp.asarray(ref_host)
        mask = jb["loss_mask"]
        values = jnp.asarray(self.critic_programs.values(self.critic.state.params, batch))
        token_r = objectives.kl_shaped_rewards(
            jnp.asarray(scores, jnp.float32),
            jb["old_logp"],
            ref_logp,
            mask,
            kl_coef=ppo.kl_coef,
            kind=ppo.kl_kind,
        )
        adv, returns = objectives.gae(token_r, values, mask, gamma=ppo.gamma, lam=ppo.lam)
        if ppo.whiten_advantages:  # over the whole step's tokens (every process's)
            adv = jnp.asarray(over_processes(objectives.whiten)(adv, mask))
        kl = objectives.kl_penalty(jb["old_logp"], ref_logp, kind=ppo.kl_kind)
        mean = over_processes(ops.masked_mean)
        adv_np = np.asarray(adv * mask)
        batch.update(
            advantages=adv_np, values=np.asarray(values), returns=np.asarray(returns * mask)
        )
        m = int(np.shape(exp.rollout.tokens)[1])
        return Prepared(
            batch,
            adv_np[:, -m:],  # the completion's columns: reported over the rollout's mask
            with_valid_frac(
                exp,
                {
                    "kl_to_ref": float(mean(kl, mask)),
                    "vf/value_mean": float(mean(values, mask)),
                },
            ),
        )

    def critic_update(self, sub: dict) -> dict:
        """One critic step on a minibatch (the actor's keys left out); metrics as ``critic/*``."""
        critic = {k: sub[k] for k in CRITIC_LAYOUT.names}
        self.critic.state, cm = self.critic_programs.train(self.critic.state, critic, {})
        return {f"critic/{k}": v for k, v in cm.items()}


class OnlinePairs:
    """Online / iterative DPO (Guo et al. 2024, https://arxiv.org/abs/2402.04792; Xiong et al.
    2024): in each group the best-scored sample is "chosen" and the worst "rejected"; groups
    whose samples all score the same (or failed) give no pair (masked out)."""

    def __init__(
        self,
        plan: RunPlan,
        policy: Policy,
        rollouts: Rollouts,
        *,
        log: Callable[[str], None] = print,
    ):
        self.plan = plan

    def companions(self) -> tuple[Companion, ...]:
        """None: the policy alone."""
        return ()

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """The preference batch of each group's best and worst sample (with the sampler's
        routing of each side, ``chosen_routing`` / ``rejected_routing``, when recorded)."""
        g = exp.group_size
        ro = exp.rollout
        n_groups = exp.num_groups
        r = np.where(exp.valid, exp.rewards, np.nan).reshape(n_groups, g)
        has = np.isfinite(r).sum(1) >= 2
        rr = np.where(np.isfinite(r), r, 0.0)
        best = np.argmax(np.where(np.isfinite(r), r, -np.inf), 1)
        worst = np.argmin(np.where(np.isfinite(r), r, np.inf), 1)
        has &= rr[np.arange(n_groups), best] > rr[np.arange(n_groups), worst]
        p_tok, p_mask = np.asarray(ro.prompt_tokens), np.asarray(ro.prompt_mask)
        c_tok, c_mask = np.asarray(ro.tokens), np.asarray(ro.mask)
        batch = {}
        for side, pick in (("chosen", best), ("rejected", worst)):
            rows = np.arange(n_groups) * g + pick
            ids = np.concatenate([p_tok[rows], c_tok[rows]], 1).astype(np.int32)
            attn = np.concatenate([p_mask[rows], c_mask[rows]], 1).astype(np.int32)
            lm = np.concatenate([np.zeros_like(p_mask[rows]), c_mask[rows] * has[:, None]], 1)
            batch.update(
                {
                    f"{side}_input_ids": ids,
                    f"{side}_attention_mask": attn,
                    f"{side}_loss_mask": lm.astype(np.int32),
                }
            )
            if exp.routing is not None:  # the sampler's experts of these rows (R3)
                batch[f"{side}_routing"] = np.asarray(exp.routing[rows], np.int32)
        if self.plan.needs.reference_in_loss:
            assert reference is not None
            batch.update({k: np.asarray(v) for k, v in reference(batch).items()})
            for key in ("ref_chosen_logps", "ref_rejected_logps"):
                if key in batch:
                    check_finite_output(
                        batch[key],
                        has,
                        "the reference model's log-probs",
                        reference_cause(self.plan),
                    )
        return Prepared(batch, None, with_valid_frac(exp, {"dpo/pairs": int(has.sum())}))


STRATEGIES: dict[AlgorithmFamily, Callable[..., Strategy]] = {
    AlgorithmFamily.GROUP_POLICY_GRADIENT: GroupPolicyGradient,
    AlgorithmFamily.PPO: PPOStrategy,
    AlgorithmFamily.ONLINE_PAIRS: OnlinePairs,
    AlgorithmFamily.DISTILLATION: Distillation,
}


def make_strategy(
    plan: RunPlan,
    policy: Policy,
    rollouts: Rollouts,
    *,
    log: Callable[[str], None] = print,
    teacher: Teacher | None = None,
) -> Strategy:
    """The strategy of the plan's algorithm family (see the module docstring); ``teacher``:
    the loaded teacher when the plan needs one (given to the family that reads it)."""
    extra = {"teacher": teacher} if teacher is not None else {}
    return STRATEGIES[plan.algo.family](plan, policy, rollouts, log=log, **extra)

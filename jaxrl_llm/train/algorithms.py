"""Algorithm strategies: one small object per family that turns a step's
:class:`~jaxrl_llm.train.experience.Experience` into the learner's batch.

The family comes from the algorithm's registry entry
(:class:`jaxrl_llm.losses.Algorithm`, ``family``); :func:`make_strategy` picks the class. Each
strategy says what it needs as data (``needs_reference``, ``critic``) so the loop asks instead
of comparing algorithm names:

* :class:`GroupPolicyGradient` — GRPO, Dr. GRPO, DAPO, GSPO, REINFORCE, REINFORCE++, RLOO,
  ReMax: rewards → advantages with the entry's estimator (ReMax: the greedy completion's
  reward as baseline; process supervision: per-token advantages from step scores).
* :class:`PPOStrategy` — the critic's values, GAE on the KL-shaped reward (the critic's own
  update is a second learner update, :meth:`PPOStrategy.critic_update`).
* :class:`OnlinePairs` — online DPO: the best and worst sample of each group as a pair.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives, ops
from jaxrl_llm import rewards as R
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import AdvantageEstimator, Algorithm, Family, critic_values, get_loss
from jaxrl_llm.parallel import batch_sharding
from jaxrl_llm.train.experience import Experience, rl_batch
from jaxrl_llm.train.policy import Policy, build_policy
from jaxrl_llm.train.rollout import Rollouts
from jaxrl_llm.train.run_config import RunConfig
from jaxrl_llm.train.step import make_train_step


def estimate_advantages(
    estimator: AdvantageEstimator,
    rewards: np.ndarray,
    *,
    group_size: int,
    scale: str,
    mask: np.ndarray,
    baseline: np.ndarray | None = None,
) -> np.ndarray:
    """Per-sequence ``[N]`` or per-token ``[N, M]`` advantages of ``rewards [N]`` with the
    algorithm's estimator (``mask [N, M]``: the completion tokens; ``baseline [N]``: ReMax's
    greedy rewards)."""
    r = jnp.asarray(rewards, jnp.float32)
    if estimator == AdvantageEstimator.GRPO:
        return np.asarray(objectives.grpo_advantages(r, group_size=group_size, scale=scale))
    if estimator == AdvantageEstimator.GRPO_NO_STD:
        return np.asarray(objectives.grpo_advantages(r, group_size=group_size, scale="none"))
    if estimator == AdvantageEstimator.RLOO:
        return np.asarray(objectives.rloo_advantages(r, group_size=group_size))
    if estimator == AdvantageEstimator.REMAX:
        return np.asarray(objectives.remax_advantages(r, jnp.asarray(baseline, jnp.float32)))
    m = jnp.asarray(mask, jnp.float32)
    if estimator == AdvantageEstimator.REINFORCE_PP:
        if group_size > 1:  # REINFORCE++ with its group baseline (mean of the group)
            return np.asarray(
                objectives.reinforce_pp_baseline_advantages(r, m, group_size=group_size)
            )
        last = jnp.maximum(m.sum(-1).astype(jnp.int32) - 1, 0)
        token_r = jnp.zeros_like(m).at[jnp.arange(m.shape[0]), last].set(r)
        return np.asarray(objectives.reinforce_pp_advantages(token_r, m))
    if estimator == AdvantageEstimator.REWARD:
        return np.asarray(r)
    raise ConfigError(f"advantage estimator {estimator.value!r} needs a critic: use algorithm: ppo")


def token_step_ids(
    tokenizer, tokens: np.ndarray, lengths: np.ndarray, texts: list[str], delimiter: str
) -> tuple[np.ndarray, list[list[tuple[str, int, int]]]]:
    """``[N, M]`` index of the reasoning step each completion token belongs to (−1: none).

    Steps are the character spans of :func:`jaxrl_llm.rewards.split_steps`; token i covers the
    characters between the decoded lengths of ``tokens[:i]`` and ``tokens[:i+1]`` and belongs
    to the first step that ends after its first character (delimiter tokens join the step
    that follows them; tokens after the last step get −1).
    """
    n, m = tokens.shape
    out = np.full((n, m), -1, np.int32)
    spans = []
    for i in range(n):
        steps = R.split_steps(texts[i], delimiter=delimiter)
        spans.append(steps)
        ends = [
            len(tokenizer.decode(tokens[i, : j + 1].tolist(), skip_special_tokens=True))
            for j in range(int(lengths[i]))
        ]
        start = 0
        for j, end in enumerate(ends):
            for s, (_, _, s_end) in enumerate(steps):
                if start < s_end:
                    out[i, j] = s
                    break
            start = end
    return out, spans


def invalid_to_zero(adv: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """A failed reward gives its row zero advantage (per-sequence or per-token)."""
    return np.where(valid if adv.ndim == 1 else valid[:, None], adv, 0.0)


def loss_weight(cfg: RunConfig, exp: Experience) -> np.ndarray:
    """``[N]`` int32 loss weight of each row: 0 for truncated rows with
    ``rollout.mask_truncated`` (DAPO), else 1."""
    if cfg.rollout.mask_truncated:
        return (~np.asarray(exp.rollout.truncated, bool)).astype(np.int32)
    return np.ones(len(exp), np.int32)


@dataclasses.dataclass
class Prepared:
    """A strategy's output: the learner batch, the advantages to report, metrics."""

    batch: dict[str, np.ndarray]
    advantages: np.ndarray | None
    metrics: dict[str, float]


class GroupPolicyGradient:
    """Group policy gradient: advantages from the rewards of each prompt's G samples."""

    def __init__(
        self,
        algo: Algorithm,
        cfg: RunConfig,
        *,
        policy: Policy,
        rollouts: Rollouts,
        loss_config: Any,
        log: Callable[[str], None],
    ):
        self.algo, self.cfg, self.policy, self.rollouts, self.log = algo, cfg, policy, rollouts, log
        self.needs_reference = algo.loss_spec().uses_reference(loss_config)
        self.step_scorer: Any = None
        if cfg.process_reward is not None:
            sec = cfg.process_reward
            assert rollouts.rewards is not None  # process supervision is single-turn (no env)
            self.step_scorer = R.build_step_scorer(
                sec.name, sec.kwargs, outcome=rollouts.rewards.specs[0].fn, delimiter=sec.delimiter
            )

    def prepare(self, exp: Experience, reference: Callable[[dict], dict] | None) -> Prepared:
        """Advantages → the ``rl`` batch (+ ``ref_logp`` when the loss has a KL term)."""
        r = self.cfg.rollout
        metrics: dict[str, float] = {}
        if self.step_scorer is not None:
            adv, metrics = self.process_advantages(exp)
        else:
            baseline = self.rollouts.greedy_rewards(exp) if self.algo.greedy_baseline else None
            assert self.algo.advantage is not None
            adv = estimate_advantages(
                self.algo.advantage,
                exp.rewards,
                group_size=exp.group_size,
                scale=r.advantage_scale,
                mask=np.asarray(exp.rollout.mask),
                baseline=baseline,
            )
        adv = invalid_to_zero(adv, exp.valid)
        batch = rl_batch(exp, adv, loss_weight(self.cfg, exp))
        if self.needs_reference and reference is not None:
            batch["ref_logp"] = np.asarray(reference(batch)["ref_logp"])
        return Prepared(batch, adv, metrics)

    def process_advantages(self, exp: Experience) -> tuple[np.ndarray, dict]:
        """Token-level ``[N, M]`` GRPO process-supervision advantages from step scores."""
        sec = self.cfg.process_reward
        assert sec is not None
        fields = {
            k: [e.get(k) for e in exp.extras] for k in sorted({k for e in exp.extras for k in e})
        }
        try:
            scores = R.process_rewards(
                self.step_scorer, exp.prompts, exp.texts, delimiter=sec.delimiter, **fields
            )
        except Exception as e:  # noqa: BLE001 - a failing scorer must not kill the run
            self.log(f"process reward failed for the whole batch ({type(e).__name__}: {e})")
            scores = [None] * len(exp.texts)
        scores = [None if s is None or not np.all(np.isfinite(s)) else s for s in scores]
        step_r, step_m = R.pad_step_rewards(scores)
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

    needs_reference = True

    def __init__(
        self,
        algo: Algorithm,
        cfg: RunConfig,
        *,
        policy: Policy,
        rollouts: Rollouts,
        loss_config: Any,
        log: Callable[[str], None],
    ):
        del algo, rollouts, loss_config, log
        self.cfg = cfg
        ccfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=cfg.ppo.critic_lr))
        config = dataclasses.replace(policy.config, num_labels=1)
        params = dict(jax.device_get(policy.state.params))
        params["score_head"] = {"kernel": np.zeros((config.hidden_size, 1), np.float32)}
        self.critic = build_policy(ccfg, config=config, params=params, tokenizer=policy.tokenizer)
        spec = get_loss("ppo_critic")
        closs = spec.preset(value_clip=cfg.ppo.value_clip)
        self.critic_step = make_train_step(
            self.critic.loss_fn(spec.loss_fn, loss_config=closs),
            self.critic.optimizer,
            mesh=self.critic.mesh,
            state_sharding=self.critic.state_sharding,
            batch_sharding=batch_sharding(self.critic.mesh),
            micro_batches=1,
            denominator_fn=functools.partial(spec.denominator_fn, config=closs),
            grad_clip=cfg.optim.grad_clip,
        )
        self._values_fn = jax.jit(functools.partial(critic_values, apply_fn=self.critic.apply_fn))

    def prepare(self, exp: Experience, reference: Callable[[dict], dict] | None) -> Prepared:
        """KL-shaped token rewards → GAE with the critic's values (whitened advantages); the
        actor's batch keeps ``values``/``returns`` for the critic's update."""
        assert reference is not None
        scores = np.where(exp.valid, exp.rewards, 0.0)
        batch = rl_batch(exp, np.zeros(len(exp), np.float32), loss_weight(self.cfg, exp))
        ppo = self.cfg.ppo
        jb = {k: jnp.asarray(v) for k, v in batch.items()}
        ref_logp = jnp.asarray(reference(batch)["ref_logp"])
        mask = jb["loss_mask"]
        values = self._values_fn(self.critic.state.params, jb)
        token_r = objectives.kl_shaped_rewards(
            jnp.asarray(scores, jnp.float32),
            jb["old_logp"],
            ref_logp,
            mask,
            kl_coef=ppo.kl_coef,
            kind=ppo.kl_kind,
        )
        adv, returns = objectives.gae(token_r, values, mask, gamma=ppo.gamma, lam=ppo.lam)
        if ppo.whiten_advantages:
            adv = objectives.whiten(adv, mask)
        kl = objectives.kl_penalty(jb["old_logp"], ref_logp, kind=ppo.kl_kind)
        adv_np = np.asarray(adv * mask)
        batch.update(
            advantages=adv_np, values=np.asarray(values), returns=np.asarray(returns * mask)
        )
        return Prepared(
            batch,
            adv_np,
            {
                "kl_to_ref": float(ops.masked_mean(kl, mask)),
                "vf/value_mean": float(ops.masked_mean(values, mask)),
            },
        )

    def critic_update(self, sub: dict) -> dict:
        """One critic step on a minibatch (the actor's keys left out); metrics as ``critic/*``."""
        actor_only = ("old_logp", "advantages", "is_weights", "proximal_logp")
        critic = {k: v for k, v in sub.items() if k not in actor_only}
        self.critic.state, cm = self.critic_step(self.critic.state, critic, {})
        return {f"critic/{k}": v for k, v in cm.items()}


class OnlinePairs:
    """Online / iterative DPO (Guo et al. 2024, https://arxiv.org/abs/2402.04792; Xiong et al.
    2024): in each group the best-scored sample is "chosen" and the worst "rejected"; groups
    whose samples all score the same (or failed) give no pair (masked out)."""

    def __init__(
        self,
        algo: Algorithm,
        cfg: RunConfig,
        *,
        policy: Policy,
        rollouts: Rollouts,
        loss_config: Any,
        log: Callable[[str], None],
    ):
        del cfg, policy, rollouts, log
        self.needs_reference = algo.loss_spec().uses_reference(loss_config)

    def prepare(self, exp: Experience, reference: Callable[[dict], dict] | None) -> Prepared:
        """The preference batch of each group's best and worst sample."""
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
        if self.needs_reference and reference is not None:
            batch.update({k: np.asarray(v) for k, v in reference(batch).items()})
        return Prepared(batch, None, {"dpo/pairs": int(has.sum())})


STRATEGIES: dict[Family, type] = {
    Family.GROUP_POLICY_GRADIENT: GroupPolicyGradient,
    Family.PPO: PPOStrategy,
    Family.ONLINE_PAIRS: OnlinePairs,
}


def make_strategy(algo: Algorithm, cfg: RunConfig, **kw):
    """The strategy object of ``algo``'s family (see the module docstring)."""
    return STRATEGIES[algo.family](algo, cfg, **kw)

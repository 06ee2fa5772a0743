"""Algorithm strategies: one small object per family that turns a step's
:class:`~jaxrl_llm.train.online.experience.Experience` into the learner's batch.

Every strategy implements :class:`Strategy`, built from ``(plan, policy, rollouts)``: what it
needs is the plan's (:attr:`~jaxrl_llm.train.config.plan.RunPlan.needs`), :meth:`Strategy.prepare`
hands the learner a batch in the plan's :attr:`~jaxrl_llm.train.config.plan.RunPlan.handover_layout`,
and :meth:`Strategy.companions` lists the models it trains beside the policy. The family comes
from the algorithm's registry entry (:class:`jaxrl_llm.losses.Algorithm`, ``family``);
:data:`STRATEGIES` is the one table from family to class:

* :class:`GroupPolicyGradient` — GRPO, Dr. GRPO, DAPO, GSPO, REINFORCE, REINFORCE++, RLOO,
  ReMax, CISPO, SAPO, GMPO: rewards → advantages with the entry's estimator (ReMax: the greedy
  completion's reward as baseline; process supervision: per-token advantages from step scores).
* :class:`PPOStrategy` — the critic's values, GAE on the KL-shaped reward (the critic's own
  update is a companion, :class:`Companion`).
* :class:`OnlinePairs` — online DPO: the best and worst sample of each group as a pair.
* :class:`Distillation` — on-policy distillation: a frozen teacher scores the student's
  samples (reverse-KL advantages, or GKD's teacher inputs for the step), plus
  ``distill.reward_weight`` × the rewards' group-normalised advantages.

A row that could not be scored (a failed episode or reward, ``Experience.valid`` false) carries
no gradient in any family: zero advantage in the group policy gradient, no pair in online DPO,
a zero loss weight in PPO and distillation (:func:`scored_weight`); ``rewards/valid_frac``
counts it (:func:`with_valid_frac`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives, ops
from jaxrl_llm import rewards as reward_lib
from jaxrl_llm.errors import ConfigError, ModelLoadError, TrainingError
from jaxrl_llm.losses import AdvantageEstimator, AlgorithmFamily
from jaxrl_llm.parallel import agree_width, gather_numbers, over_processes
from jaxrl_llm.train.config.plan import CRITIC_LAYOUT, RunPlan
from jaxrl_llm.train.config.sections import RolloutSection
from jaxrl_llm.train.online.experience import Experience, rl_batch
from jaxrl_llm.train.online.learner import context_padded
from jaxrl_llm.train.online.rollout import Rollouts
from jaxrl_llm.train.online.teacher import teacher_batch, with_data_completions
from jaxrl_llm.train.programs.builder import build_critic, build_teacher_programs, critic_policy
from jaxrl_llm.train.programs.policy import Policy
from jaxrl_llm.train.programs.teacher import Teacher


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
    if estimator not in _ESTIMATORS:
        raise ConfigError(
            f"advantage estimator {estimator.value!r} needs a critic: use algorithm: ppo"
        )
    fn = functools.partial(_ESTIMATORS[estimator], group_size=group_size, scale=scale)
    # across processes each holds its own groups: the estimator runs on the whole batch (a
    # batch-level scale or whitening is the whole step's), each gets its rows back
    return np.asarray(over_processes(fn)(rewards, mask, baseline))


def _grpo(r, mask, baseline, *, group_size, scale):
    return objectives.grpo_advantages(_f32(r), group_size=group_size, scale=scale)


def _grpo_no_std(r, mask, baseline, *, group_size, scale):
    return objectives.grpo_advantages(_f32(r), group_size=group_size, scale="none")


def _rloo(r, mask, baseline, *, group_size, scale):
    return objectives.rloo_advantages(_f32(r), group_size=group_size)


def _remax(r, mask, baseline, *, group_size, scale):
    return objectives.remax_advantages(_f32(r), _f32(baseline))


def _reinforce_pp(r, mask, baseline, *, group_size, scale):
    r, m = _f32(r), _f32(mask)
    if group_size > 1:  # REINFORCE++ with its group baseline (mean of the group)
        return objectives.reinforce_pp_baseline_advantages(r, m, group_size=group_size)
    # the row's last policy token (a multi-turn mask has the environment's tokens between)
    last = jnp.maximum(objectives.last_token_index(m), 0)
    token_r = jnp.zeros_like(m).at[jnp.arange(m.shape[0]), last].set(r)
    return objectives.reinforce_pp_advantages(token_r, m)


def _reward(r, mask, baseline, *, group_size, scale):
    return _f32(r)


def _f32(x):
    return jnp.asarray(x, jnp.float32)


_ESTIMATORS = {
    AdvantageEstimator.GRPO: _grpo,
    AdvantageEstimator.GRPO_NO_STD: _grpo_no_std,
    AdvantageEstimator.RLOO: _rloo,
    AdvantageEstimator.REMAX: _remax,
    AdvantageEstimator.REINFORCE_PP: _reinforce_pp,
    AdvantageEstimator.REWARD: _reward,
}


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
        steps = reward_lib.split_steps(texts[i], delimiter=delimiter)
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


def loss_weight(rollout: RolloutSection, exp: Experience) -> np.ndarray:
    """``[N]`` int32 loss weight of each row: 0 for truncated rows with
    ``rollout.mask_truncated`` (DAPO), else 1."""
    if rollout.mask_truncated:
        return (~np.asarray(exp.rollout.truncated, bool)).astype(np.int32)
    return np.ones(len(exp), np.int32)


def scored_weight(rollout: RolloutSection, exp: Experience) -> np.ndarray:
    """``[N]`` int32 :func:`loss_weight` with 0 for the rows that could not be scored (a
    failed episode, a failed reward: ``exp.valid`` false). The families whose per-token signal
    does not come from the reward alone (PPO's KL-shaped reward and critic, distillation's
    teacher) leave those rows out of the update with it, so that a failed episode carries no
    gradient, as its zero advantage gives in the group policy gradient."""
    return loss_weight(rollout, exp) * np.asarray(exp.valid, bool).astype(np.int32)


def check_finite_output(values: np.ndarray, mask: np.ndarray, what: str, cause: str) -> None:
    """Stop in one line when a frozen model's output (``what``: the teacher's or the
    reference's log-probs) is NaN or ±inf where the loss reads it (``mask``): the run would
    otherwise train on it, and the non-finite guard would blame the learning rate.

    Raises:
      TrainingError: naming the model and ``cause`` (its source).
    """
    read = np.broadcast_to(np.asarray(mask) > 0, np.shape(values))
    bad = read & ~np.isfinite(np.asarray(values, np.float64))
    if bad.any():
        raise TrainingError(
            f"{what} are non-finite (NaN or inf) on {int(bad.sum())} of {int(read.sum())} "
            f"values the loss reads; {cause} (optim.lr and the data are not the cause)"
        )


def _reference_cause(plan: RunPlan) -> str:
    return (
        f"the reference is the starting policy, model.source={plan.cfg.model.source!r}: its "
        f"weights hold NaN or inf"
    )


def with_valid_frac(exp: Experience, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with ``rewards/valid_frac`` as the share of rows with a valid score
    (``exp.valid``: a failed episode counts as unscored, where the reward functions alone
    count only their own failures), when the run reports it."""
    if "rewards/valid_frac" in exp.metrics:
        metrics["rewards/valid_frac"] = float(np.mean(exp.valid)) if len(exp) else 1.0
    return metrics


@dataclasses.dataclass
class Prepared:
    """A strategy's output: the learner batch, the advantages to report, metrics."""

    batch: dict[str, np.ndarray]
    advantages: np.ndarray | None
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Companion:
    """A model a strategy trains beside the policy (PPO's critic).

    Attributes:
      name: its checkpoint directory under the run (``critic_checkpoints``).
      policy: its :class:`~jaxrl_llm.train.programs.policy.Policy` (state checkpointed with the
        policy's, at the same steps).
      update: ``update(minibatch) -> metrics``, one update on each of the policy's
        minibatches (the plan's ``companion_fields`` included).
    """

    name: str
    policy: Policy
    update: Callable[[dict], dict]


Reference = Callable[[dict], dict]


class Strategy(Protocol):
    """What the online loop asks of an algorithm family (module docstring).

    Built as ``cls(plan, policy, rollouts, log=...)``; ``log`` prints one line.
    """

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """The learner batch of ``exp`` (``reference``: the frozen reference's entries of a
        batch, given when the plan needs a reference)."""
        ...

    def companions(self) -> tuple[Companion, ...]:
        """The models trained beside the policy."""
        ...


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
                _reference_cause(self.plan),
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
            _reference_cause(self.plan),
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
                        _reference_cause(self.plan),
                    )
        return Prepared(batch, None, with_valid_frac(exp, {"dpo/pairs": int(has.sum())}))


class Distillation:
    """On-policy distillation: the student (the policy) samples, a frozen teacher scores.

    ``loss.kind: reverse_kl`` — per-token advantages ``A_t = log π_T(y_t) − log π_S(y_t)``
    (Thinking Machines, "On-Policy Distillation", 2025,
    https://thinkingmachines.ai/blog/on-policy-distillation/;
    :func:`jaxrl_llm.objectives.reverse_kl_advantages`, discount ``loss.gamma``) on the ``rl``
    batch. Both log-probs come from the learner's log-prob code before the update (the
    teacher's forward sharded as the reference's), so a teacher equal to the student gives
    exactly zero. ``loss.kind: gkd`` — the teacher runs inside the step (GKD, Agarwal et al.
    2024, https://arxiv.org/abs/2306.13649): the batch carries its inputs
    (``teacher_input_ids`` / ``teacher_attention_mask``).

    ``distill.reward_weight`` w > 0 adds w × the task rewards' group-normalised advantages
    (GRPO's estimator) to every completion token's advantage. ``teacher.system_prompt``: the
    teacher reads its own prompt before the same completion (context distillation). GKD's
    ``loss.lmbda`` λ < 1: a step is on the student's samples with probability λ (a draw of
    (seed, learner version), so a resumed run draws the same), else on the data rows'
    ``completion`` (:func:`~jaxrl_llm.train.online.teacher.with_data_completions`; no task
    advantage then: the rewards scored the samples).
    """

    def __init__(
        self,
        plan: RunPlan,
        policy: Policy,
        rollouts: Rollouts,
        *,
        log: Callable[[str], None] = print,
        teacher: Teacher | None = None,
    ):
        if teacher is None:
            raise ConfigError(f"{plan.cfg.algorithm}: a teacher section is required")
        self.plan, self.policy, self.teacher = plan, policy, teacher
        t = plan.cfg.teacher
        self.teacher_source = t.source if t is not None else "?"
        check_finite_weights(teacher.params, f"teacher.source={self.teacher_source!r}")
        # jitted lazily: GKD calls only the student's forward, on its data steps
        self.programs = build_teacher_programs(plan, policy, teacher)

    def companions(self) -> tuple[Companion, ...]:
        """None: the teacher is frozen."""
        return ()

    def reward_advantages(self, exp: Experience) -> np.ndarray:
        """``[N]`` w × GRPO advantages of the rewards (0 for failed rows; all 0 for w = 0)."""
        w = self.plan.cfg.distill.reward_weight
        if w == 0:
            return np.zeros(len(exp), np.float32)
        adv = estimate_advantages(
            AdvantageEstimator.GRPO,
            exp.rewards,
            group_size=exp.group_size,
            scale=self.plan.cfg.rollout.advantage_scale,
            mask=np.asarray(exp.rollout.mask),
        )
        return (w * invalid_to_zero(adv, exp.valid)).astype(np.float32)

    def on_policy(self, exp: Experience) -> bool:
        """Whether this step trains on the student's samples (always, unless GKD's λ < 1)."""
        lmbda = self.plan.loss_config.lmbda
        if lmbda >= 1:
            return True
        version = int(np.min(exp.policy_version))
        return bool(np.random.default_rng([self.plan.cfg.seed, version]).random() < lmbda)

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """The ``rl`` batch with distillation advantages, or GKD's ``distill`` batch."""
        cfg, lc = self.plan.cfg, self.plan.loss_config
        m = int(np.shape(exp.rollout.tokens)[1])
        if not self.on_policy(exp):
            return self.prepare_data_step(exp, m)
        task = self.reward_advantages(exp)
        batch = rl_batch(exp, task, scored_weight(cfg.rollout, exp))
        t_batch = self.teacher_rows(batch, exp, m)
        if self.plan.needs.teacher_in_loss:  # GKD: the step runs the teacher on its inputs
            batch["teacher_input_ids"] = t_batch["input_ids"]
            batch["teacher_attention_mask"] = t_batch["attention_mask"]
            metrics = {"distill/on_policy": 1.0} if lc.lmbda < 1 else {}
            return Prepared(batch, batch["advantages"][:, -m:], with_valid_frac(exp, metrics))
        student = self.student_logps(batch)
        teacher = self.programs.teacher(
            self.teacher.params, {k: jnp.asarray(v) for k, v in t_batch.items()}
        )
        mask = jnp.asarray(batch["loss_mask"][:, -m:])
        check_finite_output(
            np.asarray(teacher[:, -m:]),
            np.asarray(mask),
            "the teacher's log-probs",
            f"its weights or its prompt hold NaN or inf (teacher.source={self.teacher_source!r})",
        )
        kl_adv = objectives.reverse_kl_advantages(
            jnp.asarray(student)[:, -m:], teacher[:, -m:], mask, gamma=lc.gamma
        )
        adv = np.asarray(kl_adv) + task[:, None] * np.asarray(mask)
        batch["advantages"][:, -m:] = adv
        batch["advantages"] = (batch["advantages"] * batch["loss_mask"]).astype(np.float32)
        per_token = -np.asarray(kl_adv)[np.asarray(mask) > 0]
        count, total = gather_numbers(np.array([per_token.size, per_token.sum()])).sum(0)
        return Prepared(
            batch,
            adv,
            with_valid_frac(exp, {"distill/reverse_kl": float(total / count) if count else 0.0}),
        )

    def teacher_rows(self, batch: dict, exp: Experience, m: int) -> dict[str, np.ndarray]:
        """The teacher's ``input_ids`` / masks of ``batch`` (its own prompt with
        ``teacher.system_prompt``, then the same ``m`` completion columns)."""
        rows = teacher_batch(
            batch,
            sources=exp.sources,
            completion_len=m,
            tokenizer=self.teacher.tokenizer,
            system_prompt=self.teacher.system_prompt,
            pad_id=self.policy.config.pad_token_id or 0,
        )
        # across processes: the widest process's teacher prompt (one global array)
        return agree_width(rows, pad_id=self.policy.config.pad_token_id or 0)

    def student_logps(self, batch: dict) -> np.ndarray:
        """``[N, T]`` the policy's log-probs of the batch's tokens before the update."""
        p = self.policy
        return np.asarray(
            context_padded(
                lambda b: self.programs.student(
                    p.state.params, {k: jnp.asarray(v) for k, v in b.items()}, **p.frozen()
                ),
                {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")},
                p,
            )
        )

    def prepare_data_step(self, exp: Experience, m: int) -> Prepared:
        """GKD on the data rows' completions: the ``distill`` batch with zero advantages and
        the policy's own log-probs as ``old_logp`` (ratio 1)."""
        data = with_data_completions(exp, self.policy.tokenizer)
        batch = rl_batch(
            data, np.zeros(len(data), np.float32), loss_weight(self.plan.cfg.rollout, data)
        )
        batch["old_logp"] = (self.student_logps(batch) * batch["loss_mask"]).astype(np.float32)
        t_batch = self.teacher_rows(batch, data, m)
        batch["teacher_input_ids"] = t_batch["input_ids"]
        batch["teacher_attention_mask"] = t_batch["attention_mask"]
        return Prepared(batch, None, with_valid_frac(exp, {"distill/on_policy": 0.0}))


def check_finite_weights(params: Any, what: str) -> None:
    """A frozen model whose weights hold NaN or inf is refused before its first step (its
    output would be, on every token).

    Raises:
      ModelLoadError: one line naming the model and its first bad tensor.
    """
    import jax

    finite = jax.device_get(jax.tree.map(lambda x: jnp.isfinite(x).all(), params))
    bad = [
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        for path, ok in jax.tree_util.tree_leaves_with_path(finite)
        if not bool(ok)
    ]
    if bad:
        raise ModelLoadError(
            f"{what}: its weights hold NaN or inf in {len(bad)} tensor(s) (first: {bad[0]}); "
            f"its outputs would be non-finite on every token: use an intact model"
        )


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

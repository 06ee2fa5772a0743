"""On-policy distillation's strategy (:class:`Distillation`): a frozen teacher scores the
student's samples. One family of :mod:`jaxrl_llm.train.online.algorithms`' table.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import AdvantageEstimator
from jaxrl_llm.parallel import agree_width, gather_numbers
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.online.advantages import (
    check_finite_output,
    check_finite_weights,
    estimate_advantages,
    invalid_to_zero,
    loss_weight,
    scored_weight,
    with_valid_frac,
)
from jaxrl_llm.train.online.experience import Experience, rl_batch
from jaxrl_llm.train.online.learner import context_padded
from jaxrl_llm.train.online.rollout import Rollouts
from jaxrl_llm.train.online.strategy import Companion, Prepared, Reference
from jaxrl_llm.train.online.teacher import teacher_batch, with_data_completions
from jaxrl_llm.train.programs.builder import build_teacher_programs
from jaxrl_llm.train.programs.policy import Policy
from jaxrl_llm.train.programs.teacher import Teacher


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

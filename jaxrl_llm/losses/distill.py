"""On-policy distillation losses: the student (the policy) learns from a frozen teacher on its
own samples. Two kinds (:class:`DistillKind`, ``loss.kind``):

* ``reverse_kl`` — the per-token reverse KL as an advantage (Thinking Machines, K. Lu et al.,
  "On-Policy Distillation", 2025, https://thinkingmachines.ai/blog/on-policy-distillation/):
  the online loop computes ``A_t = log π_T(y_t) − log π_S(y_t)``
  (:func:`jaxrl_llm.objectives.reverse_kl_advantages`) and this loss is the clipped policy
  gradient (:func:`~jaxrl_llm.losses.policy.policy_gradient_loss`) on the ``rl`` batch; no
  critic, no teacher inside the step.
* ``gkd`` — GKD's full-vocabulary generalised JSD(β) between the student's and the teacher's
  next-token distributions at every completion token (Agarwal et al. 2024, "On-Policy
  Distillation of Language Models: Learning from Self-Generated Mistakes",
  https://arxiv.org/abs/2306.13649, Eq. 1 and Algorithm 1 with λ = 1: on-policy samples only),
  :func:`jaxrl_llm.objectives.generalized_jsd`. The teacher runs inside the step as a frozen
  argument (``teacher=params``, ``teacher_apply_fn`` bound by the program builder), on the
  ``distill`` batch: the ``rl`` entries plus ``teacher_input_ids`` / ``teacher_attention_mask``
  ``[B, T']`` (the teacher's prompt, which may carry privileged context, followed by the same
  completion columns). The clipped surrogate on the batch's ``advantages`` is added in the same
  token mean (the task rewards' advantages; all zero for pure distillation).

We minimise: the reverse-KL surrogate is −objective, the JSD a divergence.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    ApplyFn,
    Batch,
    LogprobSettings,
    finish,
    require,
)
from jaxrl_llm.losses.policy import policy_gradient_denominator, policy_gradient_loss
from jaxrl_llm.losses.policy_config import PolicyGradientConfig
from jaxrl_llm.losses.policy_terms import surrogate_parts
from jaxrl_llm.objectives import coerce_enum
from jaxrl_llm.objectives.aggregation import AggregationMode
from jaxrl_llm.objectives.distillation import generalized_jsd
from jaxrl_llm.ops.logprobs import token_logprobs
from jaxrl_llm.ops.masked import masked_count, masked_mean, safe_divide


class DistillKind(str, enum.Enum):
    """How the teacher's distribution reaches the student (module docstring).

    ``reverse_kl``: sampled-token advantages through the clipped policy gradient (Thinking
    Machines 2025). ``gkd``: the full-vocabulary generalised JSD(β) (Agarwal et al. 2024).
    """

    REVERSE_KL = "reverse_kl"
    GKD = "gkd"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DistillConfig:
    """Hyperparameters of on-policy distillation.

    Attributes:
      kind: :class:`DistillKind` (default ``reverse_kl``).
      beta: GKD's β of JSD(β) ∈ [0, 1]: 0 forward KL(T‖S), 1 reverse KL(S‖T) (``gkd`` only;
        default 0.5, TRL's ``GKDConfig``; the paper sweeps it).
      gamma: discount γ ∈ [0, 1] of the reverse-KL advantages over the following tokens
        (``reverse_kl`` only; default 0: the per-token reverse KL of Thinking Machines 2025).
      lmbda: GKD's λ ∈ [0, 1], the share of steps that train on the student's own samples;
        the other steps train on the data rows' ``completion`` (GKD's Algorithm 1, "with
        probability λ generate from the student, else take the output from the data set";
        ``gkd`` only; default 1: on-policy only. The paper finds λ = 1 best in most tasks;
        TRL's ``GKDConfig`` defaults to 0.5).
      clip_eps, clip_eps_high: PPO's clip range of the policy-gradient surrogate (default
        0.2, Schulman et al. 2017; ``clip_eps_high`` None = ``clip_eps``).
      aggregation: how the surrogate's per-token terms reduce (``reverse_kl``; ``gkd`` is a
        token mean of JSD + surrogate, as GKD's and TRL's loss).
      max_len: the constant L of ``seq_mean_token_sum_norm`` (the generation budget).
    """

    kind: DistillKind = DistillKind.REVERSE_KL
    beta: float = 0.5
    gamma: float = 0.0
    lmbda: float = 1.0
    clip_eps: float | None = 0.2
    clip_eps_high: float | None = None
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN
    max_len: int | None = None

    def __post_init__(self):
        for name, cls in (("kind", DistillKind), ("aggregation", AggregationMode)):
            object.__setattr__(self, name, coerce_enum(cls, getattr(self, name), name))
        if not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"beta={self.beta} must be in [0, 1] (GKD's JSD(β))")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma={self.gamma} must be in [0, 1]")
        if not 0.0 <= self.lmbda <= 1.0:
            raise ConfigError(f"lmbda={self.lmbda} must be in [0, 1] (GKD's λ)")
        if self.lmbda < 1 and self.kind is not DistillKind.GKD:
            raise ConfigError(
                f"lmbda={self.lmbda}: training on the data set's completions (GKD's λ < 1) needs "
                f"kind='gkd'; the reverse-KL policy gradient is defined on the student's samples"
            )
        if self.kind is DistillKind.GKD and self.aggregation is not AggregationMode.TOKEN_MEAN:
            raise ConfigError(
                f"aggregation={self.aggregation.value!r}: kind='gkd' is a token mean of the "
                f"JSD (and the reward surrogate); use token_mean"
            )
        self.policy_gradient()  # validates the clip range and aggregation

    def policy_gradient(self) -> PolicyGradientConfig:
        """The :class:`PolicyGradientConfig` of the surrogate (no KL term, no entropy bonus)."""
        return PolicyGradientConfig(
            clip_eps=self.clip_eps,
            clip_eps_high=self.clip_eps_high,
            aggregation=self.aggregation,
            max_len=self.max_len,
        )


def distill_config(**overrides) -> DistillConfig:
    """On-policy distillation: reverse-KL advantages (Thinking Machines 2025) with PPO's clip
    ε = 0.2 and a token mean; ``kind="gkd"`` for GKD's JSD(β = 0.5)."""
    return DistillConfig(**overrides)


def distill_batch_kind(config: DistillConfig) -> str:
    """The batch layout a config reads: ``rl`` (reverse KL) or ``distill`` (GKD: the ``rl``
    entries and the teacher's inputs)."""
    return "distill" if config.kind is DistillKind.GKD else "rl"


def distill_uses_teacher(config: DistillConfig) -> bool:
    """True when the loss runs the teacher inside the step (GKD)."""
    return config.kind is DistillKind.GKD


def distill_denominator(batch: Batch, config: DistillConfig) -> jax.Array:
    """The full-batch denominator: the surrogate's (reverse KL), the completion tokens (GKD)."""
    if config.kind is DistillKind.REVERSE_KL:
        return policy_gradient_denominator(batch, config.policy_gradient())
    mask = require(batch, "loss_mask", loss="distill")
    return masked_count(mask.astype(bool)).astype(jnp.float32)


def window_logits(
    params: Any,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    apply_fn: ApplyFn,
    window: int | None,
    prompt_group_size: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """``(logits [B, W, V] float32, targets [B, W])`` of the last ``window`` columns: the
    logits at column t−1 predict ``input_ids[:, t]`` (soft-capped when the model caps).

    ``prompt_group_size`` G > 1: rows come in groups of G sharing every column before the
    window, computed once per group (:func:`jaxrl_llm.losses.common.forward_logps`)."""
    t = input_ids.shape[1]
    w = t - 1 if window is None else min(int(window), t - 1)
    kw: dict[str, Any] = {"attention_mask": attention_mask}
    if prompt_group_size > 1:
        kw["shared_prefix"] = (t - w, int(prompt_group_size))
    out = apply_fn(params, input_ids, **kw)
    if out.unembed is None:
        raise ConfigError("distillation needs language models (apply_fn returned no unembedding)")
    h = out.hidden[:, t - 1 - w : t - 1]
    logits = jnp.einsum("bwd,dv->bwv", h, out.unembed.astype(h.dtype)).astype(jnp.float32)
    if out.logit_softcap is not None:
        cap = out.logit_softcap
        logits = cap * jnp.tanh(logits / cap)
    return logits, input_ids[:, t - w :]


def gkd_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: DistillConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
    teacher: Any,
    teacher_apply_fn: ApplyFn,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GKD on on-policy samples: token mean of JSD(β) + the clipped surrogate on ``advantages``.

    ``L = Σ_t m_t [JSD(β)(π_S(·|y_<t) ‖ π_T(·|c_T, y_<t)) − min(ρ_t A_t, clip(ρ_t) A_t)] / Σ m``
    with the teacher's context ``c_T`` its own prompt (``teacher_input_ids``), both
    distributions at the log-prob temperature τ (Agarwal et al. 2024,
    https://arxiv.org/abs/2306.13649, Eq. 1; with ``A = 0`` the distillation term alone).
    The teacher's logits are constants (``stop_gradient``). Builds the window's ``[B, W, V]``
    logits of both models (not chunked: the window is the completion budget).

    Args:
      params: the student's parameters.
      batch: the ``distill`` layout: ``input_ids``, ``attention_mask``, ``loss_mask``,
        ``old_logp``, ``advantages`` ``[B, T]``, ``teacher_input_ids`` and
        ``teacher_attention_mask`` ``[B, T']`` whose last W columns are the same completion;
        optional ``loss_denominator``.
      apply_fn, teacher_apply_fn: the two models' apply functions.
      config: :class:`DistillConfig` with ``kind="gkd"``.
      logprobs: τ, the completion window W and the shared prompt of a group (applied to both).
      teacher: the teacher's parameters (frozen).

    Returns:
      ``(loss, metrics)``: ``loss``, ``jsd`` (token mean), ``jsd_max``,
      ``teacher_student_top1_agree``, ``pg/loss`` and the surrogate's ``pg/*`` metrics.
    """
    name = "distill"
    mask = require(batch, "loss_mask", loss=name)
    t_ids = require(batch, "teacher_input_ids", loss=name)
    t_attn = require(batch, "teacher_attention_mask", loss=name)
    window = logprobs.window
    if window is None:
        window = mask.shape[1] - 1
    window = min(window, mask.shape[1] - 1, t_ids.shape[1] - 1)
    group = logprobs.prompt_group_size
    s_logits, targets = window_logits(
        params,
        batch["input_ids"],
        batch["attention_mask"],
        apply_fn=apply_fn,
        window=window,
        prompt_group_size=group,
    )
    t_logits, _ = window_logits(
        teacher, t_ids, t_attn, apply_fn=teacher_apply_fn, window=window, prompt_group_size=group
    )
    t_logits = jax.lax.stop_gradient(t_logits)
    if s_logits.shape != t_logits.shape:
        raise ConfigError(
            f"gkd: the student's logits are {s_logits.shape[-1]} wide, the teacher's "
            f"{t_logits.shape[-1]}; full-vocabulary distillation needs one vocabulary"
        )
    m_w = mask[:, -window:]
    tau = logprobs.temperature
    jsd = generalized_jsd(s_logits, t_logits, m_w, beta=config.beta, temperature=tau)
    bool_m = m_w.astype(bool)
    jsd_num = jnp.sum(jsd)
    den = masked_count(bool_m).astype(jnp.float32)
    # the surrogate on the task advantages, from the same logits
    logp = jnp.where(bool_m, token_logprobs(s_logits, targets, temperature=tau), 0.0)
    adv = jnp.where(bool_m, require(batch, "advantages", loss=name)[:, -window:], 0.0)
    old = batch.get("old_logp")
    old = jax.lax.stop_gradient(logp) if old is None else jnp.where(bool_m, old[:, -window:], 0.0)
    pg_num, _, pg_metrics = surrogate_parts(
        logp, old, adv, m_w, batch, config.policy_gradient(), None
    )
    loss = finish(jsd_num + pg_num, den, batch)
    agree = jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1)
    metrics = {("pg/token_loss" if k == "pg_loss" else f"pg/{k}"): v for k, v in pg_metrics.items()}
    metrics.update(
        {
            "pg/loss": finish(pg_num, den, batch),
            "jsd": safe_divide(jsd_num, den),
            "jsd_max": jnp.max(jnp.where(bool_m, jsd, 0.0)),
            "teacher_student_top1_agree": masked_mean(agree.astype(jnp.float32), bool_m),
        }
    )
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    metrics["loss"] = loss
    return loss, metrics


def distill_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: DistillConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
    teacher: Any = None,
    teacher_apply_fn: ApplyFn | None = None,
    hparams: Mapping[str, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """On-policy distillation (module docstring): ``reverse_kl`` is the clipped policy
    gradient on the batch's distillation advantages
    (:func:`~jaxrl_llm.losses.policy.policy_gradient_loss`); ``gkd`` is :func:`gkd_loss`
    (needs ``teacher`` and ``teacher_apply_fn``).

    Returns:
      ``(loss, metrics)`` of the kind's loss.
    """
    if hparams:
        raise ConfigError(f"hparams {sorted(hparams)}: the distill loss traces none")
    if config.kind is DistillKind.REVERSE_KL:
        return policy_gradient_loss(
            params, batch, apply_fn=apply_fn, config=config.policy_gradient(), logprobs=logprobs
        )
    if teacher is None or teacher_apply_fn is None:
        raise ConfigError(
            "loss.kind=gkd runs the teacher in the step: pass teacher and its apply_fn"
        )
    return gkd_loss(
        params,
        batch,
        apply_fn=apply_fn,
        config=config,
        logprobs=logprobs,
        teacher=teacher,
        teacher_apply_fn=teacher_apply_fn,
    )

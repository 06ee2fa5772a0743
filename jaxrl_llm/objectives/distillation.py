"""On-policy distillation objectives: a teacher's distribution as a per-token signal.

Two ways to use a frozen teacher π_T on tokens the student π_S sampled itself:

* **Full vocabulary** (GKD, Agarwal et al. 2024, "On-Policy Distillation of Language Models:
  Learning from Self-Generated Mistakes", https://arxiv.org/abs/2306.13649, Eq. 1 and §3):
  :func:`generalized_jsd` is the generalised Jensen–Shannon divergence JSD(β) between the two
  next-token distributions at every position, and :func:`generalized_jsd_loss` its masked
  token mean (minimised; gradients flow into the student's logits only in practice, since the
  teacher's logits are constants the caller does not differentiate).
* **Sampled token** (the per-token reverse KL of Thinking Machines, K. Lu et al., "On-Policy
  Distillation", 2025, https://thinkingmachines.ai/blog/on-policy-distillation/; also GKD's
  RL view, §3.2): :func:`reverse_kl_advantages` gives the advantage
  ``A_t = log π_T(y_t) − log π_S(y_t)`` (the negative one-sample estimate of the reverse KL
  KL(π_S‖π_T) at token t), optionally discounted over the following tokens, for a
  policy-gradient loss such as :func:`policy_loss` (and summable with task advantages).

Conventions (the issue's endpoints, which are also TRL's ``GKDTrainer.generalized_jsd_loss``,
https://huggingface.co/docs/trl/gkd_trainer): with student S and teacher T (probabilities at
temperature τ, i.e. softmax(logits / τ)) and the mixture ``M = (1 − β)·S + β·T``::

    JSD(β) = β·KL(T‖M) + (1 − β)·KL(S‖M)      0 < β < 1
    JSD(0) = KL(T‖S)                            forward KL (mode covering, supervised KD)
    JSD(1) = KL(S‖T)                            reverse KL (mode seeking)

This is the paper's Eq. 1 with P = T and Q = S. Note the endpoints are defined separately:
the interior formula itself tends to 0 at both ends (it behaves like β·KL(T‖S) for small β and
(1 − β)·KL(S‖T) near 1, which is why the paper calls the endpoints forward and reverse KL);
both GKD and TRL use the plain KLs at β = 0 and β = 1, and so do we. At β = ½ it is the
symmetric Jensen–Shannon divergence, bounded by log 2.

Shapes: logits ``[B, T, V]``, log-probs and ``mask`` ``[B, T]`` (1 = real token); per-token
values come back ``[B, T]`` float32 and are 0 at masked positions.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives.advantages import discounted_returns
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregate_parts
from jaxrl_llm.ops.masked import masked_mean, safe_divide


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
    """``Σ_v p_v (log p_v − log q_v)`` over the last axis; terms with p_v = 0 are 0.

    Double-``where``: where p_v = 0 (a ``-inf`` log-prob) the difference may be NaN
    (−∞ − (−∞)); it is replaced before the product, so values and gradients stay finite.
    """
    p = jnp.exp(logp)
    ok = p > 0
    diff = jnp.where(ok, logp - jnp.where(ok, logq, 0.0), 0.0)
    return jnp.sum(p * diff, axis=-1)


def _mixture_log(log_s: jax.Array, log_t: jax.Array, beta) -> jax.Array:
    """``log((1 − β)·S + β·T)`` by log-sum-exp; ``-inf`` where both are 0, never NaN."""
    log_b = jnp.log(jnp.where(beta > 0, beta, 1.0))
    log_1mb = jnp.log(jnp.where(beta < 1, 1.0 - beta, 1.0))
    a = jnp.where(beta < 1, log_1mb + log_s, -jnp.inf)
    b = jnp.where(beta > 0, log_b + log_t, -jnp.inf)
    ok = (a > -jnp.inf) | (b > -jnp.inf)
    m = jnp.logaddexp(jnp.where(ok, a, 0.0), jnp.where(ok, b, 0.0))
    return jnp.where(ok, m, -jnp.inf)


def _interior_jsd(log_s: jax.Array, log_t: jax.Array, beta) -> jax.Array:
    log_m = _mixture_log(log_s, log_t, beta)
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)


def generalized_jsd(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array,
    *,
    beta: float | jax.Array,
    temperature: float = 1.0,
) -> jax.Array:
    """Per-token generalised Jensen–Shannon divergence JSD(β) of GKD, over the vocabulary.

    With ``S = softmax(student_logits / τ)``, ``T = softmax(teacher_logits / τ)`` and
    ``M = (1 − β)·S + β·T``::

        JSD(β) = β·KL(T‖M) + (1 − β)·KL(S‖M)    for 0 < β < 1,
        JSD(0) = KL(T‖S)   (forward KL),   JSD(1) = KL(S‖T)   (reverse KL).

    Agarwal et al. 2024, https://arxiv.org/abs/2306.13649, Eq. 1 (with P = teacher,
    Q = student); the endpoints and which weight goes with which KL follow the issue and TRL's
    ``GKDTrainer`` (``beta`` 0.5 there, https://huggingface.co/docs/trl/gkd_trainer). The
    endpoints are exact KLs, not the limit of the interior formula (which tends to 0): see the
    module docstring. Computed in float32 from log-softmax; the mixture's log is a
    ``logaddexp`` of ``log(1 − β) + log S`` and ``log β + log T``. Vocabulary entries with
    probability 0 (``-inf`` logits, e.g. a padded vocabulary) add 0 and keep gradients finite.

    The value is a divergence (≥ 0; 0 when the distributions agree); as a loss it is
    minimised directly (see :func:`generalized_jsd_loss`).

    Args:
      student_logits: ``[B, T, V]`` float logits of the student (the policy being trained).
      teacher_logits: ``[B, T, V]`` float logits of the frozen teacher (the caller stops its
        gradient).
      mask: ``[B, T]`` 1 = real token.
      beta: β ∈ [0, 1], a Python number or a traced scalar (no default: the paper sweeps it;
        TRL's is 0.5).
      temperature: τ > 0 applied to both logits (default 1.0, as TRL's
        ``generalized_jsd_loss``).

    Returns:
      ``[B, T]`` float32 per-token JSD(β), 0 at masked positions.
    """
    chex.assert_rank([student_logits, teacher_logits, mask], [3, 3, 2])
    chex.assert_equal_shape([student_logits, teacher_logits])
    chex.assert_equal_shape_prefix([student_logits, mask], 2)
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ConfigError(f"temperature={temperature} must be > 0")
    log_s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    log_t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    if isinstance(beta, (int, float)):
        if not 0.0 <= beta <= 1.0:
            raise ConfigError(f"beta={beta} must be in [0, 1]")
        if beta == 0:
            out = _kl(log_t, log_s)
        elif beta == 1:
            out = _kl(log_s, log_t)
        else:
            out = _interior_jsd(log_s, log_t, float(beta))
    else:
        beta = jnp.asarray(beta, jnp.float32)
        chex.assert_rank(beta, 0)
        out = jnp.where(
            beta == 0,
            _kl(log_t, log_s),
            jnp.where(beta == 1, _kl(log_s, log_t), _interior_jsd(log_s, log_t, beta)),
        )
    return jnp.where(mask.astype(bool), out, 0.0)


def generalized_jsd_loss_parts(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array,
    *,
    beta: float | jax.Array,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`generalized_jsd_loss` as ``(num, den, metrics)``, ``loss = num / den``.

    ``num`` is the sum of JSD(β) over mask-1 tokens and ``den`` their count, so micro-batches
    and devices accumulate to the exact global token mean. Arguments as
    :func:`generalized_jsd`.

    Returns:
      ``(num, den, metrics)`` float32 scalars and the metrics of :func:`generalized_jsd_loss`.
    """
    per_token = generalized_jsd(
        student_logits, teacher_logits, mask, beta=beta, temperature=temperature
    )
    num, den = aggregate_parts(per_token, mask, mode=AggregationMode.TOKEN_MEAN)
    m = mask.astype(bool)
    agree = jnp.argmax(student_logits, axis=-1) == jnp.argmax(teacher_logits, axis=-1)
    metrics = {
        "jsd": safe_divide(num, den),
        "jsd_max": jnp.max(jnp.where(m, per_token, 0.0)),
        "teacher_student_top1_agree": masked_mean(agree.astype(jnp.float32), m),
    }
    metrics = {k: jax.lax.stop_gradient(x) for k, x in metrics.items()}
    return num, den, metrics


def generalized_jsd_loss(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array,
    *,
    beta: float | jax.Array,
    temperature: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GKD's distillation loss: the masked token mean of :func:`generalized_jsd`.

    ``loss = Σ_{b,t} m_{bt}·JSD(β)_{bt} / max(Σ m, 1)`` (token mean, as TRL's
    ``generalized_jsd_loss`` with ``reduction="batchmean"`` and labels: a mean over
    response tokens). Minimised as is (a divergence, not an objective to maximise).
    Arguments as :func:`generalized_jsd`.

    Example: identical student and teacher logits give ``loss = 0`` for every β.

    Returns:
      ``(loss, metrics)``: scalar float32 loss; metrics (no gradient) ``jsd`` (the loss
      value), ``jsd_max`` (largest per-token value) and ``teacher_student_top1_agree``
      (fraction of real tokens where both argmax tokens agree).
    """
    num, den, metrics = generalized_jsd_loss_parts(
        student_logits, teacher_logits, mask, beta=beta, temperature=temperature
    )
    return safe_divide(num, den), metrics


def reverse_kl_advantages(
    student_logp: jax.Array,
    teacher_logp: jax.Array,
    mask: jax.Array,
    *,
    gamma: float = 0.0,
) -> jax.Array:
    """Per-token distillation advantages ``log π_T(y_t) − log π_S(y_t)``, optionally discounted.

    ``r_t = log π_T(y_t) − log π_S(y_t)`` is minus the one-sample estimate of the reverse KL
    at token t: for ``y_t ~ π_S``, ``E[−r_t] = KL(π_S‖π_T)`` at that position (Schulman's
    k1). The advantage is the discounted sum of the following terms,
    ``A_t = Σ_{k ≥ t} γ^{k − t} r_k`` over real tokens (:func:`discounted_returns`); the
    default γ = 0 gives ``A_t = r_t``, the per-token reverse KL with discount zero of Thinking
    Machines' "On-Policy Distillation" (2025,
    https://thinkingmachines.ai/blog/on-policy-distillation/). γ = 1 is the return of the
    sequence-level reverse KL (GKD's RL view, https://arxiv.org/abs/2306.13649, §3.2).

    Sign: positive where the teacher likes the sampled token more than the student, so
    maximising ``A_t·log π_S(y_t)`` (minimising :func:`policy_loss` with these advantages)
    lowers the reverse KL. Constants: the caller stops gradients through both inputs. Add
    task advantages to mix distillation with rewards, e.g.
    ``A = reverse_kl_advantages(...) + w·grpo_advantages(rewards, ...)[:, None]``.

    Args:
      student_logp: ``[B, T]`` float log π_S(y_t) of the sampled tokens (the student at
        sampling time).
      teacher_logp: ``[B, T]`` float log π_T(y_t) of the same tokens under the teacher.
      mask: ``[B, T]`` 1 = real token.
      gamma: discount γ ∈ [0, 1] over following tokens (default 0.0, Thinking Machines 2025).

    Returns:
      ``[B, T]`` float32 advantages, 0 at masked positions; masked positions do not count as
      steps for the discount.
    """
    chex.assert_rank([student_logp, teacher_logp, mask], 2)
    chex.assert_equal_shape([student_logp, teacher_logp, mask])
    if isinstance(gamma, (int, float)) and not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma={gamma} must be in [0, 1]")
    m = mask.astype(bool)
    r = jnp.where(m, teacher_logp.astype(jnp.float32) - student_logp.astype(jnp.float32), 0.0)
    if isinstance(gamma, (int, float)) and gamma == 0:
        return r
    return discounted_returns(r, mask, gamma=gamma)

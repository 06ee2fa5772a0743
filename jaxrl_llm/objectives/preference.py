"""Preference-optimisation losses: DPO family, KTO, ORPO, SimPO, Bradley–Terry, pairwise rank.

Inputs are per-example sequence log-probabilities (sums over response tokens, or averages
where the name says ``avg``) computed by the loss layer; outputs are per-example losses
(we minimise loss = −objective; reduce with a mean) and a dict of scalar metrics (batch
means, no gradient). Conventions follow TRL's ``DPOTrainer`` / ``KTOTrainer`` /
``ORPOTrainer`` / ``CPOTrainer`` / ``RewardTrainer`` unless stated.
"""

from __future__ import annotations

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import check_group_size, coerce_enum


class DPOKind(str, enum.Enum):
    """DPO loss variant: ``"sigmoid"``, ``"ipo"``, ``"hinge"``, ``"robust"``, ``"cdpo"``."""

    SIGMOID = "sigmoid"
    IPO = "ipo"
    HINGE = "hinge"
    ROBUST = "robust"
    CDPO = "cdpo"


def _nll_sigmoid(x: jax.Array) -> jax.Array:
    """−log σ(x), stable for any x."""
    return jax.nn.softplus(-x)


def _mean(x: jax.Array) -> jax.Array:
    """Mean that is 0 (not NaN) for an empty array (shapes are static)."""
    return jnp.sum(x) / max(x.size, 1)


def _sg(d: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {k: jax.lax.stop_gradient(v) for k, v in d.items()}


def dpo_loss(
    chosen_logps: jax.Array,
    rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    *,
    beta: float = 0.1,
    kind: DPOKind | str = DPOKind.SIGMOID,
    label_smoothing: float = 0.0,
    chosen_lengths: jax.Array | None = None,
    rejected_lengths: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Direct preference optimisation losses, per example.

    With ``h = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))`` and ε the label
    smoothing:

    * ``sigmoid``: ``−(1−ε)·log σ(βh) − ε·log σ(−βh)`` (Rafailov et al. 2023,
      https://arxiv.org/abs/2305.18290; β = 0.1; with ε > 0 this is TRL's smoothed sigmoid).
    * ``cdpo``: the same formula, named for conservative DPO (Mitchell 2023, "A note on DPO
      with noisy preferences", https://ericmitchell.ai/cdpo.pdf); ε ∈ [0, 0.5].
    * ``ipo``: ``(h − 1/(2β))²`` (Azar et al. 2023, https://arxiv.org/abs/2310.12036). When
      ``chosen_lengths``/``rejected_lengths`` are given each log-ratio is divided by its
      length (average log-probs, as TRL's IPO); lengths are used only by ``ipo``.
    * ``hinge``: ``max(0, 1 − βh)`` (SLiC, Zhao et al. 2023, https://arxiv.org/abs/2305.10425).
    * ``robust``: ``((1−ε)·(−log σ(βh)) − ε·(−log σ(−βh))) / (1 − 2ε)``, the unbiased loss
      under label-flip rate ε (Chowdhury et al. 2024, https://arxiv.org/abs/2403.00409);
      ε ∈ [0, 0.5).

    Reference-free DPO: pass zeros as reference log-probs. At π = π_ref the sigmoid loss is
    log 2. Example (reference-free, β = 0.5, log π(y_w) = −45.6, log π(y_l) = −28.3):
    ``h = −17.3`` and the loss is ``softplus(8.65) ≈ 8.6502``.

    Args:
      chosen_logps, rejected_logps: ``[B]`` summed log-probs of the policy.
      ref_chosen_logps, ref_rejected_logps: ``[B]`` summed log-probs of the reference.
      beta: β (default 0.1, the DPO paper / TRL; for IPO β is the paper's τ).
      kind: a :class:`DPOKind` or its string.
      label_smoothing: ε (default 0.0); only for ``sigmoid``, ``cdpo``, ``robust``.
      chosen_lengths, rejected_lengths: ``[B]`` token counts, for length-normalised IPO.

    Returns:
      ``(losses [B], metrics)`` with metrics ``rewards/chosen`` (mean β·(log π − log π_ref)
      of y_w), ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies`` (fraction
      with chosen reward > rejected reward), ``logps/chosen``, ``logps/rejected``.
    """
    chex.assert_rank([chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps], 1)
    chex.assert_equal_shape([chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps])
    kind = coerce_enum(DPOKind, kind, "kind")
    eps = float(label_smoothing)
    if kind in (DPOKind.SIGMOID, DPOKind.CDPO) and not 0.0 <= eps <= 0.5:
        raise ConfigError(f"label_smoothing={eps} must be in [0, 0.5] for kind={kind.value!r}")
    if kind is DPOKind.ROBUST and not 0.0 <= eps < 0.5:
        raise ConfigError(f"label_smoothing={eps} must be in [0, 0.5) for kind='robust'")
    if kind in (DPOKind.IPO, DPOKind.HINGE) and eps != 0.0:
        raise ConfigError(f"label_smoothing={eps} is not used by kind={kind.value!r}; set it to 0")
    if (chosen_lengths is None) != (rejected_lengths is None):
        raise ConfigError("pass both chosen_lengths and rejected_lengths, or neither")
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    chosen_lr = f32(chosen_logps) - f32(ref_chosen_logps)
    rejected_lr = f32(rejected_logps) - f32(ref_rejected_logps)
    if kind is DPOKind.IPO and chosen_lengths is not None:
        chex.assert_equal_shape([chosen_lengths, rejected_lengths, chosen_logps])
        chosen_h = chosen_lr / jnp.maximum(f32(chosen_lengths), 1.0)
        rejected_h = rejected_lr / jnp.maximum(f32(rejected_lengths), 1.0)
        h = chosen_h - rejected_h
    else:
        h = chosen_lr - rejected_lr
    if kind in (DPOKind.SIGMOID, DPOKind.CDPO):
        losses = (1.0 - eps) * _nll_sigmoid(beta * h) + eps * _nll_sigmoid(-beta * h)
    elif kind is DPOKind.ROBUST:
        losses = ((1.0 - eps) * _nll_sigmoid(beta * h) - eps * _nll_sigmoid(-beta * h)) / (
            1.0 - 2.0 * eps
        )
    elif kind is DPOKind.HINGE:
        losses = jax.nn.relu(1.0 - beta * h)
    else:
        losses = jnp.square(h - 1.0 / (2.0 * beta))
    rc, rr = beta * chosen_lr, beta * rejected_lr
    metrics = {
        "rewards/chosen": _mean(rc),
        "rewards/rejected": _mean(rr),
        "rewards/margins": _mean(rc - rr),
        "rewards/accuracies": _mean((rc > rr).astype(jnp.float32)),
        "logps/chosen": _mean(f32(chosen_logps)),
        "logps/rejected": _mean(f32(rejected_logps)),
    }
    return losses, _sg(metrics)


def kto_loss(
    chosen_logratios: jax.Array,
    rejected_logratios: jax.Array,
    kl: jax.Array,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Kahneman–Tversky optimisation (KTO) losses, per example.

    Ethayarajh et al. 2024, https://arxiv.org/abs/2402.01306.

    With ``r = log π(y|x) − log π_ref(y|x)`` and reference point ``z₀ = max(0, mean(kl))``
    (no gradient through z₀, as in the paper and TRL)::

        desirable:    λ_D · (1 − σ(β·(r − z₀)))
        undesirable:  λ_U · (1 − σ(β·(z₀ − r)))

    Defaults β = 0.1, λ_D = λ_U = 1 (paper/TRL). TRL computes z₀ from mismatched
    (prompt, completion) pairs of the batch; pass those log-ratios (or their mean) as ``kl``.

    Args:
      chosen_logratios: ``[Nd]`` log-ratios of desirable examples (may be empty).
      rejected_logratios: ``[Nu]`` log-ratios of undesirable examples (may be empty).
      kl: scalar or any-shape array of KL estimates; its mean, clamped at 0, is z₀.
      beta: β.
      desirable_weight: λ_D.
      undesirable_weight: λ_U.

    Returns:
      ``(losses [Nd + Nu], metrics)``: desirable losses first, then undesirable; metrics
      ``rewards/chosen`` (mean β·r of desirable), ``rewards/rejected``, ``kl`` (z₀).
    """
    chex.assert_rank([chosen_logratios, rejected_logratios], 1)
    kl = jnp.asarray(kl, jnp.float32)
    z0 = jax.lax.stop_gradient(jnp.maximum(jnp.mean(kl) if kl.size else 0.0, 0.0))
    rc = chosen_logratios.astype(jnp.float32)
    rr = rejected_logratios.astype(jnp.float32)
    chosen = desirable_weight * (1.0 - jax.nn.sigmoid(beta * (rc - z0)))
    rejected = undesirable_weight * (1.0 - jax.nn.sigmoid(beta * (z0 - rr)))
    losses = jnp.concatenate([chosen, rejected])
    metrics = {"rewards/chosen": _mean(beta * rc), "rewards/rejected": _mean(beta * rr), "kl": z0}
    return losses, _sg(metrics)


def log1mexp(x: jax.Array) -> jax.Array:
    """log(1 − eˣ) for x < 0, stable (Mächler 2012): log(−expm1(x)) near 0, log1p(−eˣ) below.

    x is clamped to ≤ −1e-6 so the result (and its gradient) stays finite at x = 0.
    """
    x = jnp.minimum(x, -1e-6)
    near = x > -0.6931471805599453
    a = jnp.log(-jnp.expm1(jnp.where(near, x, -1.0)))
    b = jnp.log1p(-jnp.exp(jnp.where(near, -1.0, x)))
    return jnp.where(near, a, b)


def orpo_loss(
    chosen_avg_logps: jax.Array,
    rejected_avg_logps: jax.Array,
    *,
    beta: float = 0.1,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """ORPO odds-ratio term (Hong et al. 2024, https://arxiv.org/abs/2403.07691).

    ``odds(y) = P/(1 − P)`` with ``log P`` the length-averaged log-prob, so
    ``log odds = ℓ − log(1 − e^ℓ)`` (computed with :func:`log1mexp`), and
    ``L_OR = −β·log σ(log odds(y_w) − log odds(y_l))``. The full ORPO loss is the chosen NLL
    plus this term (β = λ = 0.1, TRL ``ORPOTrainer``).

    Args:
      chosen_avg_logps: ``[B]`` average per-token log-prob of y_w (< 0).
      rejected_avg_logps: ``[B]`` average per-token log-prob of y_l.
      beta: λ of the paper (default 0.1).

    Returns:
      ``(losses [B], metrics)`` with ``rewards/chosen`` (β·ℓ_w), ``rewards/rejected``,
      ``rewards/margins``, ``rewards/accuracies``, ``log_odds_ratio`` (mean log σ(·)),
      ``log_odds_chosen`` (mean log-odds difference).
    """
    chex.assert_rank([chosen_avg_logps, rejected_avg_logps], 1)
    chex.assert_equal_shape([chosen_avg_logps, rejected_avg_logps])
    lc = chosen_avg_logps.astype(jnp.float32)
    lr = rejected_avg_logps.astype(jnp.float32)
    log_odds = (lc - log1mexp(lc)) - (lr - log1mexp(lr))
    log_sig = jax.nn.log_sigmoid(log_odds)
    losses = -beta * log_sig
    rc, rr = beta * lc, beta * lr
    metrics = {
        "rewards/chosen": _mean(rc),
        "rewards/rejected": _mean(rr),
        "rewards/margins": _mean(rc - rr),
        "rewards/accuracies": _mean((rc > rr).astype(jnp.float32)),
        "log_odds_ratio": _mean(log_sig),
        "log_odds_chosen": _mean(log_odds),
    }
    return losses, _sg(metrics)


def simpo_loss(
    chosen_avg_logps: jax.Array,
    rejected_avg_logps: jax.Array,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SimPO losses: reference-free, length-normalised preference loss, per example.

    Meng et al. 2024, https://arxiv.org/abs/2405.14734.

    ``L = −log σ(β·ℓ̄_w − β·ℓ̄_l − γ)`` with ℓ̄ the average per-token log-prob and γ the
    target reward margin (absolute, as TRL ``CPOConfig.simpo_gamma``; the SimPO repo's
    ``gamma_beta_ratio`` is γ/β). Defaults β = 2.0, γ = 0.5.

    Args:
      chosen_avg_logps: ``[B]`` average log-prob of y_w.
      rejected_avg_logps: ``[B]`` average log-prob of y_l.
      beta: β.
      gamma: γ, the margin.

    Returns:
      ``(losses [B], metrics)`` with ``rewards/chosen`` (β·ℓ̄_w), ``rewards/rejected``,
      ``rewards/margins``, ``rewards/accuracies``.
    """
    chex.assert_rank([chosen_avg_logps, rejected_avg_logps], 1)
    chex.assert_equal_shape([chosen_avg_logps, rejected_avg_logps])
    rc = beta * chosen_avg_logps.astype(jnp.float32)
    rr = beta * rejected_avg_logps.astype(jnp.float32)
    losses = _nll_sigmoid(rc - rr - gamma)
    metrics = {
        "rewards/chosen": _mean(rc),
        "rewards/rejected": _mean(rr),
        "rewards/margins": _mean(rc - rr),
        "rewards/accuracies": _mean((rc > rr).astype(jnp.float32)),
    }
    return losses, _sg(metrics)


def bradley_terry_loss(
    chosen_scores: jax.Array,
    rejected_scores: jax.Array,
    *,
    margin: jax.Array | float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Reward-model pairwise loss ``−log σ(r_w − r_l − m)`` (Bradley–Terry; InstructGPT).

    The optional margin m (per pair ``[B]`` or scalar) is Llama 2's
    (Touvron et al. 2023, https://arxiv.org/abs/2307.09288, eq. 2), as TRL ``RewardTrainer``
    with a ``margin`` column. Without it this is InstructGPT's loss
    (https://arxiv.org/abs/2203.02155).

    Args:
      chosen_scores: ``[B]`` scalar rewards of preferred responses.
      rejected_scores: ``[B]`` scalar rewards of rejected responses.
      margin: None, a float, or ``[B]``.

    Returns:
      ``(losses [B], metrics)`` with ``accuracy`` (fraction r_w > r_l), ``margin``
      (mean r_w − r_l), ``rewards/chosen``, ``rewards/rejected``.
    """
    chex.assert_rank([chosen_scores, rejected_scores], 1)
    chex.assert_equal_shape([chosen_scores, rejected_scores])
    rc = chosen_scores.astype(jnp.float32)
    rr = rejected_scores.astype(jnp.float32)
    diff = rc - rr
    logits = diff if margin is None else diff - jnp.asarray(margin, jnp.float32)
    losses = _nll_sigmoid(logits)
    metrics = {
        "accuracy": _mean((diff > 0).astype(jnp.float32)),
        "margin": _mean(diff),
        "rewards/chosen": _mean(rc),
        "rewards/rejected": _mean(rr),
    }
    return losses, _sg(metrics)


def pairwise_rank_loss(
    seq_logps: jax.Array,
    scores: jax.Array,
    *,
    group_size: int,
    beta: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Ranked-group pairwise loss: one loss per group, summed over its ordered pairs.

    ``L_g = Σ_{i,j in g : s_i > s_j} −log σ(β·(log π(y_i) − log π(y_j)))``; pairs with equal
    scores (ties) are skipped. This is the "GRPO" objective as written in the seed text
    (``−Σ_i Σ_j 1[rank(y_i) > rank(y_j)]·log σ(β(log π(y_i) − log π(y_j)))``, reference-free,
    a listwise extension of DPO's Bradley–Terry loss); it is *not* DeepSeekMath's GRPO
    (use :func:`grpo_advantages` + :func:`policy_loss` for that). Worked example (β = 0.3,
    log π = [−32.1, −67.4, −58.9, −18.2], ranking 2 > 3 > 1 > 4): the six pair losses
    are 2.625, 10.590, 14.760, 8.040, 12.210, 4.185, summing to ≈ 52.41 (the source text's
    "24.8" total does not match its own pair terms).

    Args:
      seq_logps: ``[B]`` summed log-probs, groups of ``group_size`` consecutive rows.
      scores: ``[B]`` scores or ranks (higher is better).
      group_size: samples per group.
      beta: β.

    Returns:
      ``(losses [B // group_size], metrics)`` with ``num_pairs`` (mean ordered pairs per
      group) and ``pair_accuracy`` (fraction of ordered pairs with log π(y_i) > log π(y_j)).
    """
    chex.assert_rank([seq_logps, scores], 1)
    chex.assert_equal_shape([seq_logps, scores])
    n = check_group_size(seq_logps.shape[0], group_size, "seq_logps")
    lp = seq_logps.astype(jnp.float32).reshape(n, group_size)
    s = scores.astype(jnp.float32).reshape(n, group_size)
    diff = lp[:, :, None] - lp[:, None, :]  # [n, i, j] = lp_i − lp_j
    better = s[:, :, None] > s[:, None, :]
    pair_loss = jnp.where(better, _nll_sigmoid(beta * diff), 0.0)
    losses = jnp.sum(pair_loss, axis=(1, 2))
    n_pairs = jnp.sum(better, axis=(1, 2)).astype(jnp.float32)
    correct = jnp.sum(better & (diff > 0)).astype(jnp.float32)
    total = jnp.sum(n_pairs)
    metrics = {
        "num_pairs": jnp.mean(n_pairs),
        "pair_accuracy": jnp.where(total > 0, correct / jnp.maximum(total, 1.0), 0.0),
    }
    return losses, _sg(metrics)

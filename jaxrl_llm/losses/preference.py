"""Offline preference losses over parameters: DPO family, ORPO, SimPO, reward model (BT).

Every loss here runs one forward pass over the chosen and rejected rows stacked into a
``[2B, T]`` batch, reduces per pair, and divides by the number of real pairs (pairs whose
chosen and rejected rows both have completion tokens; all-padding pairs add nothing), or by
``batch["loss_denominator"]`` when given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    ApplyFn,
    Batch,
    LogprobSettings,
    finish,
    forward_logps,
    masked_rows_mean,
    require,
    row_valid,
    sequence_logps,
    stack_pair,
    summed_logps,
)
from jaxrl_llm.objectives import coerce_enum
from jaxrl_llm.objectives.preference import (
    DPOKind,
    bradley_terry_loss,
    dpo_loss,
    orpo_loss,
    simpo_loss,
)
from jaxrl_llm.ops.masked import masked_count, masked_sum, safe_divide


def pair_denominator(batch: Batch, config: Any = None) -> jax.Array:
    """Number of real preference pairs in ``batch`` (the denominator of every pair loss)."""
    del config
    if "pair_index" in batch:  # packed pairs (jaxrl_llm.data.pack_preferences)
        return masked_count(require(batch, "pair_valid", loss="preference"))
    c = require(batch, "chosen_loss_mask", loss="preference")
    r = require(batch, "rejected_loss_mask", loss="preference")
    return masked_count(row_valid(c) & row_valid(r))


def _pair_forward(params, batch, apply_fn, logprobs, loss):
    """Per-token log-probs of chosen and rejected rows from one stacked forward pass.

    Returns (sum_c, sum_r, n_c, n_r, valid, logp [2B, T], stacked batch); sums, counts [B].
    Packed pairs (``pair_index``): one forward over the packed rows, sums and counts per
    sequence segment (logp is then the packed ``[R, L]``).
    """
    if "pair_index" in batch:
        logp, _, _ = forward_logps(params, batch, apply_fn=apply_fn, loss=loss, **logprobs.kwargs())
        sums, n, valid = _packed_pair_sums(logp, batch, loss)
        b = valid.shape[0]
        return sums[:b], sums[b:], n[:b], n[b:], valid, logp, batch
    pair = stack_pair(batch, loss)
    logp, _, out = forward_logps(params, pair, apply_fn=apply_fn, loss=loss, **logprobs.kwargs())
    b = batch["chosen_input_ids"].shape[0]
    sums = jnp.sum(logp, axis=-1)
    n = masked_count(pair["loss_mask"], axis=-1)
    valid = row_valid(batch["chosen_loss_mask"]) & row_valid(batch["rejected_loss_mask"])
    return sums[:b], sums[b:], n[:b], n[b:], valid, logp, pair


def _packed_pair_sums(logp: jax.Array, batch: Batch, loss: str):
    """Per-sequence Σ log p and token counts ``[2B]`` of packed pairs (chosen b at b, rejected
    b at B + b) and ``valid [B]``: segment sums over ``pair_index [R, L]``."""
    index = require(batch, "pair_index", loss=loss)
    valid = require(batch, "pair_valid", loss=loss).astype(bool)
    two_b = 2 * valid.shape[0]
    seg = jnp.where(index >= 0, index, two_b).reshape(-1)  # padding -> a dropped segment
    mask = batch["loss_mask"].astype(jnp.float32).reshape(-1)
    sums = jax.ops.segment_sum(logp.reshape(-1), seg, num_segments=two_b + 1)[:two_b]
    n = jax.ops.segment_sum(mask, seg, num_segments=two_b + 1)[:two_b]
    return sums, n, valid


def _pair_metrics(chosen_rewards, rejected_rewards, logp_c, logp_r, valid):
    sg = jax.lax.stop_gradient
    return {
        "rewards/chosen": sg(masked_rows_mean(chosen_rewards, valid)),
        "rewards/rejected": sg(masked_rows_mean(rejected_rewards, valid)),
        "rewards/accuracies": sg(
            masked_rows_mean((chosen_rewards > rejected_rewards).astype(jnp.float32), valid)
        ),
        "rewards/margins": sg(masked_rows_mean(chosen_rewards - rejected_rewards, valid)),
        "logps/chosen": sg(masked_rows_mean(logp_c, valid)),
        "logps/rejected": sg(masked_rows_mean(logp_r, valid)),
    }


# ----- DPO ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DPOConfig:
    """Direct Preference Optimization and its variants.

    Attributes:
      beta: β, the implicit KL strength (0.1, the DPO paper's and TRL's default).
      kind: :class:`~jaxrl_llm.objectives.preference.DPOKind`: ``sigmoid`` (Rafailov et al.
        2023, https://arxiv.org/abs/2305.18290), ``ipo`` (Azar et al. 2023,
        https://arxiv.org/abs/2310.12036, length-averaged log-ratios), ``hinge`` (SLiC,
        https://arxiv.org/abs/2305.10425), ``robust`` (Chowdhury et al. 2024,
        https://arxiv.org/abs/2403.00409), ``cdpo`` (Mitchell 2023,
        https://ericmitchell.ai/cdpo.pdf).
      label_smoothing: ε, the assumed label-flip rate for ``sigmoid``/``robust``/``cdpo``
        (0 = clean labels, where both reduce to ``sigmoid``; must be 0 for ipo/hinge).
      reference_free: use log π_ref = 0 (no reference model; Rafailov et al. §5 ablation).
    """

    beta: float = 0.1
    kind: DPOKind = DPOKind.SIGMOID
    label_smoothing: float = 0.0
    reference_free: bool = False

    def __post_init__(self):
        object.__setattr__(self, "kind", coerce_enum(DPOKind, self.kind, "DPO kind"))
        if not self.beta > 0:
            raise ConfigError(f"DPO beta={self.beta!r} must be > 0")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing={self.label_smoothing!r} must be in [0, 0.5)")
        if self.kind in (DPOKind.IPO, DPOKind.HINGE) and self.label_smoothing:
            raise ConfigError(
                f"label_smoothing={self.label_smoothing} is not used by DPO "
                f"kind={self.kind.value!r}; set it to 0"
            )


def dpo_config(**overrides) -> DPOConfig:
    """Preset for DPO (β = 0.1, sigmoid loss; choose ``kind`` for IPO/hinge/robust/cDPO)."""
    return DPOConfig(**overrides)


def _ref_pair(batch: Batch, b: int, reference_free: bool, loss: str):
    if reference_free:
        z = jnp.zeros((b,), jnp.float32)
        return z, z
    hint = (
        "compute them with losses.summed_logps(ref_params, batch, prefix='chosen_') / "
        "prefix='rejected_', or set reference_free=True"
    )
    rc = require(batch, "ref_chosen_logps", loss=loss, hint=hint)
    rr = require(batch, "ref_rejected_logps", loss=loss, hint=hint)
    return jnp.asarray(rc, jnp.float32), jnp.asarray(rr, jnp.float32)


def dpo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: DPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DPO over parameters: mean over pairs of ``objectives.dpo_loss``.

    Δ = [log π(y_w) − log π_ref(y_w)] − [log π(y_l) − log π_ref(y_l)] (summed over completion
    tokens); sigmoid: L = −log σ(β·Δ) (https://arxiv.org/abs/2305.18290). We minimise.

    Args:
      params: policy parameters.
      batch: preference batch ``chosen_*``/``rejected_*`` ``[B, T]`` and ``ref_chosen_logps``,
        ``ref_rejected_logps`` ``[B]`` (unless ``reference_free``); optional
        ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`DPOConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``rewards/chosen``, ``rewards/rejected``,
      ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``, ``logps/rejected``
      (rewards are β·(log π − log π_ref), means over real pairs).
    """
    name = "dpo"
    c, r, n_c, n_r, valid, _, _ = _pair_forward(params, batch, apply_fn, logprobs, name)
    ref_c, ref_r = _ref_pair(batch, c.shape[0], config.reference_free, name)
    losses, _ = dpo_loss(
        c,
        r,
        ref_c,
        ref_r,
        beta=config.beta,
        kind=config.kind,
        label_smoothing=config.label_smoothing,
        chosen_lengths=n_c,
        rejected_lengths=n_r,
    )
    loss = finish(masked_sum(losses, valid), masked_count(valid), batch)
    metrics = _pair_metrics(config.beta * (c - ref_c), config.beta * (r - ref_r), c, r, valid)
    metrics["loss"] = loss
    return loss, metrics


# ----- SimPO ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SimPOConfig:
    """SimPO (Meng et al. 2024, https://arxiv.org/abs/2405.14734): reference-free,
    length-normalised rewards with a target margin.

    Attributes:
      beta: β scaling the average log-likelihood reward (2.0, the paper's common setting).
      gamma: target reward margin γ (0.5, as the public contract of jaxrl_llm.objectives and TRL's CPO/SimPO).
    """

    beta: float = 2.0
    gamma: float = 0.5


def simpo_config(**overrides) -> SimPOConfig:
    """Preset for SimPO (β = 2.0, γ = 0.5)."""
    return SimPOConfig(**overrides)


def simpo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: SimPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SimPO: L = −log σ(β/|y_w| log π(y_w) − β/|y_l| log π(y_l) − γ), mean over pairs.

    Args:
      params: policy parameters.
      batch: preference batch (no reference log-probs needed); optional ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`SimPOConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``rewards/*`` (β × average log-prob), ``logps/*``
      (average log-probs).
    """
    c, r, n_c, n_r, valid, _, _ = _pair_forward(params, batch, apply_fn, logprobs, "simpo")
    avg_c, avg_r = safe_divide(c, n_c), safe_divide(r, n_r)
    losses, _ = simpo_loss(avg_c, avg_r, beta=config.beta, gamma=config.gamma)
    loss = finish(masked_sum(losses, valid), masked_count(valid), batch)
    metrics = _pair_metrics(config.beta * avg_c, config.beta * avg_r, avg_c, avg_r, valid)
    metrics["loss"] = loss
    return loss, metrics


# ----- ORPO -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ORPOConfig:
    """ORPO (Hong et al. 2024, https://arxiv.org/abs/2403.07691): SFT + λ·odds-ratio loss.

    Attributes:
      beta: λ weighting the odds-ratio term (0.1, TRL's ORPOTrainer default).
    """

    beta: float = 0.1


def orpo_config(**overrides) -> ORPOConfig:
    """Preset for ORPO (λ = 0.1)."""
    return ORPOConfig(**overrides)


def orpo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: ORPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """ORPO per pair: L_i = −(1/|y_w|) Σ_t log π(y_w,t) + L_OR,i, mean over pairs.

    L_OR = −log σ(log odds(y_w) − log odds(y_l)) scaled by λ, odds(y) = p/(1 − p) with p the
    length-averaged likelihood (``objectives.orpo_loss``). The NLL is each chosen response's
    token mean (the paper's per-example L_SFT), so the whole loss is a mean over pairs and
    micro-batch accumulation is exact with one denominator.

    Args:
      params: policy parameters.
      batch: preference batch; optional ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`ORPOConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``nll``, ``or_loss``, ``rewards/*`` (λ × average
      log-prob, as TRL), ``logps/*`` (average log-probs).
    """
    c, r, n_c, n_r, valid, _, _ = _pair_forward(params, batch, apply_fn, logprobs, "orpo")
    avg_c, avg_r = safe_divide(c, n_c), safe_divide(r, n_r)
    or_losses, _ = orpo_loss(avg_c, avg_r, beta=config.beta)
    nll = -avg_c
    loss = finish(masked_sum(nll + or_losses, valid), masked_count(valid), batch)
    metrics = _pair_metrics(config.beta * avg_c, config.beta * avg_r, avg_c, avg_r, valid)
    metrics["nll"] = jax.lax.stop_gradient(masked_rows_mean(nll, valid))
    metrics["or_loss"] = jax.lax.stop_gradient(masked_rows_mean(or_losses, valid))
    metrics["loss"] = loss
    return loss, metrics


# ----- reward model ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RewardModelConfig:
    """Bradley–Terry reward-model training (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155).

    Attributes:
      center_rewards_coef: weight of (r_w + r_l)² that keeps rewards centred (Eisenstein et al.
        2023, https://arxiv.org/abs/2312.09244; TRL's ``center_rewards_coefficient``);
        0 disables it (default, as TRL).
    """

    center_rewards_coef: float = 0.0


def reward_model_config(**overrides) -> RewardModelConfig:
    """Preset for the Bradley–Terry reward model."""
    return RewardModelConfig(**overrides)


def last_token_scores(scalar_bt: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """``[B]`` scalar-head value at each row's last real token (right padding), 0 if none."""
    m = attention_mask.astype(bool)
    t = m.shape[-1]
    last = jnp.max(jnp.where(m, jnp.arange(t)[None, :], -1), axis=-1)
    picked = jnp.take_along_axis(scalar_bt, jnp.maximum(last, 0)[:, None], axis=-1)[:, 0]
    return jnp.where(last >= 0, picked, 0.0)


def reward_scores(params: Any, batch: Batch, *, apply_fn: ApplyFn, prefix: str = "") -> jax.Array:
    """Reward-model scores ``[B]`` of ``{prefix}input_ids`` (scalar head at the last token).

    The same function scores rollouts in the RL loop and trains the model here.
    """
    ids = require(batch, f"{prefix}input_ids", loss="reward_model")
    attn = batch.get(f"{prefix}attention_mask")
    attn = jnp.ones(ids.shape, jnp.int32) if attn is None else attn
    out = apply_fn(
        params,
        ids,
        attention_mask=attn,
        positions=batch.get(f"{prefix}positions"),
        segment_ids=None,
    )
    if out.scalar is None:
        raise ConfigError("the reward model needs a scalar head (ModelConfig.num_labels=1)")
    return last_token_scores(out.scalar, attn)


def reward_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: RewardModelConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bradley–Terry: L = −log σ(r(x, y_w) − r(x, y_l) − m), mean over pairs.

    Args:
      params: reward-model parameters (scalar head).
      batch: preference batch (the ``*_loss_mask`` marks real pairs); optional ``margin [B]``
        (Llama 2's margin m) and ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`RewardModelConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``rewards/chosen``, ``rewards/rejected``,
      ``rewards/accuracies``, ``rewards/margins``.
    """
    if "pair_index" in batch:
        raise DataError(
            "the reward_model loss scores each sequence's last token and does not take packed "
            "pairs; set data.packing: false"
        )
    del logprobs  # scores come from the scalar head, not from token log-probs
    pair = stack_pair(batch, "reward_model")
    b = batch["chosen_input_ids"].shape[0]
    scores = reward_scores(
        params, {k: v for k, v in pair.items() if k != "segment_ids"}, apply_fn=apply_fn
    )
    sc, sr = scores[:b], scores[b:]
    valid = row_valid(batch["chosen_loss_mask"]) & row_valid(batch["rejected_loss_mask"])
    losses, _ = bradley_terry_loss(sc, sr, margin=batch.get("margin"))
    if config.center_rewards_coef:
        losses = losses + config.center_rewards_coef * jnp.square(sc + sr)
    loss = finish(masked_sum(losses, valid), masked_count(valid), batch)
    metrics = _pair_metrics(sc, sr, sc, sr, valid)
    del metrics["logps/chosen"], metrics["logps/rejected"]
    metrics["loss"] = loss
    return loss, metrics


def preference_reference_logps(
    ref_params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: Any = None,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> dict[str, jax.Array]:
    """``{"ref_chosen_logps", "ref_rejected_logps"}`` ``[B]`` under the reference params.

    One stacked forward pass; the trainer adds the result to the batch before DPO.
    """
    del config
    if "pair_index" in batch:
        logp = sequence_logps(
            ref_params,
            batch,
            apply_fn=apply_fn,
            temperature=logprobs.temperature,
            chunk_size=logprobs.chunk_size,
        )
        sums, _, valid = _packed_pair_sums(logp, batch, "dpo")
        sums, b = jax.lax.stop_gradient(sums), valid.shape[0]
        return {"ref_chosen_logps": sums[:b], "ref_rejected_logps": sums[b:]}
    pair = stack_pair(batch, "dpo")
    s = summed_logps(
        ref_params,
        pair,
        apply_fn=apply_fn,
        temperature=logprobs.temperature,
        chunk_size=logprobs.chunk_size,
    )
    b = batch["chosen_input_ids"].shape[0]
    s = jax.lax.stop_gradient(s)
    return {"ref_chosen_logps": s[:b], "ref_rejected_logps": s[b:]}

"""Losses over unpaired or grouped feedback: KTO (binary labels) and pairwise rank (groups)."""

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
    summed_logps,
)
from jaxrl_llm.objectives.preference import kto_loss, pairwise_rank_loss
from jaxrl_llm.ops.masked import masked_count, masked_sum

_SEQ_KEYS = ("input_ids", "attention_mask", "loss_mask", "positions")


# ----- KTO ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KTOConfig:
    """KTO (Ethayarajh et al. 2024, https://arxiv.org/abs/2402.01306).

    Attributes:
      beta: β (0.1, the paper's and TRL's default).
      desirable_weight: λ_D (1.0).
      undesirable_weight: λ_U (1.0; the paper suggests λ_D·n_D/(λ_U·n_U) ∈ [1, 4/3]).
    """

    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def __post_init__(self):
        if not self.beta > 0:
            raise ConfigError(f"KTO beta={self.beta!r} must be > 0")


def kto_config(**overrides) -> KTOConfig:
    """Preset for KTO (β = 0.1, λ_D = λ_U = 1)."""
    return KTOConfig(**overrides)


def row_denominator(batch: Batch, config: Any = None) -> jax.Array:
    """Number of real rows (rows with completion tokens): the denominator of KTO."""
    del config
    return masked_count(row_valid(require(batch, "loss_mask", loss="kto")))


def _stack_kto(batch: Batch) -> dict[str, jax.Array]:
    out = {}
    for key in _SEQ_KEYS:
        a, b = batch.get(key), batch.get(f"kl_{key}")
        if a is None and b is None:
            continue
        if key in ("input_ids", "loss_mask"):
            a = require(batch, key, loss="kto")
            b = require(
                batch,
                f"kl_{key}",
                loss="kto",
                hint="KTO's reference point needs the mismatched-pair rows kl_*",
            )
        if a is None or b is None:
            raise DataError(
                f"batch has only one of {key!r} / 'kl_{key}' for the 'kto' loss; "
                "give both or neither"
            )
        out[key] = jnp.concatenate([a, b], axis=0)
    return out


def kto_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: KTOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """KTO over parameters: mean over rows of the desirable / undesirable value losses.

    r = log π(y|x) − log π_ref(y|x) (summed over completion tokens); the reference point
    z₀ = max(0, mean_rows(log π(y'|x) − log π_ref(y'|x))) over the mismatched KL rows, with
    no gradient (paper §4, TRL); desirable rows: λ_D(1 − σ(β(r − z₀))), undesirable rows:
    λ_U(1 − σ(β(z₀ − r))) (``objectives.kto_loss``). With micro-batching, z₀ is estimated
    per micro-batch (as TRL does per device batch); the loss sum and its denominator stay
    exact.

    Args:
      params: policy parameters.
      batch: sequence batch + ``label [B]`` (1 desirable, 0 undesirable) + ``kl_input_ids``,
        ``kl_attention_mask``, ``kl_loss_mask`` ``[B, T]`` + ``ref_logps [B]``,
        ``ref_kl_logps [B]``; optional ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`KTOConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``rewards/chosen``, ``rewards/rejected`` (β·r means over
      desirable / undesirable rows), ``logps/chosen``, ``logps/rejected``, ``kl`` (z₀).
    """
    name = "kto"
    label = require(batch, "label", loss=name)
    hint = "compute them with losses.kto_reference_logps(ref_params, batch, apply_fn=...)"
    ref = jnp.asarray(require(batch, "ref_logps", loss=name, hint=hint), jnp.float32)
    ref_kl = jnp.asarray(require(batch, "ref_kl_logps", loss=name, hint=hint), jnp.float32)
    stacked = _stack_kto(batch)
    logp, _, _ = forward_logps(params, stacked, apply_fn=apply_fn, loss=name, **logprobs.kwargs())
    b = batch["input_ids"].shape[0]
    sums = jnp.sum(logp, axis=-1)
    pol, pol_kl = sums[:b], sums[b:]
    valid = row_valid(batch["loss_mask"])
    kl_valid = row_valid(batch["kl_loss_mask"])
    z0 = masked_rows_mean(jax.lax.stop_gradient(pol_kl - ref_kl), kl_valid)
    r = pol - ref
    # Each row is scored both ways; its label picks which loss applies (static shapes).
    both, _ = kto_loss(
        r,
        r,
        z0,
        beta=config.beta,
        desirable_weight=config.desirable_weight,
        undesirable_weight=config.undesirable_weight,
    )
    desirable = label.astype(bool)
    losses = jnp.where(desirable, both[:b], both[b:])
    loss = finish(masked_sum(losses, valid), masked_count(valid), batch)
    sg = jax.lax.stop_gradient
    dv, uv = valid & desirable, valid & ~desirable
    metrics = {
        "loss": loss,
        "rewards/chosen": sg(masked_rows_mean(config.beta * r, dv)),
        "rewards/rejected": sg(masked_rows_mean(config.beta * r, uv)),
        "logps/chosen": sg(masked_rows_mean(pol, dv)),
        "logps/rejected": sg(masked_rows_mean(pol, uv)),
        "kl": sg(jnp.maximum(z0, 0.0)),
    }
    return loss, metrics


def kto_reference_logps(
    ref_params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: Any = None,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> dict[str, jax.Array]:
    """``{"ref_logps", "ref_kl_logps"}`` ``[B]``: summed reference log-probs of the rows and of
    the mismatched KL rows, from one stacked forward pass."""
    del config
    s = jax.lax.stop_gradient(
        summed_logps(
            ref_params,
            _stack_kto(batch),
            apply_fn=apply_fn,
            temperature=logprobs.temperature,
            chunk_size=logprobs.chunk_size,
        )
    )
    b = batch["input_ids"].shape[0]
    return {"ref_logps": s[:b], "ref_kl_logps": s[b:]}


# ----- pairwise rank --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PairwiseRankConfig:
    """Ranked-group pairwise loss (the seed text's "group" ranking objective).

    Attributes:
      group_size: responses per prompt; groups are consecutive rows (required).
      beta: β scaling log-prob differences (0.1, as DPO's β; the source's worked example
        uses 0.3).
    """

    group_size: int
    beta: float = 0.1

    def __post_init__(self):
        if not isinstance(self.group_size, int) or self.group_size < 2:
            raise ConfigError(
                f"pairwise_rank group_size={self.group_size!r} must be an integer >= 2"
            )
        if not self.beta > 0:
            raise ConfigError(f"pairwise_rank beta={self.beta!r} must be > 0")


def pairwise_rank_config(*, group_size: int, **overrides) -> PairwiseRankConfig:
    """Preset for the pairwise rank loss (β = 0.1); ``group_size`` must match the data."""
    return PairwiseRankConfig(group_size=group_size, **overrides)


def group_valid(loss_mask: jax.Array, group_size: int) -> jax.Array:
    """``[B // group_size]`` bool: the group has at least one real row (padding groups False)."""
    v = row_valid(loss_mask)
    if v.shape[0] % group_size:
        raise DataError(
            f"pairwise_rank batch has {v.shape[0]} rows, not a multiple of "
            f"group_size={group_size}; pad with whole groups"
        )
    return jnp.any(v.reshape(-1, group_size), axis=-1)


def group_denominator(batch: Batch, config: PairwiseRankConfig) -> jax.Array:
    """Number of real groups in ``batch``: the denominator of :func:`pairwise_rank_model_loss`."""
    mask = require(batch, "loss_mask", loss="pairwise_rank")
    return masked_count(group_valid(mask, config.group_size))


def pairwise_rank_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: PairwiseRankConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean over groups of L_g = Σ_{i,j∈g: s_i > s_j} −log σ(β(log π(y_i) − log π(y_j))).

    log π(y) is summed over completion tokens (reference-free; ties skipped); see
    ``objectives.pairwise_rank_loss``. Padding is by whole groups (all-zero loss masks).

    Args:
      params: policy parameters.
      batch: sequence batch with rows in consecutive groups of ``group_size`` and
        ``scores [B]`` (higher is better); optional ``loss_denominator``.
      apply_fn: model apply function.
      config: :class:`PairwiseRankConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``num_pairs``, ``pair_accuracy``, ``logps/mean``.
    """
    name = "pairwise_rank"
    scores = require(batch, "scores", loss=name)
    logp, _, _ = forward_logps(params, batch, apply_fn=apply_fn, loss=name, **logprobs.kwargs())
    seq = jnp.sum(logp, axis=-1)
    gv = group_valid(batch["loss_mask"], config.group_size)
    losses, obj_metrics = pairwise_rank_loss(
        seq, scores, group_size=config.group_size, beta=config.beta
    )
    loss = finish(masked_sum(losses, gv), masked_count(gv), batch)
    metrics = dict(obj_metrics)
    metrics["loss"] = loss
    metrics["logps/mean"] = jax.lax.stop_gradient(
        masked_rows_mean(seq, row_valid(batch["loss_mask"]))
    )
    return loss, metrics

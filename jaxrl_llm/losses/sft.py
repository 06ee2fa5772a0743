"""Supervised fine-tuning: masked next-token negative log-likelihood."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    ApplyFn,
    Batch,
    LogprobSettings,
    finish,
    forward_logps,
    require,
)
from jaxrl_llm.objectives.aggregation import (
    AggregationMode,
    aggregate_parts,
    aggregation_denominator,
)
from jaxrl_llm.ops.masked import masked_count, masked_sum, safe_divide


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SFTConfig:
    """Supervised fine-tuning.

    Attributes:
      aggregation: how per-token NLL reduces (default ``token_mean``: every completion token
        weighs the same, as in TRL's SFTTrainer / Hugging Face causal-LM loss).
      max_len: constant length for ``seq_mean_token_sum_norm``.
    """

    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN
    max_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "aggregation", AggregationMode(self.aggregation))


def sft_config(**overrides) -> SFTConfig:
    """Preset for SFT (token-mean NLL over completion tokens)."""
    return SFTConfig(**overrides)


def sft_denominator(batch: Batch, config: SFTConfig) -> jax.Array:
    """Denominator of :func:`sft_loss` over ``batch`` (e.g. Σ loss_mask for token_mean)."""
    mask = require(batch, "loss_mask", loss="sft")
    return aggregation_denominator(mask, mode=config.aggregation, max_len=config.max_len)


def sft_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: SFTConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked next-token NLL: L = −Σ_{b,t} m_bt log π(x_bt | x_b,<t) / Σ m (token_mean).

    Args:
      params: policy parameters.
      batch: sequence batch: ``input_ids``, ``attention_mask``, ``loss_mask`` ``[B, T]``;
        optional ``segment_ids``/``positions`` (packing) and ``loss_denominator``.
      apply_fn: model apply function (see the package docstring).
      config: :class:`SFTConfig`.
      logprobs: :class:`~jaxrl_llm.losses.common.LogprobSettings` (chunking).

    Returns:
      ``(loss, metrics)``; metrics: ``loss``, ``nll`` (token-mean NLL of this micro-batch),
      ``num_tokens``.
    """
    logp, _, _ = forward_logps(params, batch, apply_fn=apply_fn, loss="sft", **logprobs.kwargs())
    mask = batch["loss_mask"]
    num, den = aggregate_parts(-logp, mask, mode=config.aggregation, max_len=config.max_len)
    loss = finish(num, den, batch)
    n_tok = masked_count(mask)
    metrics = {
        "loss": loss,
        "nll": jax.lax.stop_gradient(safe_divide(masked_sum(-logp, mask), n_tok)),
        "num_tokens": n_tok,
    }
    return loss, metrics

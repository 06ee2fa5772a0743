"""Rollout correction: the learner recomputes the sampled tokens' log-probs and corrects for
the sampler that produced them (``rollout.correction``).

The sampler's recorded log-probs ``log μ(y_t)`` (the behaviour policy: another code path, a
KV cache, maybe another precision, and with ``rollout.max_staleness > 0`` older weights) are
not the learner's ``log π(y_t)``. With a ``correction`` section, before the step's updates the
learner runs one extra forward with its current (pre-update) weights over the whole learner
batch and either

* **importance sampling** (default): ``old_logp ← log π`` (the ratio and its clip are taken
  around the learner's own policy) and each token's surrogate is weighted by the bounded
  ``w = rollout_correction(log π, log μ)``: ``mode: truncate`` clips ``w`` to [low, high]
  (TIS, Yao et al. 2025, https://fengyao.notion.site/off-policy-rl), ``mode: mask`` zeroes the
  tokens (or, ``level: sequence``, rows) outside [low, high] (MIS / IcePop); or
* **decoupled PPO** (``decoupled: true``; Fu et al. 2025, AReaL,
  https://arxiv.org/abs/2505.24298): ``proximal_logp ← log π`` (the clip is around the
  proximal policy, the learner's weights before this update) and ``old_logp`` stays the
  behaviour ``log μ``, whose weight ``π_prox/μ`` multiplies the surrogate unbounded, as the
  paper's objective. With the recompute, this equals the importance-sampling form with no
  bounds (``low: null, high: null``, token level): the tests check it.

The losses read ``is_weights`` / ``proximal_logp`` from the batch (``objectives.policy_loss``);
the registry's ``LossSpec.rollout_corrections`` says which a loss reads. Metrics, every
step: ``correction/weight_mean``, ``correction/weight_max``, ``correction/outside_frac``
(share of tokens outside [low, high]), ``correction/ratio_max``, ``correction/mismatch_kl``
(k3 estimate of KL(μ‖π)), ``correction/rows_frac`` (share of rows recomputed: only the
groups with a nonzero advantage need it, :class:`RolloutCorrector`) and ``time/recompute_s``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives
from jaxrl_llm.parallel import gather_numbers
from jaxrl_llm.train.config.sections import CorrectionSection
from jaxrl_llm.train.online.experience import merge_process_metrics
from jaxrl_llm.train.online.learner import context_padded, informative_rows


@functools.partial(jax.jit, static_argnames=("level", "mode", "low", "high"))
def _weights(logp, rollout_logp, mask, *, level, mode, low, high):
    return objectives.rollout_correction(
        logp, rollout_logp, mask, level=level, mode=mode, low=low, high=high
    )


def correct_batch(
    batch: dict, logp: np.ndarray, section: CorrectionSection, rows: np.ndarray | None = None
) -> tuple[dict, dict[str, float]]:
    """The learner batch corrected with the learner's recomputed ``logp [N, T]`` (its
    ``old_logp`` holding the sampler's log-probs), and the correction's metrics.

    ``rows``: the rows whose ``logp`` was recomputed (default: all); the others keep the
    sampler's log-probs and weight 1, and the metrics are over the recomputed rows.
    """
    mask = np.asarray(batch["loss_mask"])
    old = np.asarray(batch["old_logp"], np.float32)
    rows = np.arange(len(mask)) if rows is None else rows
    logp = np.where(mask > 0, np.asarray(logp, np.float32), 0.0).astype(np.float32)
    w, m = _weights(
        jnp.asarray(logp[rows]),
        jnp.asarray(old[rows]),
        jnp.asarray(mask[rows]),
        level=section.level,
        mode=section.mode,
        low=section.low,
        high=section.high,
    )
    out = dict(batch)
    if section.decoupled:
        out["proximal_logp"] = logp
    else:
        weights = (mask > 0).astype(np.float32)
        weights[rows] = np.asarray(w, np.float32)
        out["old_logp"] = logp
        out["is_weights"] = weights
    metrics = {f"correction/{k}": float(v) for k, v in jax.device_get(m).items()}
    metrics["correction/rows_frac"] = len(rows) / len(mask)
    return out, metrics


def recompute_rows(advantages: np.ndarray, mask: np.ndarray, *, group_size: int) -> np.ndarray:
    """Sorted indices of the rows whose log-probs the correction recomputes: the groups of
    ``group_size`` consecutive rows with a nonzero advantage under ``mask`` (a zero-advantage
    row's surrogate is 0 whatever its ``old_logp`` and weight), at least one, padded with the
    next groups to a power-of-two number of groups (few compiled shapes). Across processes
    (host-local rows) the count is the largest process's, so that every process recomputes
    as many rows (one global array)."""
    g = group_size
    rows = informative_rows({"advantages": advantages, "loss_mask": mask})
    need = np.asarray(rows.reshape(-1, g).any(axis=1))
    count = max(1, int(gather_numbers(np.int64(need.sum())).max()))
    bucket = min(len(need), 1 << (count - 1).bit_length())
    groups = np.sort(np.argsort(~need, kind="stable")[:bucket])
    return (groups[:, None] * g + np.arange(g)[None, :]).reshape(-1)


class RolloutCorrector:
    """The recompute forward and :func:`correct_batch` for one run.

    Only the groups with a nonzero advantage are recomputed (a zero-advantage row's
    surrogate is 0 whatever its ``old_logp`` and weight; the β·KL term does not read them),
    padded with other groups to a power-of-two number of groups so that few shapes compile,
    and at least one group so that the metrics exist every step. PPO's GAE advantages are
    nonzero: every row is recomputed.

    Args:
      section: the run's ``rollout.correction``.
      policy: the :class:`~jaxrl_llm.train.programs.policy.Policy` being trained (its current state).
      recompute: the run's recompute forward (:attr:`jaxrl_llm.train.programs.builder.Programs.
        recompute`: the loss's temperature, window and shared prompt, the model bound as in
        the update).
      group_size: rows per group (G): whole groups are recomputed (a shared prompt).
    """

    def __init__(
        self,
        section: CorrectionSection,
        policy: Any,
        recompute: Callable[..., Any],
        *,
        group_size: int = 1,
    ):
        self.section, self.policy, self.group = section, policy, group_size
        self._logps = recompute

    def __call__(self, batch: dict) -> tuple[dict, dict[str, float]]:
        """``(corrected batch, metrics)``, ``time/recompute_s`` the forward's wall time."""
        t = time.perf_counter()
        rows = recompute_rows(batch["advantages"], batch["loss_mask"], group_size=self.group)
        keys: tuple[str, ...] = ("input_ids", "attention_mask", "loss_mask")
        keys += ("routing",) if "routing" in batch else ()  # a MoE's sampler routing (R3)
        sub = {k: np.asarray(batch[k])[rows] for k in keys}
        p = self.policy
        logp = np.array(batch["old_logp"], np.float32)  # the sampler's where not recomputed
        recomputed = context_padded(lambda b: self._logps(p.state.params, b, **p.frozen()), sub, p)
        logp[rows] = np.asarray(jax.device_get(recomputed))
        t_recompute = time.perf_counter() - t
        out, metrics = correct_batch(batch, logp, self.section, rows)
        metrics["time/recompute_s"] = t_recompute
        return out, merge_process_metrics(metrics, len(rows), site="correction")

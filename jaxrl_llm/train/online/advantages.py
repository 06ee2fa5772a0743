"""The numbers a strategy puts on each row of a step, shared by the algorithm families
(:mod:`jaxrl_llm.train.online.algorithms`): advantages (:func:`estimate_advantages` with the
algorithm's estimator; :func:`token_step_ids` for process supervision's per-token ones), which
rows carry gradient (:func:`invalid_to_zero`, :func:`loss_weight`, :func:`scored_weight`;
``rewards/valid_frac`` by :func:`with_valid_frac`), and the checks that a frozen model's
weights and outputs entering them are finite (:func:`check_finite_weights`,
:func:`check_finite_output`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives
from jaxrl_llm import rewards as reward_lib
from jaxrl_llm.errors import ConfigError, ModelLoadError, TrainingError
from jaxrl_llm.losses import AdvantageEstimator
from jaxrl_llm.parallel import over_processes
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.config.sections import RolloutSection
from jaxrl_llm.train.online.experience import Experience


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


def reference_cause(plan: RunPlan) -> str:
    """The cause :func:`check_finite_output` names for the reference's log-probs: the
    starting policy's weights."""
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

"""What an online step reports about its rows, over every process's (host-local rows: a few
numbers per row are gathered): the rewards, completion lengths and truncation
(:func:`row_metrics`) and the advantages the update weighs (:func:`advantage_metrics`,
:func:`advantage_stats`). The step itself is
:meth:`~jaxrl_llm.train.online.trainer.OnlineTrainer.train_step`.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.parallel import gather_numbers
from jaxrl_llm.train.online.experience import Experience
from jaxrl_llm.train.online.strategy import Prepared


def row_metrics(exp: Experience) -> tuple[dict[str, float], int]:
    """``(metrics, tokens)``: the mean, spread and failures of the step's rewards, its
    completions' lengths and truncated share (``reward/*``, ``completion/*``), and the
    completion tokens sampled, over every process's rows."""
    rewards, valid, lengths, truncated = (
        gather_numbers(
            np.stack(
                [
                    np.asarray(exp.rewards, np.float32),
                    np.asarray(exp.valid, np.float32),
                    np.asarray(exp.rollout.lengths, np.float32),
                    np.asarray(exp.rollout.truncated, np.float32),
                ]
            )
        )
        .transpose(1, 0, 2)
        .reshape(4, -1)
    )
    lengths = lengths.astype(np.int64)
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "reward/failed": int((valid == 0).sum()),
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": int(lengths.max()),
        "completion/truncated_frac": float(truncated.mean()),
    }
    return metrics, int(lengths.sum())


def advantage_metrics(prepared: Prepared, exp: Experience) -> dict[str, float]:
    """:func:`advantage_stats` of the advantages a strategy reported (per row, per completion
    token over the rollout's mask, or per token over the batch's ``loss_mask``); none when it
    reported none (online DPO)."""
    if prepared.advantages is None:
        return {}
    adv = prepared.advantages
    flat = (
        adv
        if adv.ndim == 1
        else adv[np.asarray(exp.rollout.mask, bool)]
        if adv.shape == exp.rollout.mask.shape
        else adv[prepared.batch["loss_mask"] > 0]
    )
    return advantage_stats(flat)


def advantage_stats(flat: np.ndarray) -> dict[str, float]:
    """Mean, std, max and min of a step's advantages (``flat``: this process's, over the
    tokens or rows the update weighs), over every process's (four numbers each). All zero
    when every row is masked (all failed: nothing trained)."""
    flat = np.asarray(flat, np.float64)
    big = np.finfo(np.float64).max
    mine = [
        flat.size,
        flat.sum(),
        np.square(flat).sum(),
        flat.max(initial=-big),
        flat.min(initial=big),
    ]
    n, total, squares, hi, lo = gather_numbers(np.array(mine, np.float64)).T
    count = n.sum()
    if count == 0:
        return {
            "advantage/mean": 0.0,
            "advantage/std": 0.0,
            "advantage/max": 0.0,
            "advantage/min": 0.0,
        }
    mean = total.sum() / count
    var = max(squares.sum() / count - mean * mean, 0.0)
    return {
        "advantage/mean": float(mean),
        "advantage/std": float(np.sqrt(var)),
        "advantage/max": float(hi.max()),
        "advantage/min": float(lo.min()),
    }

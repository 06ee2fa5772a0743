"""What an online step reports about its rows, over every process's (host-local rows: a few
numbers per row are gathered): the rewards, completion lengths and truncation
(:func:`row_metrics`) and the advantages the update weighs (:func:`advantage_numbers`,
:func:`advantage_stats`). The step itself is
:meth:`~jaxrl_llm.train.online.trainer.OnlineTrainer.train_step`.

Across processes a step exchanges numbers twice outside its programs, each time everything
whose inputs are known at that point in one collective
(:func:`~jaxrl_llm.parallel.gather_packed`): after sampling (:func:`share_experience`: the
prompt width the rows meet at, which the next programs need, the rollout's and the
experience's metrics, the per-row numbers) and after the strategy's prepare
(:func:`share_prepared`: its metrics, the advantages' sums and extremes).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_llm.parallel import gather_packed
from jaxrl_llm.train.online.experience import (
    Experience,
    merged_metrics,
    metrics_numbers,
    widen,
)
from jaxrl_llm.train.online.strategy import Prepared


def row_numbers(exp: Experience) -> np.ndarray:
    """``[4, N]`` float32: this process's rows' rewards, validity, completion lengths and
    truncation, what :func:`row_metrics` needs of every process's."""
    return np.stack(
        [
            np.asarray(exp.rewards, np.float32),
            np.asarray(exp.valid, np.float32),
            np.asarray(exp.rollout.lengths, np.float32),
            np.asarray(exp.rollout.truncated, np.float32),
        ]
    )


def row_metrics(table: np.ndarray) -> tuple[dict[str, float], int]:
    """``(metrics, tokens)``: the mean, spread and failures of the step's rewards, its
    completions' lengths and truncated share (``reward/*``, ``completion/*``), and the
    completion tokens sampled, from every process's :func:`row_numbers` (``table
    [processes, 4, N]``, in process order)."""
    rewards, valid, lengths, truncated = np.asarray(table).transpose(1, 0, 2).reshape(4, -1)
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


def advantage_numbers(prepared: Prepared, exp: Experience) -> np.ndarray | None:
    """``[5]`` float64 of the advantages a strategy reported (per row, per completion token
    over the rollout's mask, or per token over the batch's ``loss_mask``): their count, sum,
    sum of squares, maximum and minimum, what :func:`advantage_stats` needs of every
    process's; None when it reported none (online DPO)."""
    if prepared.advantages is None:
        return None
    adv = prepared.advantages
    flat = (
        adv
        if adv.ndim == 1
        else adv[np.asarray(exp.rollout.mask, bool)]
        if adv.shape == exp.rollout.mask.shape
        else adv[prepared.batch["loss_mask"] > 0]
    )
    flat = np.asarray(flat, np.float64)
    big = np.finfo(np.float64).max
    return np.array(
        [
            flat.size,
            flat.sum(),
            np.square(flat).sum(),
            flat.max(initial=-big),
            flat.min(initial=big),
        ],
        np.float64,
    )


def advantage_stats(table: np.ndarray) -> dict[str, float]:
    """Mean, std, max and min of a step's advantages from every process's
    :func:`advantage_numbers` (``table [processes, 5]``). All zero when every row is masked
    (all failed: nothing trained)."""
    n, total, squares, hi, lo = np.asarray(table, np.float64).T
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


def share_experience(exp: Experience, info: dict) -> tuple[Experience, dict, dict, int]:
    """The step's first exchange, right after sampling, in one collective:
    ``(exp, info, rows, tokens)``: ``exp`` with its prompts left-padded to the widest of every
    process's (the width one process holding every row would have: the rows meet in one
    global array) and its metrics merged over the processes
    (:func:`~jaxrl_llm.train.online.experience.merge_process_metrics` rules), the rollout's
    ``info`` merged, and :func:`row_metrics` over every process's rows. One process: ``exp``
    and ``info`` unchanged, no exchange."""
    n = len(exp)
    parts: list[np.ndarray] = [row_numbers(exp)]
    multi = jax.process_count() > 1
    if multi:
        parts += [
            np.array(exp.rollout.prompt_tokens.shape[1], np.int64),
            metrics_numbers(info, n, site="rollout"),
            metrics_numbers(exp.metrics, n, site="experience"),
        ]
    rows_t, *shared = gather_packed(parts)
    rows, tokens = row_metrics(rows_t)
    if not multi:
        return exp, info, rows, tokens
    width, info_t, exp_t = shared
    merged = merged_metrics(exp_t, exp.metrics, n, site="experience")
    info = merged_metrics(info_t, info, n, site="rollout")
    exp = dataclasses.replace(exp, rollout=widen(exp.rollout, int(width.max())), metrics=merged)
    return exp, info, rows, tokens


def share_prepared(
    prepared: Prepared, exp: Experience
) -> tuple[dict[str, float], dict[str, float]]:
    """The step's second exchange, once the strategy has prepared the batch, in one
    collective: ``(metrics, advantages)``, its metrics merged over the processes and
    :func:`advantage_stats` (empty when it reported no advantages). One process: no
    exchange."""
    adv = advantage_numbers(prepared, exp)
    multi = jax.process_count() > 1
    parts = [] if adv is None else [adv]
    if multi:
        parts.append(metrics_numbers(prepared.metrics, len(exp), site="prepare"))
    shared = gather_packed(parts) if parts else []
    metrics = (
        merged_metrics(shared.pop(), prepared.metrics, len(exp), site="prepare")
        if multi
        else prepared.metrics
    )
    return metrics, ({} if adv is None else advantage_stats(shared[0]))

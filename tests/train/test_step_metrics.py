"""An online step's row and advantage metrics from every process's numbers
(``jaxrl_llm/train/online/step_metrics.py``): what two processes' halves give equals what one
process holding every row gives."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.train.online.step_metrics import (
    advantage_numbers,
    advantage_stats,
    row_metrics,
)
from jaxrl_llm.train.online.strategy import Prepared


def _prepared(adv: np.ndarray) -> Prepared:
    return Prepared(batch={}, advantages=adv, metrics={})


def test_advantage_stats_of_two_halves_are_the_whole_batchs():
    adv = np.array([0.5, -1.0, 2.0, 0.0, -0.25, 1.5])
    whole = advantage_stats(advantage_numbers(_prepared(adv), None)[None])  # type: ignore[arg-type]
    halves = np.stack([advantage_numbers(_prepared(h), None) for h in (adv[:3], adv[3:])])  # type: ignore[arg-type]
    assert advantage_stats(halves) == pytest.approx(whole)
    assert whole["advantage/mean"] == pytest.approx(adv.mean())
    assert whole["advantage/std"] == pytest.approx(adv.std())
    assert (whole["advantage/max"], whole["advantage/min"]) == (2.0, -1.0)
    # a process whose rows all failed sends nothing but its count 0
    empty = advantage_numbers(_prepared(np.zeros(0)), None)  # type: ignore[arg-type]
    assert advantage_stats(np.stack([empty, empty])) == dict.fromkeys(whole, 0.0)
    assert advantage_stats(np.stack([empty, halves[0]]))["advantage/min"] == -1.0


def test_row_metrics_read_every_processs_rows_in_order():
    # [processes, 4, N]: rewards, valid, lengths, truncated of 2 processes × 2 rows
    table = np.array(
        [
            [[1.0, 0.0], [1, 0], [3, 5], [0, 1]],
            [[0.5, 0.5], [1, 1], [2, 6], [0, 0]],
        ],
        np.float32,
    )
    metrics, tokens = row_metrics(table)
    assert tokens == 16
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert metrics["reward/std"] == pytest.approx(np.std([1.0, 0.0, 0.5, 0.5]))
    assert metrics["reward/failed"] == 1
    assert metrics["completion/length_max"] == 6
    assert metrics["completion/length_mean"] == pytest.approx(4.0)
    assert metrics["completion/truncated_frac"] == pytest.approx(0.25)

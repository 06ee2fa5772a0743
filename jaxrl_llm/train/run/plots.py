"""PNG learning curves of a run directory (``jaxrl-llm plot RUN``, and a run's ``plots/``
when ``logging.plots`` is on): one overview figure and one figure per metric group, read
from ``metrics.jsonl``.

A metric's group is its name up to the first ``/`` (``pg/clipfrac`` → ``pg``); names without
one (``loss``, ``kl``, ``entropy``) form the group ``training``. Each group's figure has one
panel per metric, and a metric that is constant over the run (a data fingerprint, the example
count, a fixed learning rate) is not drawn, nor a group left empty. File names are the group
name with every character outside ``A-Z a-z 0-9 . _ -`` replaced by ``_`` (:func:`file_stem`),
so that they are valid on Windows and in URLs.
"""

from __future__ import annotations

import math
import os
import re

from jaxrl_llm.errors import JaxrlError

# The overview's panels, in reading order: (title, metric names; a name ending in "/" is a
# prefix). A panel shows the metrics of the run that vary; a panel with none is left out.
OVERVIEW_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward (training)", ("reward/mean",)),
    ("held-out", ("eval/",)),
    ("loss", ("loss", "pg/loss", "nll")),
    ("KL and clipping", ("kl", "kl_to_ref", "pg/clipfrac", "pg/approx_kl")),
    ("entropy", ("entropy",)),
    ("completion length (tokens)", ("completion/length_mean", "completion/length_max")),
    ("step time split (s)", ("time/rollout_s", "time/reference_s", "time/update_s", "time/step_s")),
    ("preference", ("rewards/accuracies", "rewards/margins")),
    ("gradient norm", ("grad_norm",)),
)
# Bookkeeping, not learning: never on the overview.
_NOT_ON_OVERVIEW = ("eval/num_examples", "eval/valid", "eval/completion_length")


# The group of the metrics whose name has no "/".
UNGROUPED = "training"


def _varies(ys) -> bool:
    vals = [y for y in ys if y is not None and not (isinstance(y, float) and math.isnan(y))]
    return len(vals) >= 1 and (len(vals) == 1 or min(vals) != max(vals))


def file_stem(name: str) -> str:
    """``name`` as a portable file name: each character outside ``A-Z a-z 0-9 . _ -`` becomes
    ``_`` (``rewards/my_rewards:brevity`` → ``rewards_my_rewards_brevity``), so no ``:``
    (refused by Windows), ``/``, ``@`` or space reaches a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def metric_groups(series: dict, *, drop_constant: bool = True) -> dict[str, list[str]]:
    """A run's figures: group name -> the metric names drawn in it, in name order.

    The group is the name up to its first ``/`` (:data:`UNGROUPED` for a name without one);
    with ``drop_constant`` a metric that is constant over the run is left out (a metric with
    a single value is drawn), and so is a group left with none.
    """
    groups: dict[str, list[str]] = {}
    for k in sorted(series):
        if drop_constant and not _varies(series[k][1]):
            continue
        group = k.split("/", 1)[0] if "/" in k else UNGROUPED
        groups.setdefault(group, []).append(k)
    return groups


def overview_panels(series: dict) -> list[tuple[str, list[str]]]:
    """The overview's ``(title, metric names)`` panels for a run's ``series`` (name -> (xs,
    ys)): :data:`OVERVIEW_PANELS` filled with the metrics that exist and vary; a constant
    series (a data fingerprint, the example count) is never drawn. A run with none of those
    metrics gets one panel per varying metric."""
    live = {k for k, (_, ys) in series.items() if k not in _NOT_ON_OVERVIEW and _varies(ys)}
    panels = []
    for title, names in OVERVIEW_PANELS:
        found = [
            k
            for n in names
            for k in sorted(live)
            if (k.startswith(n) if n.endswith("/") else k == n)
        ]
        if found:
            panels.append((title, found))
    if not panels:
        panels = [(k, [k]) for k in sorted(live)]
    return panels or [(k, [k]) for k in sorted(series)][:1]


def plot_run(run_dir: str, *, keys=None, out_dir=None, smooth: float = 0.0) -> list[str]:
    """Write one PNG per metric group (``<group>.png``, a panel per metric that varies:
    :func:`metric_groups`; with ``keys``, the named metrics, constant or not) and
    ``overview.png`` (the panels a user reads: :func:`overview_panels`); returns the written
    paths."""
    from jaxrl_llm.train.run.logging import read_metrics

    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        raise JaxrlError(
            f"{run_dir}: no metrics.jsonl here; pass a run directory written by `jaxrl-llm train`"
        )
    if not 0.0 <= smooth < 1.0:
        raise JaxrlError(f"--smooth must be in [0, 1), got {smooth}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        for k, v in r.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            xs, ys = series.setdefault(k, ([], []))
            xs.append(r["step"])
            ys.append(v)
    if keys:
        missing = [k for k in keys if k not in series]
        if missing:
            raise JaxrlError(
                f"metrics not found in {run_dir}/metrics.jsonl: {missing}; "
                f"available: {sorted(series)}"
            )
        series = {k: series[k] for k in keys}
    if not series:
        raise JaxrlError(f"{run_dir}/metrics.jsonl has no numeric metrics to plot")
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)

    def ema(ys):
        out, acc = [], None
        for y in ys:
            acc = y if acc is None else smooth * acc + (1 - smooth) * y
            out.append(acc)
        return out

    written = []
    for group, names in metric_groups(series, drop_constant=not keys).items():
        cols = min(3, len(names))
        nrows = math.ceil(len(names) / cols)
        fig, axes = plt.subplots(
            nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), dpi=100, squeeze=False
        )
        for ax, k in zip(axes.flat, names):
            xs, ys = series[k]
            ax.plot(
                xs, ys, lw=1, alpha=0.5 if smooth else 1.0, marker="." if len(xs) < 15 else None
            )
            if smooth:
                ax.plot(xs, ema(ys), lw=1.8)
            ax.set_xlabel("step", fontsize=8)
            ax.set_title(k, fontsize=9)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        fig.tight_layout()
        path = os.path.join(out_dir, file_stem(group) + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    panels = overview_panels(series)
    n = len(panels)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 2.8 * nrows), dpi=100, squeeze=False)
    for ax, (title, names) in zip(axes.flat, panels):
        for k in names:
            xs, ys = series[k]
            ax.plot(
                xs, ema(ys) if smooth else ys, lw=1.2, marker="." if len(xs) < 15 else None, label=k
            )
        ax.set_title(title, fontsize=9)
        if len(names) > 1:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(out_dir, "overview.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written

"""``jaxrl-llm plot RUN_DIR``: PNG learning curves from a run's ``metrics.jsonl``."""

from __future__ import annotations

import argparse
import math
import os

from jaxrl_llm.errors import JaxrlError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm plot``."""
    parser.add_argument("run_dir", help="run directory containing metrics.jsonl")
    parser.add_argument("--keys", nargs="*", default=None,
                        help="metric names to plot (default: every numeric metric)")
    parser.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="exponential moving-average factor in [0, 1) drawn over the raw curve")


def plot_run(run_dir: str, *, keys=None, out_dir=None, smooth: float = 0.0) -> list[str]:
    """Write one PNG per metric (x = step) and an overview grid; returns the written paths."""
    from jaxrl_llm.train.logging import read_metrics

    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        raise JaxrlError(f"{run_dir}: no metrics.jsonl here; pass a run directory written by "
                         f"`jaxrl-llm train`")
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
            raise JaxrlError(f"metrics not found in {run_dir}/metrics.jsonl: {missing}; "
                             f"available: {sorted(series)}")
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
    for k, (xs, ys) in sorted(series.items()):
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=110)
        ax.plot(xs, ys, lw=1, alpha=0.5 if smooth else 1.0)
        if smooth:
            ax.plot(xs, ema(ys), lw=1.8)
        ax.set_xlabel("step")
        ax.set_title(k)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out_dir, k.replace("/", "_") + ".png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    n = len(series)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 2.8 * nrows), dpi=100,
                             squeeze=False)
    for ax, (k, (xs, ys)) in zip(axes.flat, sorted(series.items())):
        ax.plot(xs, ema(ys) if smooth else ys, lw=1.2)
        ax.set_title(k, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    path = os.path.join(out_dir, "overview.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm plot``."""
    paths = plot_run(args.run_dir, keys=args.keys, out_dir=args.out, smooth=args.smooth)
    for p in paths:
        print(p)
    return 0

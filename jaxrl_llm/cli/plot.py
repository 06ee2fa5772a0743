"""``jaxrl-llm plot RUN_DIR``: PNG learning curves from a run's ``metrics.jsonl``."""

from __future__ import annotations

import argparse

from jaxrl_llm.train.run.plots import overview_panels, plot_run  # noqa: F401  (the command's names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm plot``."""
    parser.add_argument("run_dir", help="run directory containing metrics.jsonl")
    parser.add_argument(
        "--keys",
        nargs="*",
        default=None,
        help="metric names to plot (default: every numeric metric)",
    )
    parser.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        help="exponential moving-average factor in [0, 1) drawn over the raw curve",
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm plot``."""
    paths = plot_run(args.run_dir, keys=args.keys, out_dir=args.out, smooth=args.smooth)
    for p in paths:
        print(p)
    return 0

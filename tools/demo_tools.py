"""The calculator demo end to end (``make demo-tools``): SmolLM2-135M-Instruct learns to use a
calculator tool for 3-digit × 3-digit multiplication.

Stages (each a ``jaxrl-llm`` command, timed):
1. base: held-out accuracy of the untouched model in the ``tools`` environment (``--eval-only``);
2. sft: the short warm start on generated tool-use transcripts (configs/sft_smollm2_tools.yaml);
3. grpo: GRPO in the ``tools`` environment from the SFT export (configs/grpo_smollm2_tools.yaml);
   its evaluation before the first step is the SFT model's accuracy, after the last the GRPO
   model's.
Held-out: 200 problems (data/tools_mult/heldout.jsonl) never trained on, greedy. Writes
``runs/tools_demo/report.json`` and prints the table BENCHMARKS.md records.

Usage: ``python tools/demo_tools.py [--out runs/tools_demo] [extra overrides for GRPO ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args: list[str]) -> float:
    print("$", " ".join(args), flush=True)
    t = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True)
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/tools_demo")
    p.add_argument("grpo_overrides", nargs="*", help="dotted overrides for the GRPO stage")
    a = p.parse_args(argv)
    out = os.path.join(ROOT, a.out)
    if os.path.isdir(out):
        print(f"demo-tools: replacing the previous run in {a.out}")
        shutil.rmtree(out)
    cli = [os.path.join(os.path.dirname(sys.executable), "jaxrl-llm"), "train"]
    t0 = time.perf_counter()
    times = {}
    times["base"] = _run(
        cli
        + [
            "configs/grpo_smollm2_tools.yaml",
            "model.source=smollm2-135m-instruct",
            f"output_dir={a.out}/base",
            "--eval-only",
        ]
    )
    times["sft"] = _run(cli + ["configs/sft_smollm2_tools.yaml", f"output_dir={a.out}/sft"])
    times["grpo"] = _run(
        cli
        + [
            "configs/grpo_smollm2_tools.yaml",
            f"model.source={a.out}/sft/hf",
            f"output_dir={a.out}/grpo",
            *a.grpo_overrides,
        ]
    )
    total = time.perf_counter() - t0
    base = json.load(open(os.path.join(out, "base", "eval.json")))
    summary = json.load(open(os.path.join(out, "grpo", "summary.json")))
    before, after = summary["eval_before"], summary["eval_after"]
    key, tool = "eval/math_answer", "eval/env/clean_tool_use_frac"
    rows = [
        ("base model", base[key], base.get(tool, 0.0)),
        ("after SFT warm start", before[key], before.get(tool, 0.0)),
        ("after GRPO", after[key], after.get(tool, 0.0)),
    ]
    report = {
        "accuracy": {name: acc for name, acc, _ in rows},
        "clean_tool_use": {name: t for name, _, t in rows},
        "seconds": {**times, "total": total},
    }
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print("\n| model | held-out accuracy (200) | episodes calling the tool cleanly |")
    print("|---|---|---|")
    for name, acc, t in rows:
        print(f"| {name} | {acc:.1%} | {t:.1%} |")
    print(
        f"\nwall clock: base eval {times['base']:.0f} s, SFT {times['sft']:.0f} s, "
        f"GRPO (with its two evaluations) {times['grpo']:.0f} s; total {total / 60:.1f} min"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

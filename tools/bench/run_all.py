"""The benchmark suite: run every benchmark in tools/bench and rewrite BENCHMARKS.md.

Each benchmark script runs in its own process (a fresh JAX, memory given back between them)
with the comparisons it makes side by side in that one process, and writes
``RESULTS/<name>.md`` (its section, with the exact command), ``RESULTS/<name>.json`` (headline
numbers) and, for the scaling curves, PNGs. Then the output markdown file is rewritten: only the
text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` markers is replaced (the
machine description, the summary against the targets, one block per benchmark, the commands);
everything outside the markers (hand-written analysis, main-job runs) is kept. A block whose
markers are missing is appended at the end under its heading; a missing file is created.

The machine is described once, at the top, when the whole suite runs (or the file has no
machine block yet); a partial run (``--only``) keeps each rewritten section's own ``Machine:``
line, so numbers from different runs stay attributable.

    python tools/bench/run_all.py                      # = jaxrl-llm bench
    python tools/bench/run_all.py --only decode,memory
    python tools/bench/run_all.py --quick --model tiny --out /tmp/b/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Bench:
    """One benchmark of the suite: its script, section heading and argument sets."""

    script: str
    heading: str
    quick: tuple[str, ...]  # tiny sizes: seconds, for smoke tests
    full: tuple[str, ...] = ()  # the script's defaults are the full sizes


BENCHES: dict[str, Bench] = {
    "decode": Bench(
        "bench_decode.py",
        "Decode",
        # The prefix-sharing shapes equal the throughput ones, so most programs compile once.
        quick=(
            "--prompts",
            "2",
            "--group",
            "2",
            "--prompt-len",
            "8",
            "--new-tokens",
            "4",
            "--prefix-prompts",
            "2",
            "--prefix-prompt-len",
            "8",
            "--prefix-group",
            "2",
            "--prefix-new-tokens",
            "4",
            "--repeats",
            "1",
            "--matmul-n",
            "128",
            "--bandwidth-mib",
            "8",
        ),
    ),
    "train_step": Bench(
        "bench_train_step.py",
        "Train step",
        quick=("--batch", "2", "--seq", "16", "--steps", "1", "--matmul-n", "128"),
    ),
    "train_profile": Bench(
        "profile_train_step.py",
        "Train-step profile",
        quick=("--batch", "2", "--seq", "16", "--steps", "1"),
    ),
    "memory": Bench(
        "bench_memory.py",
        "Memory",
        quick=("--rows", "2", "--seq", "16", "--chunk", "8", "--remat", "none"),
    ),
    "grpo_split": Bench(
        "bench_grpo_split.py",
        "GRPO step time split",
        quick=(
            "--steps",
            "1",
            "--set",
            "rollout.prompts_per_step=2",
            "--set",
            "rollout.group_size=2",
            "--set",
            "rollout.max_new_tokens=4",
        ),
    ),
    "update_skip": Bench(
        "bench_update_skip.py",
        "GRPO update: skipping zero-advantage groups",
        quick=("--micro-batch-groups", "1", "--repeats", "1"),
    ),
    "scaling": Bench(
        "bench_scaling.py",
        "Scaling curves",
        # Points that share shapes reuse compiled programs: (B=2, P=8) is the batch curve's
        # second point and the seq curve's first; G=1 with 1 prompt is B=1.
        quick=(
            "--batch-sizes",
            "1,2",
            "--batch-prompt-len",
            "8",
            "--seq-lens",
            "12,16",
            "--seq-rows",
            "2",
            "--groups",
            "1,2",
            "--group-prompts",
            "1",
            "--new-tokens",
            "4",
            "--repeats",
            "1",
        ),
    ),
}

# Targets stated in the project's issues (what "good" means for each headline number).
TARGETS = {
    "sampling_vs_hf": 3.0,  # decode with sampling ≥ 3× transformers generate (sampling)
    "roofline": 0.60,  # decode ≥ 60% of the roofline
    "prefix": 2.0,  # prefix sharing ≥ 2× over repeated prefill
    "mfu": 0.65,  # train step ≥ 65% MFU
    "vs_torch": 1.3,  # train step ≥ 1.3× torch eager
}

BLOCKS = ("machine", "summary", *BENCHES, "commands")
HEADINGS = {
    "machine": "Machine",
    "summary": "Summary against the targets",
    "commands": "How to reproduce",
    **{k: b.heading for k, b in BENCHES.items()},
}
TEMPLATE_INTRO = """# Benchmarks

Written by `jaxrl-llm bench` (`tools/bench/run_all.py`). The text between `<!-- bench:NAME -->`
and `<!-- /bench:NAME -->` markers is rewritten by the suite; everything else is kept.
"""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def get_block(text: str, name: str) -> str | None:
    """The content between a block's markers, or None when the file has no such block."""
    start, end = _markers(name)
    m = re.search(re.escape(start) + r"\n?(.*?)" + re.escape(end), text, re.S)
    return None if m is None else m.group(1)


def set_block(text: str, name: str, content: str) -> str:
    """``text`` with the block's content replaced (the block appended when missing)."""
    start, end = _markers(name)
    block = f"{start}\n{content.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip() + f"\n\n## {HEADINGS[name]}\n\n{block}\n"


def new_document() -> str:
    """An empty BENCHMARKS.md: the intro and every block, in order."""
    parts = [TEMPLATE_INTRO]
    for name in BLOCKS:
        start, end = _markers(name)
        parts.append(f"## {HEADINGS[name]}\n\n{start}\n{end}\n")
    return "\n".join(parts)


def section_for(md: str, *, results_dir: str, out_dir: str, keep_machine: bool) -> str:
    """A benchmark's report as it goes into the output: its heading level kept, image links
    made relative to the output file, its ``Machine:`` paragraph dropped unless kept."""
    lines = md.strip().splitlines()
    if not keep_machine:
        kept = []
        for line in lines:
            if line.startswith(common.MACHINE_PREFIX):
                continue
            if line == "" and kept and kept[-1] == "":
                continue
            kept.append(line)
        lines = kept
    text = "\n".join(lines)
    rel = os.path.relpath(results_dir, out_dir)
    return re.sub(
        r"\]\(([^)/\s]+\.png)\)",
        lambda m: "](" + os.path.join(rel, m.group(1)).replace(os.sep, "/") + ")",
        text,
    )


def machine_block(
    *,
    command: str,
    quick: bool,
    seconds: float,
    results_dir: str | None = None,
    names: tuple[str, ...] = (),
) -> str:
    """The machine description and how the suite was run.

    The machine is as the benchmark processes saw it (the ``machine`` entry of their
    ``results/*.json``, first of ``names`` that has one): this process may see other devices
    (e.g. under a test harness that forces 8 host devices). Without such a file, this process's
    own view."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    info = None
    reports = _load_metrics(results_dir) if results_dir else {}
    for name in names:
        if reports.get(name, {}).get("machine"):
            info = reports[name]["machine"]
            break
    if info is None:
        info = common.machine_info()
    order = ("CPU", "JAX devices", "software", "OS")
    keys = [k for k in order if k in info] + [k for k in info if k not in order]
    lines = [f"- {k}: {info[k]}" for k in keys]
    lines.append(f"- suite: `{command}`, {now}, {seconds / 60:.1f} min")
    if quick:
        lines += [
            "",
            "**Quick mode (`--quick`): tiny sizes, a smoke test of the suite; the "
            "numbers below mean nothing.**",
        ]
    return "\n".join(lines)


def _load_metrics(results_dir: str) -> dict[str, dict]:
    out = {}
    for name in BENCHES:
        path = os.path.join(results_dir, f"{name}.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                out[name] = json.load(f)
    return out


def _verdict(value: float, target: float) -> str:
    return "met" if value >= target else "missed"


def summary_block(results_dir: str) -> str:
    """Headline numbers of every benchmark with results, against the issues' targets."""
    reports = _load_metrics(results_dir)
    rows = []
    d = reports.get("decode", {}).get("metrics", {})
    if d:
        for mode in ("greedy", "sampling"):
            ours = d.get(f"jax_{mode}_tokens_per_s")
            hf = d.get(f"hf_{mode}_tokens_per_s")
            what = "decode, greedy" if mode == "greedy" else "decode, sampling τ = 1, top-p 0.95"
            if ours is None:
                continue
            if hf:
                measured = f"{ours:,.0f} tok/s; {ours / hf:.2f}× transformers ({hf:,.0f} tok/s)"
            else:
                measured = f"{ours:,.0f} tok/s (transformers not run)"
            if mode == "sampling" and hf:
                t = TARGETS["sampling_vs_hf"]
                rows.append([what, measured, f"≥ {t:g}× transformers", _verdict(ours / hf, t)])
            else:
                rows.append([what, measured, "—", ""])
        if "roofline_fraction_greedy" in d:
            f, t = d["roofline_fraction_greedy"], TARGETS["roofline"]
            rows.append(
                [
                    "decode (greedy) vs roofline",
                    f"{100 * f:.0f}% of {d['roofline_tokens_per_s']:,.0f} tok/s",
                    f"≥ {100 * t:.0f}%",
                    _verdict(f, t),
                ]
            )
        if "prefix_e2e_speedup" in d:
            s, t = d["prefix_e2e_speedup"], TARGETS["prefix"]
            rows.append(
                [
                    "prefix sharing (prefill + decode)",
                    f"{s:.1f}× ({d['prefix_shared_s']:.2f} s vs "
                    f"{d['prefix_repeated_s']:.2f} s repeated)",
                    f"≥ {t:g}×",
                    _verdict(s, t),
                ]
            )
    ts = reports.get("train_step", {}).get("metrics", {})
    if ts:
        t = TARGETS["mfu"]
        rows.append(
            [
                "train step MFU",
                f"{100 * ts['jax_mfu']:.0f}%; "
                f"{ts['jax_tokens_per_s']:,.0f} tok/s, {ts['jax_step_s']:.2f} s/step",
                f"≥ {100 * t:.0f}%",
                _verdict(ts["jax_mfu"], t),
            ]
        )
        if "speedup_vs_torch" in ts:
            s, t = ts["speedup_vs_torch"], TARGETS["vs_torch"]
            rows.append(
                [
                    "train step vs torch eager",
                    f"{s:.2f}× ({ts['jax_step_s']:.2f} s vs {ts['torch_step_s']:.2f} s)",
                    f"≥ {t:g}×",
                    _verdict(s, t),
                ]
            )
    mem = reports.get("memory", {}).get("metrics", {})
    if mem:
        parts = [
            f"{-100 * mem[f'saving_{r}_fraction']:+.0f}% (remat {r})".replace("-", "−")
            for r in ("none", "full")
            if f"saving_{r}_fraction" in mem
        ]
        rows.append(
            ["peak memory, chunked log-probs vs full logits", ", ".join(parts), "shown", "measured"]
        )
    g = reports.get("grpo_split", {}).get("metrics", {})
    if g:
        step = g["step_s"]
        split = ", ".join(
            f"{label} {100 * g[key] / step:.0f}%"
            for key, label in [
                ("generation_s", "generation"),
                ("reward_s", "reward"),
                ("reference_s", "reference"),
                ("update_s", "update"),
                ("other_s", "other"),
            ]
        )
        rows.append(
            [
                f"GRPO step ({g['rows']} rows, β = {g['kl_coef']:g})",
                f"{step:.2f} s: {split}",
                "—",
                "",
            ]
        )
    u = reports.get("update_skip", {}).get("metrics", {})
    if u and u.get("results"):
        whole = u["results"].get("whole batch", {})
        best = [(k, v) for k, v in u["results"].items() if k != "whole batch"]
        ks = sorted(whole, key=int)
        if best and ks:
            label, cells = min(best, key=lambda kv: sum(kv[1].values()))
            speed = ", ".join(f"{whole[k] / cells[k]:.2f}× at {k}/{u['groups']}" for k in ks)
            rows.append(
                [
                    f"GRPO update skipping zero-advantage groups ({label}) vs whole batch",
                    f"{speed} groups informative",
                    "—",
                    "",
                ]
            )
    sc = reports.get("scaling", {}).get("metrics", {})
    if sc:
        best = [
            f"{sc[f'{c}_best_tokens_per_s']:,.0f} tok/s at {c} = {sc[f'{c}_best_x']}"
            for c in ("batch", "seq", "group")
            if f"{c}_best_x" in sc
        ]
        rows.append(["sampler scaling, best point per curve", "; ".join(best), "—", ""])
    if not rows:
        return "No results yet."
    return "\n".join(common.markdown_table(["what", "measured", "target", "verdict"], rows))


def commands_block(
    *, suite_command: str, names, durations: dict[str, float], results_dir: str
) -> str:
    """The suite's command and each benchmark's exact command (from its last report)."""
    reports = _load_metrics(results_dir)
    lines = [
        "The whole suite (rewrites the marked sections of this file):",
        "",
        "```",
        suite_command,
        "```",
        "",
        "One benchmark at a time (the commands of the tables above):",
        "",
        "```",
    ]
    for name in names:
        if name in reports:
            lines.append(reports[name]["command"])
        else:  # not run yet: what the suite would run
            b = BENCHES[name]
            md = os.path.join(results_dir, f"{name}.md")
            md = (
                md
                if os.path.relpath(md, common.ROOT).startswith("..")
                else os.path.relpath(md, common.ROOT)
            )
            lines.append(" ".join(["python", f"tools/bench/{b.script}", *b.full, "--out", md]))
    lines.append("```")
    if durations:
        lines += [
            "",
            "Wall time of each benchmark in the last run: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in durations.items())
            + ".",
        ]
    return "\n".join(lines)


def _parse_only(only: str | None) -> list[str]:
    from jaxrl_llm.errors import JaxrlError

    if not only:
        return list(BENCHES)
    names = [x.strip() for x in only.split(",") if x.strip()]
    unknown = [x for x in names if x not in BENCHES]
    if unknown or not names:
        raise JaxrlError(
            f"--only {only!r}: unknown benchmark(s) {unknown}; known: {', '.join(BENCHES)}"
        )
    return [n for n in BENCHES if n in names]


def run_suite(args: argparse.Namespace, *, prog: str = "python tools/bench/run_all.py") -> int:
    """Run the selected benchmarks and rewrite the output file; 0 when every one succeeded."""
    names = _parse_only(args.only)
    repo_out = os.path.join(common.ROOT, "BENCHMARKS.md")
    if args.out:
        out = os.path.abspath(args.out)
    elif args.quick:
        out = os.path.join(common.ROOT, "build", "bench-quick", "BENCHMARKS.md")
    else:
        out = repo_out
    out_dir = os.path.dirname(out)
    results_dir = (
        os.path.abspath(args.results_dir)
        if args.results_dir
        else (common.RESULTS_DIR if out == repo_out else os.path.join(out_dir, "results"))
    )
    os.makedirs(results_dir, exist_ok=True)
    argv = (["--only", ",".join(names)] if args.only else []) + (["--quick"] if args.quick else [])
    if args.out:
        argv += ["--out", args.out]
    if args.results_dir:
        argv += ["--results-dir", args.results_dir]
    if args.model != common.DEFAULT_MODEL:
        argv += ["--model", args.model]
    suite_command = " ".join([prog] + [shlex.quote(a) for a in argv])

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([common.ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    t_suite = time.perf_counter()
    status: dict[str, int] = {}
    durations: dict[str, float] = {}
    for i, name in enumerate(names, 1):
        b = BENCHES[name]
        md = os.path.join(results_dir, f"{name}.md")
        script = os.path.join(common.BENCH_DIR, b.script)
        cmd = [
            sys.executable,
            script,
            *(b.quick if args.quick else b.full),
            "--model",
            args.model,
            "--out",
            md,
        ]
        common.log(f"[{i}/{len(names)}] {name}: {' '.join(shlex.quote(c) for c in cmd)}")
        t0 = time.perf_counter()
        # The report goes to the file; the child's stdout (the same text) is not repeated here.
        rc = subprocess.call(cmd, cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL)
        durations[name] = time.perf_counter() - t0
        status[name] = rc
        common.log(
            f"[{i}/{len(names)}] {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
            f"in {durations[name]:.0f} s"
        )

    text = open(out, encoding="utf-8").read() if os.path.isfile(out) else new_document()
    whole = len(names) == len(BENCHES) or get_block(text, "machine") is None
    for name in names:
        md = os.path.join(results_dir, f"{name}.md")
        if status[name] == 0 and os.path.isfile(md):
            with open(md, encoding="utf-8") as f:
                content = section_for(
                    f.read(), results_dir=results_dir, out_dir=out_dir, keep_machine=not whole
                )
        else:
            old = (get_block(text, name) or "").strip()
            note = (
                f"> Not re-measured: `{BENCHES[name].script}` failed (exit status "
                f"{status[name]}) in the run of {prog}"
                + ("; what follows is from an earlier run." if old else ".")
            )
            content = note + ("\n\n" + old if old and not old.startswith("> Not re-") else "")
        text = set_block(text, name, content)
    if whole:
        text = set_block(
            text,
            "machine",
            machine_block(
                command=suite_command,
                quick=args.quick,
                seconds=time.perf_counter() - t_suite,
                results_dir=results_dir,
                names=tuple(n for n in names if status[n] == 0),
            ),
        )
    # The summary is rebuilt from results/*.json; while some benchmark has none yet (it was
    # never run by the suite), a summary already in the file is kept rather than shrunk.
    have_all = all(os.path.isfile(os.path.join(results_dir, f"{n}.json")) for n in BENCHES)
    if have_all or not (get_block(text, "summary") or "").strip():
        text = set_block(text, "summary", summary_block(results_dir))
    else:
        common.log(
            "summary block kept: some benchmarks have no results/*.json yet "
            "(run the whole suite to rebuild it)"
        )
    text = set_block(
        text,
        "commands",
        commands_block(
            suite_command=suite_command if whole else prog,
            names=list(BENCHES),
            durations=durations,
            results_dir=results_dir,
        ),
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text.rstrip() + "\n")
    failed = [n for n, rc in status.items() if rc]
    common.log(
        f"wrote {out} ({len(names) - len(failed)}/{len(names)} benchmarks"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + ")"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python tools/bench/run_all.py [options]``: the same options as ``jaxrl-llm bench``."""
    from jaxrl_llm.cli.bench import add_arguments
    from jaxrl_llm.errors import JaxrlError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_suite(args)
    except JaxrlError as e:
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Compiled per-device TPU memory of Llama-3-8B / 70B, Qwen3.5 and gpt-oss post-training runs vs the
estimator, compiled on a CPU machine with the TPU compiler (``jaxrl-llm compile``; needs
``libtpu``).

Each configuration runs ``jaxrl-llm compile ... --json`` in its own process (one compile's
host memory is freed before the next) with a time limit, and its JSON is appended to a cache
file, so an interrupted run resumes where it stopped (``--cache``). The settings are the ones
a user would pick at that scale: bf16 compute with float32 master weights and AdamW, full
rematerialisation, FSDP over every chip, rollout batches split into minibatches (online) or
micro-batches (offline) so a device holds a few rows per forward/backward.

Full run:   python tools/bench/bench_tpu_compile.py --out tools/bench/results/tpu_compile.md
Only some:  python tools/bench/bench_tpu_compile.py --only 8b-grpo-v5p:2x2x1 --out /tmp/t.md
Work:       python tools/bench/bench_tpu_compile.py --work --out tools/bench/results/tpu_work.md
            (per-device FLOPs / HBM / collective bytes with loop trip counts, each program's
            roofline and implied MFU, and the decode loop on one device vs split over data=8)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GiB = 1024**3

# (model, algorithm, topology, mesh, extra arguments)
_ONLINE = ["--batch", "8", "--group-size", "8", "--seq-len", "1024", "--minibatches", "4"]
_ONLINE_70 = ["--batch", "16", "--group-size", "8", "--seq-len", "1024", "--minibatches", "2"]
CONFIGS = [
    ("8b", "grpo", "v5p:2x2x1", "fsdp=4", _ONLINE),
    (
        "8b",
        "dpo",
        "v5p:2x2x1",
        "fsdp=4",
        ["--batch", "16", "--seq-len", "1024", "--micro-batches", "4"],
    ),
    ("8b", "ppo", "v5p:2x2x1", "fsdp=4", _ONLINE),
    ("70b", "grpo", "v5p:4x4x4", "fsdp=64", _ONLINE_70),
    ("70b", "dpo", "v5p:4x4x4", "fsdp=64", ["--batch", "64", "--seq-len", "1024"]),
    ("70b", "ppo", "v5p:4x4x4", "fsdp=64", _ONLINE_70),
    ("8b", "grpo", "v6e:2x4", "fsdp=8", _ONLINE),
    (
        "8b",
        "dpo",
        "v6e:2x4",
        "fsdp=8",
        ["--batch", "16", "--seq-len", "1024", "--micro-batches", "2"],
    ),
    ("8b", "ppo", "v6e:2x4", "fsdp=8", _ONLINE),
    # Qwen3.5 (issue 34): the hybrid linear-attention stack, dense and a mixture of experts
    ("qwen3.5-9b", "grpo", "v5p:2x2x1", "fsdp=4", _ONLINE),
    ("qwen3.5-35b-a3b", "grpo", "v5p:2x2x4", "fsdp=4,expert=4", _ONLINE),
    # gpt-oss-20b (issue 41): attention sinks, alternating sliding / full layers, biased experts;
    # FSDP over 8 chips, and its 32 experts split over expert=4 beside fsdp=4
    ("gpt-oss-20b", "grpo", "v5p:2x2x2", "fsdp=8", _ONLINE),
    ("gpt-oss-20b", "grpo", "v5p:2x2x4", "fsdp=4,expert=4", _ONLINE),
]


# (name, model, algorithm, topology, extra arguments): the per-device work report (--work)
WORK_CONFIGS = [
    ("8b-grpo-v5p:2x2x2-fsdp8", "8b", "grpo", "v5p:2x2x2", ["--mesh", "fsdp=8", *_ONLINE]),
    (
        "1b-grpo-v5p:2x2x2-data8",
        "1b",
        "grpo",
        "v5p:2x2x2",
        ["--mesh", "data=8", *_ONLINE],
    ),
    (
        "1b-grpo-v5p:2x2x2[:1]-data1",
        "1b",
        "grpo",
        "v5p:2x2x2",
        ["--devices", "1", "--mesh", "data=1", *_ONLINE],
    ),
]


# What the buffer reports of these compiles show, and what the estimate counts of it
# (XLA_FLAGS=--xla_dump_to=DIR writes *memory-usage-report.txt per program).
NOTES = [
    "",
    "Compiled on a shared 2-core host (another job's tests ran beside some): compile times "
    "(last column) are wall-clock and noisy. Every row was compiled with the activations "
    "placed by rows (commit ffb434b, models/layout.py) and its estimate is estimate_memory as "
    "it is now, recomputed from the cached settings.",
    "",
    "Columns: rows/update = sequences (DPO: pairs) in one forward/backward of the policy (the "
    "whole mesh); train args / temps = the train step's arguments (train state, batch) and "
    "temporaries, GiB per device; program peaks = each program's arguments + outputs − "
    "aliased + temporaries + the arrays that stay alive through the step without being its "
    "arguments (the optimizer state while decoding, the reference while updating, PPO's "
    "critic and reward model); compiled peak = the largest; estimate = `jaxrl-llm memory` "
    "for the same settings.",
    "",
    "From XLA's buffer reports of the compiled train steps:",
    "",
    "* **Activations by rows.** Under FSDP each device holds its own rows: the 8B GRPO step "
    "on v5p:2x2x1 (fsdp=4, 16 rows per update) holds `bf16[4,512,14336]` MLP activations "
    "(a completion's 512 tokens, 4 rows), `f32[4,128,128256]` log-prob chunks and "
    "`bf16[32,4,512,4096]` saved layer inputs per device; on v6e:2x4 (fsdp=8, 2 rows per "
    "device) `bf16[2,512,14336]`, `f32[2,128,128256]` and `bf16[32,2,512,4096]`; the 8B DPO "
    "step on v5p (8 sequences per micro-batch) `bf16[32,2,1024,4096]` and "
    "`f32[2,128,128256]`; the 70B DPO step on v5p:4x4x4 (fsdp=64, 128 sequences, 2 per "
    "device) `bf16[2,1024,28672]`, `f32[2,128,128256]` and `bf16[80,2,1024,8192]`; the "
    "Qwen3.5-9B step one input per period of 4 layers, "
    "`bf16[8,4,512,4096]`. Before "
    "the row placement every device held every row (`bf16[64,512,14336]` in the 8B step on "
    "fsdp=8 with 64 rows).",
    "* **The bf16 copy of the weights.** XLA hoists each layer's `kernel.astype(bf16)` out of "
    "the scan over layers (`bf16[32,1024,14336]` x 3 in the 8B step on fsdp=4); counted.",
    "* **The unembedding gathered whole.** The log-prob chunks take the whole `[D, V]` "
    "unembedding: `bf16[4096,128256]` (1002 MiB) in the 8B steps on fsdp=4; counted since "
    "this table (one copy; the buffer reports show 2 slots of it in the 8B steps, 5 of "
    "`bf16[8192,128256]`, 1.96 GiB each, in the 70B DPO step).",
    "* **Gradient accumulation.** The step's scan over micro-batches carries a float32 "
    "gradient sum beside the micro-batch's gradient: the 8B DPO step (4 micro-batches) holds "
    "6 slots of `f32[32,1024,14336]` (1.75 GiB each) against GRPO's 3; counted since this "
    "table (`micro_batches` > 1; the online minibatches are separate updates, no sum).",
    "* **Gradients only during their model's update.** PPO's critic step does not hold the "
    "policy's gradients (nor the policy step the critic's, nor the decode loop either): the "
    "estimate counted both as resident (8B PPO: 81.7 GiB with both, against 73.9 compiled); "
    "now they are part of each update's transient memory.",
    "* **On-chip memory.** XLA places small temporaries in the chip's on-chip memory first "
    "(46 MiB of vmem in the 8B DPO step on v5p); the HBM numbers leave it out. Fragmentation "
    "and the runtime's own reservations are not in either number.",
    "* **An optimizer update out of place (gpt-oss, issue 41).** XLA's TPU backend lays out "
    "each argument with the dimension padded least to 128 lanes as its minor one; gpt-oss's "
    "width 2,880 over fsdp=8 leaves `experts_down` shards `f32[24,32,2880,360]`, laid out "
    "2,880-minor, while their gradient is 360-minor: the update copies the weight and both "
    "moments into the gradient's layout and forms their new values there, six 3.16 GiB "
    "arrays (1.58 GiB each with expert=4), the train step's live peak of temporaries; counted "
    "since session 20 (`memory_tiles.py`). Both gpt-oss rows' `memory_analysis()` "
    "temporaries exceed the dumped buffer assignment (28.1 against 21.2 GiB on fsdp=8, 16.3 "
    "against 12.1 GiB with expert=4), which exceeds the live peak (19.3, 10.1 GiB): not "
    "modelled.",
    "* **FLOPs**: XLA's cost analysis counts a loop body once (the scan over layers, "
    "micro-batches, decode steps), so its number is about 1/L of a step; the report gives "
    "6N (8N with full remat) per token beside it.",
]


def key(model: str, algorithm: str, topology: str) -> str:
    """The cache key of one configuration: ``8b-grpo-v5p:2x2x1``."""
    return f"{model}-{algorithm}-{topology}"


def run_one(model, algorithm, topology, mesh, extra, *, timeout: int) -> dict:
    """One ``jaxrl-llm compile --json`` in a child process; its JSON, or the failure
    (``mesh`` None: ``extra`` carries ``--mesh``)."""
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jaxrl_llm.cli.main import main; sys.exit(main())",
        "compile",
        "--model",
        model,
        "--algorithm",
        algorithm,
        "--topology",
        topology,
        *([] if mesh is None else ["--mesh", mesh]),
        *extra,
        "--json",
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout} s", "seconds": timeout}
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = [
            ln
            for ln in proc.stderr.splitlines()
            if ln.strip() and not ln.startswith(("E0000", "WARNING", "===", "learning/"))
        ][-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:400]}", "seconds": seconds}
    return {**json.loads(lines[-1]), "seconds": round(seconds, 1)}


def estimate_bytes(model: str, algorithm: str, topology: str, r: dict) -> int:
    """The current estimator's total for a cached result's settings (so a report rewritten
    after an estimator change compares with the estimator as it is now)."""
    from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, MODEL_PRESETS, estimate_memory

    s = r["settings"]
    kw = s.get("estimate_kwargs")
    if kw is None:  # results cached before the settings carried the estimator's arguments
        online = ALGORITHM_MEMORY[algorithm].online
        rows = s["batch_size"] * (s["group_size"] if online else 1)
        kw = dict(
            batch_size=s["batch_size"],
            seq_len=s["seq_len"],
            prompt_len=s["prompt_len"],
            group_size=s["group_size"] or 1,
            dtype=s["dtype"],
            lora_rank=s["lora_rank"],
            remat=s["remat"],
            device="tpu-" + topology.split(":")[0],
            micro_batches=s.get("micro_batches") or 1,
            minibatches=max(1, rows // s["rows_per_update"] // (s.get("micro_batches") or 1)),
            prompt_group_size=s["group_size"] if online and algorithm != "online_dpo" else 1,
            **r["mesh"],
        )
    return estimate_memory(MODEL_PRESETS[model], algorithm, **kw).total_bytes_per_device


def _gib(b) -> str:
    return f"{b / GiB:.1f}"


def report(results: dict[str, dict]) -> list[str]:
    """The markdown body: one row per configuration, then what the estimate leaves out."""
    rows = []
    for model, algorithm, topology, mesh, _ in CONFIGS:
        r = results.get(key(model, algorithm, topology))
        if r is None:
            continue
        if "error" in r:
            rows.append(
                [model, algorithm, topology, mesh, "", "", "", "", "", "", f"failed: {r['error']}"]
            )
            continue
        progs = {p["name"]: p for p in r["programs"]}
        est = estimate_bytes(model, algorithm, topology, r)
        train = progs["train"]
        s = r["settings"]
        rows.append(
            [
                model,
                algorithm,
                topology,
                mesh,
                s["rows_per_update"],
                _gib(train["argument_bytes"]) + " / " + _gib(train["temp_bytes"]),
                " / ".join(f"{n} {_gib(p['peak_bytes'])}" for n, p in progs.items()),
                _gib(r["compiled_peak_bytes"]),
                _gib(est),
                f"{est / r['compiled_peak_bytes']:.2f}",
                f"{'fits' if r['fits'] else 'does NOT fit'} ({_gib(r['hbm_bytes_per_device'])}); "
                f"{r['seconds']:.0f} s",
            ]
        )
    return (
        common.markdown_table(
            [
                "model",
                "algo",
                "topology",
                "mesh",
                "rows/update",
                "train args / temps",
                "program peaks (+resident)",
                "compiled peak",
                "estimate",
                "est/compiled",
                "verdict; compile time",
            ],
            rows,
            align="lllrrllrrrl",
        )
        + NOTES
    )


def _work_row(name: str, r: dict) -> list:
    """One program line of the work report per program of a cached result."""
    if "error" in r:
        return [[name, "", "", "", "", "", "", "", "", f"failed: {r['error']}"]]
    rows = []
    for p in r["programs"]:
        roof = p.get("roofline") or {}
        mfu = roof.get("mfu")
        rows.append(
            [
                name,
                p["name"],
                p["calls_per_step"],
                f"{p['hlo_flops'] / 1e12:.3f}",
                f"{p['flops'] / 1e12:.3f}",
                "-" if p["model_flops"] is None else f"{p['model_flops'] / 1e12:.3f}",
                f"{p['hbm_access_bytes'] / 1e9:.1f}",
                f"{p['collective_bytes'] / 1e9:.2f}",
                f"{roof.get('seconds', 0) * 1e3:.1f} ({roof.get('bound', '-')})",
                "-" if mfu is None else f"{100 * mfu:.1f}%",
            ]
        )
    step = r.get("step_roofline") or {}
    if step:
        mfu = step.get("mfu")
        rows.append(
            [
                name,
                "**step**",
                "",
                "",
                "",
                "",
                "",
                "",
                f"{step['seconds'] * 1e3:.1f}",
                "-" if mfu is None else f"{100 * mfu:.1f}%",
            ]
        )
    return rows


def work_report(results: dict[str, dict]) -> list[str]:
    """The markdown body of ``--work``: per program and device, one call."""
    rows = []
    for name, *_ in WORK_CONFIGS:
        if name in results:
            rows += _work_row(f"{name} ({results[name].get('seconds', 0):.0f} s)", results[name])
    return common.markdown_table(
        [
            "run (compile time)",
            "program",
            "calls/step",
            "TFLOP (HLO, trips)",
            "TFLOP (XLA cost analysis)",
            "model TFLOP",
            "HBM GB",
            "collective GB",
            "roofline ms (bound)",
            "implied MFU",
        ],
        rows,
        align="llrrrrrrrr",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the configurations (or ``--only`` some), cache their JSON, write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument(
        "--cache",
        default="/tmp/jaxrl_tpu_compile.jsonl",
        help="JSON lines of finished configurations (resumes from it)",
    )
    p.add_argument("--only", nargs="*", default=None, help="keys like 8b-grpo-v5p:2x2x1")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per configuration")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report")
    p.add_argument(
        "--from-report",
        default=None,
        help="also read finished configurations from a report's JSON (tools/bench/results/"
        "tpu_compile.json): its compiled numbers, with the estimate recomputed as it is now",
    )
    p.add_argument(
        "--work",
        action="store_true",
        help="the per-device work report (WORK_CONFIGS) instead of the memory one",
    )
    args = p.parse_args(argv)
    results: dict[str, dict] = {}
    if os.path.exists(args.cache):
        with open(args.cache, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                results[rec["key"]] = rec["result"]
    if args.from_report:
        with open(args.from_report, encoding="utf-8") as f:
            results = {**json.load(f)["metrics"], **results}
    if args.work:
        return _main_work(args, argv, results)
    for model, algorithm, topology, mesh, extra in CONFIGS:
        k = key(model, algorithm, topology)
        if args.report_only or k in results or (args.only is not None and k not in args.only):
            continue
        common.log(f"compiling {k} (mesh {mesh}) ...")
        res = run_one(model, algorithm, topology, mesh, extra, timeout=args.timeout)
        common.log(
            f"{k}: "
            + (
                res.get("error")
                or f"peak {_gib(res['compiled_peak_bytes'])} GiB, estimate "
                f"{_gib(res['estimate_bytes'])} GiB, {res['seconds']} s"
            )
        )
        results[k] = res
        with open(args.cache, "a", encoding="utf-8") as f:
            f.write(json.dumps({"key": k, "result": res}) + "\n")
    body = report(results)
    common.write_report(
        args.out,
        title="Compiled TPU memory per device vs the estimate (jaxrl-llm compile)",
        command=common.command_line(__file__, argv),
        body=body,
        metrics={k: v for k, v in results.items()},
    )
    return 0


def _main_work(args, argv, results: dict[str, dict]) -> int:
    """``--work``: compile WORK_CONFIGS (those not cached), write the work report."""
    for name, model, algorithm, topology, extra in WORK_CONFIGS:
        if args.report_only or name in results or (args.only is not None and name not in args.only):
            continue
        common.log(f"compiling {name} ...")
        res = run_one(model, algorithm, topology, None, extra, timeout=args.timeout)
        common.log(f"{name}: " + (res.get("error") or f"{res['seconds']} s"))
        results[name] = res
        with open(args.cache, "a", encoding="utf-8") as f:
            f.write(json.dumps({"key": name, "result": res}) + "\n")
    common.write_report(
        args.out,
        title="Per-device work, roofline and implied MFU (jaxrl-llm compile)",
        command=common.command_line(__file__, argv),
        body=work_report(results),
        metrics={k: v for k, v in results.items() if k in {w[0] for w in WORK_CONFIGS}},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

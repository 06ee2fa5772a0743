"""What every benchmark in tools/bench shares: the machine description, timing helpers, the
measured rooflines, model loading by name, and the report format the suite assembles.

A benchmark script writes its report with :func:`write_report`: a markdown section

    ### <title>

    Command: `python tools/bench/<script>.py <args>`

    Machine: <one line, see machine_line()>

    <body>

and, next to it, ``<out>.json`` with the section's headline numbers (``metrics``), which the
suite (``run_all.py``) reads for the summary table. The suite states the machine once at the
top of BENCHMARKS.md and drops the per-section ``Machine:`` paragraph when every section comes
from the same run.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_DIR = os.path.join(ROOT, "tools", "bench")
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
DEFAULT_MODEL = "smollm2-135m-instruct"
TINY = "tiny"  # a tiny random Llama (ModelConfig.tiny), no download, for smoke tests
# ``preset:NAME[:DTYPE]``: random weights at the shapes of a size preset of the memory planner
# (``jaxrl-llm memory --help`` lists them: 1b, 8b, ...), in DTYPE (float32 by default) for both
# parameters and compute. For hosts with no copy of the weights (an offline accelerator machine):
# a step's time does not depend on the weights' values.
PRESET = "preset:"
MACHINE_PREFIX = "Machine: "


def log(*args: Any) -> None:
    """Progress on stderr (stdout carries the report)."""
    print(*args, file=sys.stderr, flush=True)


# ----- the machine ----------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            import subprocess

            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _version(dist: str) -> str:
    """An installed distribution's version, without importing it (torch takes seconds)."""
    from importlib import metadata

    try:
        v = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"
    torch = sys.modules.get("torch") if dist == "torch" else None
    if torch is not None and torch.cuda.is_available():  # only when already imported
        v += f", CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"
    return v


def machine_info() -> dict[str, str]:
    """The machine and software the numbers come from, as ordered ``name -> value`` strings."""
    import jax

    devs = jax.devices()
    kinds = sorted({d.device_kind for d in devs})
    accel = f"{len(devs)} × {devs[0].platform} ({', '.join(kinds)})"
    try:
        stats = devs[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - not every backend reports memory
        stats = {}
    if stats.get("bytes_limit"):
        accel += f", {stats['bytes_limit'] / 2**30:.1f} GiB per device"
    mem = _memory_bytes()
    return {
        "CPU": f"{_cpu_model()}, {os.cpu_count()} logical cores"
        + (f", {mem / 2**30:.1f} GiB memory" if mem else ""),
        "JAX devices": accel,
        "software": (
            f"jax {jax.__version__} (jaxlib {_version('jaxlib')}, backend "
            f"{jax.default_backend()}); torch {_version('torch')}; transformers "
            f"{_version('transformers')}; python {platform.python_version()}"
        ),
        "OS": platform.platform(),
    }


# Datasheet peaks of accelerators (dense, no sparsity), by JAX's ``device_kind``: FLOP/s per
# compute dtype and HBM bytes/s. On CPU the limit is a measured matmul; on TPU and GPU it is
# the datasheet. Sources: NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM: bf16 989.5
# TFLOP/s, TF32 494.7, fp32 66.9; HBM 3.35 TB/s for the H100, 4.8 TB/s for the H200).
DATASHEETS: dict[str, tuple[dict[str, float], float]] = {
    "NVIDIA H200": ({"bfloat16": 989.5e12, "tf32": 494.7e12, "float32": 66.9e12}, 4.8e12),
    "NVIDIA H100 80GB HBM3": (
        {"bfloat16": 989.5e12, "tf32": 494.7e12, "float32": 66.9e12},
        3.35e12,
    ),
}


def datasheet() -> tuple[dict[str, float], float] | None:
    """``(FLOP/s by dtype, bytes/s)`` of JAX's first device from :data:`DATASHEETS`, or None
    (a CPU, or an accelerator not in the table)."""
    import jax

    return DATASHEETS.get(jax.devices()[0].device_kind)


def machine_line() -> str:
    """:func:`machine_info` on one line (the ``Machine:`` paragraph of a report)."""
    return "; ".join(f"{k}: {v}" for k, v in machine_info().items())


# ----- timing and rooflines ---------------------------------------------------------------------
def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` (which must block until done)."""
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def timed_first_call(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn``: on a fresh shape, compile + run."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def matmul_rate(m: int, k: int, n: int, *, repeats: int = 5) -> float:
    """Measured float32 FLOP/s of a jitted ``[m, k] × [k, n]`` matmul on JAX's first device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    return 2.0 * m * k * n / best_time(lambda: f(a, b).block_until_ready(), repeats)


def memory_bandwidth(*, nbytes: int = 2**30, repeats: int = 5) -> float:
    """Measured streaming bytes/s on JAX's first device over a ``nbytes`` float32 buffer: the
    better of an in-place ``x ← 1.0001·x`` (donated, each byte read and written once) and a
    read-only ``sum(x)``. Make ``nbytes`` larger than the last-level cache."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    read = nbytes / best_time(lambda: total(x).block_until_ready(), repeats)
    scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    x = scale(x).block_until_ready()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        x = scale(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return max(read, 2.0 * nbytes / best)


# ----- models -----------------------------------------------------------------------------------
def tiny_config():
    """The tiny random model of the smoke runs (odd sizes: d=48, 3 heads, vocab 97)."""
    from jaxrl_llm.models import ModelConfig

    return ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)


def preset_config(name: str):
    """The ModelConfig of a ``preset:NAME[:DTYPE]`` model name (see ``PRESET``)."""
    from jaxrl_llm.train.compile.memory_presets import MODEL_PRESETS

    size, _, dtype = name.removeprefix(PRESET).partition(":")
    if size not in MODEL_PRESETS:
        raise SystemExit(
            f"--model {name}: unknown preset {size!r}; known: {', '.join(MODEL_PRESETS)}"
        )
    dtype = dtype or "float32"
    return MODEL_PRESETS[size].replace(param_dtype=dtype, compute_dtype=dtype)


def model_config(name: str):
    """The ModelConfig of a model name (``tiny``, ``preset:...``, an alias or a path), without
    its weights where possible (SmolLM2-135M's shapes are a preset)."""
    from jaxrl_llm.models import ModelConfig

    if name == TINY:
        return tiny_config()
    if name.startswith(PRESET):
        return preset_config(name)
    if name == DEFAULT_MODEL:
        return ModelConfig.smollm2_135m()
    return load_model(name)[0]


def load_model(name: str):
    """``(config, params, tokenizer or None)`` for ``tiny`` or ``preset:...`` (random init) or
    an alias / path."""
    if name == TINY or name.startswith(PRESET):
        import jax

        from jaxrl_llm.models import init_params

        config = model_config(name)
        return config, init_params(config, jax.random.PRNGKey(0)), None
    from jaxrl_llm.interop import load_model as _load

    loaded = _load(name)
    return loaded.config, loaded.params, loaded.tokenizer


def online_run_overrides(model: str, *, kl_coef: float, prefix: str) -> list[str]:
    """Config overrides for timing the online trainer: model.source (``tiny`` or a name), β,
    a temporary output_dir removed at exit, and no evaluation, logging files, export or
    checkpoints."""
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix=prefix)  # output_dir: nothing is kept
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    source = (
        ["model.source=tiny", "model.tokenizer=char"]
        if model == TINY
        else [f"model.source={model}"]
    )
    return source + [
        f"output_dir={tmp}",
        f"loss.kl_coef={kl_coef}",
        "eval.every=0",
        "logging.tensorboard=false",
        "logging.plots=false",
        "checkpoint.export_hf=false",
        "checkpoint.save_every=0",
    ]


def hf_model_dir(name: str, config, params) -> str:
    """A Hugging Face directory transformers can load for the same weights."""
    if name == TINY or name.startswith(PRESET):
        import atexit
        import shutil
        import tempfile

        from jaxrl_llm.interop import export_hf

        out = tempfile.mkdtemp(prefix="bench_tiny_hf_")
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        export_hf(out, config=config, params=params)
        return out
    if os.path.isdir(name):
        return name
    from jaxrl_llm.interop import MODEL_ALIASES, cached_gguf_dir, resolve_alias

    if name in MODEL_ALIASES:
        return str(cached_gguf_dir(resolve_alias(name)))
    if name.endswith(".gguf"):
        return str(cached_gguf_dir(name))
    raise ValueError(f"no Hugging Face directory for model {name!r}")


def have(module: str) -> bool:
    """Whether ``module`` can be imported (torch, transformers and matplotlib are optional:
    the ``dev`` extra)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def torch_device() -> str:
    """Where the torch side of a comparison runs: the GPU when torch sees one, else the CPU
    (on a TPU host the torch numbers are CPU numbers; the reports say which)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


# ----- reports ----------------------------------------------------------------------------------
def command_line(script: str, argv: list[str] | None) -> str:
    """The exact command that produced a report: ``python <script relative to the repo> ARGS``."""
    args = sys.argv[1:] if argv is None else list(argv)
    path = os.path.abspath(script)
    rel = os.path.relpath(path, ROOT)
    shown = path if rel.startswith("..") else rel

    def repo_relative(arg: str) -> str:  # paths inside the checkout, as a reader would type them
        if os.path.isabs(arg):
            r = os.path.relpath(arg, ROOT)
            if not r.startswith(".."):
                return r
        return arg

    return "python " + " ".join(shlex.quote(a) for a in [shown] + [repo_relative(a) for a in args])


def write_report(
    out: str | None,
    *,
    title: str,
    command: str,
    body: list[str],
    metrics: dict[str, Any] | None = None,
) -> str:
    """Print the markdown section and write it to ``out`` (and ``metrics`` to ``out``'s
    ``.json`` sibling); returns the markdown."""
    lines = [
        f"### {title}",
        "",
        f"Command: `{command}`",
        "",
        MACHINE_PREFIX + machine_line(),
        "",
        *body,
    ]
    text = "\n".join(lines).rstrip() + "\n"
    print(text)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        with open(json_path(out), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "title": title,
                    "command": command,
                    "machine": machine_info(),
                    "metrics": metrics or {},
                },
                f,
                indent=2,
                sort_keys=True,
            )
    return text


def report(out: str | None, script: str, argv: list[str] | None, **section: Any) -> int:
    """:func:`write_report` with the command line of ``script`` run with ``argv``; returns 0,
    a benchmark's exit status (``return common.report(args.out, __file__, argv, title=...,
    body=..., metrics=...)``)."""
    write_report(out, command=command_line(script, argv), **section)
    return 0


def json_path(md_path: str) -> str:
    """The ``.json`` sibling of a report's ``.md`` path."""
    base, _ = os.path.splitext(md_path)
    return base + ".json"


def fmt_params(n: int) -> str:
    """A parameter count for prose: ``134.5M`` or, below a million, ``31,296``."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def markdown_table(
    header: list[str], rows: list[list[Any]], *, align: str | None = None
) -> list[str]:
    """Markdown table lines; ``align`` is one character per column (``l`` or ``r``)."""
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    return [f"| {' | '.join(header)} |", f"|{'|'.join(sep)}|"] + [
        f"| {' | '.join(str(c) for c in r)} |" for r in rows
    ]

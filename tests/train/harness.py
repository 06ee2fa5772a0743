"""What the train tests that run whole jobs share: the tiny-model overrides of the shipped
configs, the rows and run arguments of the Python-API tests, and the multi-process harness
(``jaxrl-llm train`` as child processes: 2 localhost processes × 4 CPU devices over gloo, or 1
process × 8 devices) with a cache of 1-process reference runs.

A reference run is a function of its config (data contents included), not of where it writes
or how often it checkpoints, so the tests of one pytest worker that compare against the same
uninterrupted run share one (``reference_metrics``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import yaml

from jaxrl_llm.cli.main import main
from jaxrl_llm.train.run.logging import read_metrics
from tests.conftest import FAST_COMPILE_XLA_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(ROOT, "configs", "sft.yaml")
PPO = os.path.join(ROOT, "configs", "ppo.yaml")

# The shipped configs on a 1-layer tiny model with a char tokenizer, with no eval split and
# no TensorBoard or plot files ...
TINY_MODEL = [
    "model.source=tiny",
    "model.tokenizer=char",
    "model.tiny.num_layers=1",
    "logging.tensorboard=false",
    "logging.plots=false",
    "data.eval=null",
]
# ... nor a Hugging Face export of the checkpoints.
TINY = [*TINY_MODEL, "checkpoint.export_hf=false"]
# ... saving every 2 steps and keeping 3: the resume tests' runs.
CHECKPOINTED = [*TINY, "checkpoint.save_every=2", "checkpoint.keep=3"]

# Chat rows "ab>" (a, b < 4) whose answer is the larger digit: the Python-API tests' dataset.
CHAT_ROWS = [
    {"prompt": [{"role": "user", "content": f"{a}{b}>"}], "answer": str(max(a, b))}
    for a in range(4)
    for b in range(4)
]


def tiny_online_args(out, **over) -> dict:
    """A one-step GRPO-shaped run of the tiny model as ``jaxrl_llm.train`` arguments;
    ``over`` replaces whole sections."""
    return dict(
        dict(
            output_dir=str(out),
            max_steps=1,
            model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
            data=dict(max_length=32),
            rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=3),
            logging=dict(tensorboard=False, plots=False),
            eval=dict(before=False),
        ),
        **over,
    )


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``jaxrl-llm ARGV`` in this process: (exit status, stdout, stderr); argparse usage
    errors exit themselves."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# ----- jobs as child processes -----------------------------------------------------------------

# The session's persistent compilation cache (tests/conftest.py's jax_cache_dir), set by
# tests/train/conftest.py: the children share compiled programs (a job's two processes compile
# the same ones, and so do the runs a test compares).
CHILD_CACHE: list[str] = []
# Lines of a native abort, which no fault may end in.
NATIVE = ("Check failure", "*** ", "Terminating process", "Segmentation fault")


def one_error_line(err: str, command: str = "train", progress: tuple[str, ...] = ()) -> str:
    """The one error line of a failed ``jaxrl-llm`` command's stderr; before it only the run's
    progress lines (data counts, skipped checkpoints, the placement, each long phase's start
    and end, and those ``progress`` starts), and no traceback."""
    from tests.test_bad_inputs import PHASE_LINE

    assert "Traceback" not in err, err
    before = ("start: ", "data: ", "checkpoint ", "sampler: ", *progress)
    lines = [
        ln
        for ln in err.strip().splitlines()
        if not ln.startswith(before) and not PHASE_LINE.fullmatch(ln)
    ]
    assert len(lines) == 1 and lines[0].startswith(f"jaxrl-llm {command}: error: "), err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(devices: int, fault: str | None = None) -> dict:
    """The environment of a ``jaxrl-llm train`` child on ``devices`` CPU devices, with no job
    variables of ours leaking in; ``fault`` sets ``JAXRL_LLM_FAULT``."""
    env = dict(os.environ)
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXRL_LLM_FAULT"):
        env.pop(k, None)
    if CHILD_CACHE:
        env.update(
            JAX_COMPILATION_CACHE_DIR=CHILD_CACHE[0],
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
        )
    if fault:
        env["JAXRL_LLM_FAULT"] = fault
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_XLA_FLAGS}",
    )
    return env


def train(config: str, *args: str, devices: int = 8, fault: str | None = None) -> subprocess.Popen:
    """``jaxrl-llm train CONFIG ARGS`` as a child process (stdout and stderr together)."""
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jaxrl_llm.cli.main import main; sys.exit(main())",
    ]
    return subprocess.Popen(
        [*cmd, "train", config, *args],
        cwd=ROOT,
        env=child_env(devices, fault),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def job_args(address: str, pid: int, n: int = 2) -> list[str]:
    return ["--coordinator", address, "--num-processes", str(n), "--process-id", str(pid)]


def job(config: str, out: str, *extra: str, fault: str | None = None) -> list[subprocess.Popen]:
    """A 2-process job (4 CPU devices each, gloo on localhost) running ``config`` into ``out``;
    ``fault`` is given to both processes."""
    address = f"127.0.0.1:{free_port()}"
    return [
        train(config, f"output_dir={out}", *job_args(address, i), *extra, devices=4, fault=fault)
        for i in range(2)
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[str]:
    """Each process's output once it has exited; all are killed if one outlives ``timeout``."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    return logs


def wait(procs: list[subprocess.Popen], timeout: float = 600) -> list[str]:
    """``finish``, asserting that every process exited 0."""
    logs = finish(procs, timeout)
    assert [p.returncode for p in procs] == [0] * len(procs), "\n----\n".join(
        x[-2500:] for x in logs
    )
    return logs


def killed(procs: list[subprocess.Popen]) -> list[str]:
    """``finish``, asserting that every process was SIGKILLed (a ``JAXRL_LLM_FAULT`` kill)."""
    logs = finish(procs)
    assert {p.returncode for p in procs} == {-9}, [p.returncode for p in procs]
    return logs


def sigterm_process_1_after_step_2(procs: list[subprocess.Popen]) -> tuple[list[str], float]:
    """Reads process 0's output and sends SIGTERM to process 1 once process 0 has logged step
    2; returns both processes' output when they have exited and the time the signal went."""
    lines: list[str] = []
    sent: list[float] = []

    def read_process_0() -> None:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            lines.append(line)
            if not sent and "step 2/" in line:
                procs[1].send_signal(signal.SIGTERM)
                sent.append(time.monotonic())

    reader = threading.Thread(target=read_process_0, daemon=True)
    reader.start()
    log1 = finish([procs[1]])[0]
    procs[0].wait(timeout=120)
    reader.join(timeout=10)
    log0 = "".join(lines)
    assert sent, log0[-3000:]
    return [log0, log1], sent[0]


def online_config(
    d, algorithm: str = "grpo", *, chat: bool = False, max_steps: int = 2, **extra
) -> str:
    """A tiny online run over 40 "ab>" prompts (answer: the larger digit; 8 more for eval) on
    ``mesh.data=8``, 8 prompts × 8 samples a step (× 4 for online DPO), written to
    ``d/ALGORITHM.yaml``; ``chat`` makes it a 2-turn run against a scripted environment."""
    rng = random.Random(0)
    rows = []
    for _ in range(48):
        a, b = rng.sample(range(10), 2)
        prompt = [{"role": "user", "content": f"{a}{b}>"}] if chat else f"{a}{b}>"
        rows.append({"prompt": prompt, "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:40]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[40:]))
    cfg = dict(
        seed=0,
        max_steps=max_steps,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        rollout=dict(
            prompts_per_step=8, group_size=8 if algorithm != "online_dpo" else 4, max_new_tokens=3
        ),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        eval=dict(before=False, every=0),
        checkpoint=dict(save_every=0, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
        mesh=dict(data=8),
        **extra,
    )
    if chat:  # a multi-turn run: a scripted environment answers each turn
        cfg["rollout"]["max_new_tokens"] = 24
        cfg["env"] = dict(
            name="tests.envs.scripted:Scripted",
            kwargs=dict(replies=["ok"]),
            max_turns=2,
            max_turn_tokens=6,
        )
    path = d / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def edit_config(config: str, *, replace: tuple[str, ...] = (), **sections) -> str:
    """Updates top-level sections of a YAML config in place (a dict updates the section's
    keys; a section named in ``replace``, or not a dict, is replaced whole)."""
    with open(config) as f:
        cfg = yaml.safe_load(f)
    for key, value in sections.items():
        if key not in replace and isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    return config


def step_rows(run: str) -> dict[int, dict]:
    """A run's training rows (those with a loss) by step."""
    return {r["step"]: r for r in read_metrics(run) if r.get("loss") is not None}


_REFERENCES: dict[str, tuple[dict[int, dict], list[dict], str]] = {}


def _reference_key(config: str, args: tuple[str, ...]) -> str:
    """The config as a run sees it, less what does not change its metrics (where it writes,
    how often it checkpoints), with data files named by their contents."""
    with open(config) as f:
        cfg = yaml.safe_load(f)
    cfg.pop("checkpoint", None)
    cfg.pop("output_dir", None)
    for split in ("train", "eval"):
        path = (cfg.get("data") or {}).get(split)
        if path and os.path.isfile(path):
            with open(path, "rb") as f:
                cfg["data"][split] = hashlib.sha256(f.read()).hexdigest()
    return json.dumps([cfg, list(args)], sort_keys=True)


def reference_run(config: str, *args: str) -> tuple[dict[int, dict], list[dict], str]:
    """An uninterrupted run of ``config`` as 1 process × 8 devices, with no checkpoints:
    (training rows by step, every metrics row, its output). Run once per pytest worker for a
    config; later callers get the same (do not change what comes back)."""
    key = _reference_key(config, args)
    if key not in _REFERENCES:
        out = tempfile.mkdtemp(prefix="reference-", dir=os.path.dirname(config))
        (log,) = wait([train(config, f"output_dir={out}", "checkpoint.save_every=0", *args)])
        _REFERENCES[key] = (step_rows(out), read_metrics(out), log)
    return _REFERENCES[key]

"""``jaxrl-llm train CONFIG.yaml [dotted.key=value ...]``: run any algorithm from a YAML config.

The config is validated before anything compiles (unknown key, wrong type, impossible
combination, a mesh that does not fit the devices or the batch → one line naming the key).
``--resume`` (or ``resume=true``) continues from the latest checkpoint in ``output_dir`` with
the same data order; a fresh run refuses an ``output_dir`` that already holds checkpoints.
``--resume auto`` (or ``resume=auto``) resumes when ``output_dir`` holds a complete checkpoint
and starts fresh otherwise (the line it prints says which). Ctrl-C / SIGTERM save the last
finished step (:mod:`jaxrl_llm.train.run.signals`), print the command that resumes the run
(with the job's flags and ``--resume auto``) and exit 130 / 143.

A multi-process job (``--coordinator / --num-processes / --process-id``): start-up faults
(a bad address, a busy port, an unreachable coordinator, a job that does not fill up within
``--connect-timeout``) end in one line (:func:`jaxrl_llm.parallel.initialize_distributed`);
then every process checks that all run the same config and see the same ``output_dir``
(:mod:`jaxrl_llm.train.run.job`), and watches the others
(:mod:`jaxrl_llm.parallel.peers`: a lost process stops the rest within
``distributed.failure_timeout_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from jaxrl_llm.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm train``."""
    parser.add_argument("config", help="YAML config (see configs/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. max_steps=3 optim.lr=1e-5",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="true",
        default=None,
        metavar="auto",
        help="continue from the latest complete checkpoint in output_dir; `--resume auto` "
        "continues when output_dir holds one and starts fresh otherwise (the same command "
        "for a first start and a supervisor's relaunch)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="validate the config, print it resolved, and exit"
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="online configs: evaluate model.source on the held-out prompts (greedy, as the "
        "run's eval does), write output_dir/eval.json and exit without training (nothing "
        "else: no checkpoints/); any model, offline runs and no config: `jaxrl-llm eval`",
    )
    job = parser.add_argument_group(
        "multi-process job (one process per host; JAX detects Cloud TPU pod slices, SLURM "
        "and Open MPI jobs by itself)"
    )
    job.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    job.add_argument("--num-processes", type=int, metavar="N", help="processes in the job")
    job.add_argument("--process-id", type=int, metavar="I", help="this process, 0 .. N-1")
    job.add_argument(
        "--connect-timeout",
        type=float,
        metavar="S",
        help="seconds to wait for the coordinator and the whole job to join (default "
        "JAXRL_LLM_CONNECT_TIMEOUT_S or 120); then one line and exit status 2 (1 for a job "
        "that did not fill up)",
    )


def _run(args: argparse.Namespace) -> int:
    import yaml

    from jaxrl_llm.train.api import check_run, paths_beside, resolved_config, run_training
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.run.signals import RunStopped

    _split_resume(args)
    overrides = list(args.overrides) + ([f"resume={args.resume}"] if args.resume else [])
    cfg = load_config(RunConfig, args.config, overrides)  # reads YAML: no device is touched
    cfg = paths_beside(cfg, args.config, say=lambda line: print(line, file=sys.stderr))
    if join_job(args, cfg):  # before anything else touches JAX's devices
        from jaxrl_llm.train.run.job import check_job

        check_job(cfg)  # the same config, an output_dir every process sees
        _watch_peers(cfg)
    # `module:function` rewards, environments and tools beside the config or in the working
    # directory import without PYTHONPATH (appended: they never shadow an installed package)
    for folder in (os.path.dirname(os.path.abspath(args.config)), os.getcwd()):
        if folder not in sys.path:
            sys.path.append(folder)
    plan = check_run(cfg)  # before any model loads
    if args.dry_run:
        _probe_environment(cfg)  # the start-up check a real run makes
        print(yaml.safe_dump(resolved_config(cfg, plan), sort_keys=False))
        return 0
    if getattr(args, "eval_only", False):
        return _eval_only(cfg)
    try:
        summary = run_training(cfg)
    except RunStopped as e:
        name = "SIGTERM" if e.exit_status == 143 else "Ctrl-C (SIGINT)"
        print(f"jaxrl-llm train: stopped by {name}: {e.message}", file=sys.stderr)
        print(f"resume with: {resume_command(args)}", file=sys.stderr, flush=True)
        return e.exit_status
    _print_summary(cfg, summary)
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm train`` (the checks and the run are
    :mod:`jaxrl_llm.train.api`'s, as from Python)."""
    try:
        status = _run(args)
    except BaseException:
        _end_watch(done=False)  # this process stops on its own: the others see it leave
        raise
    # 130 / 143: a stop that every process of the job took at the same step (synced_stops)
    _end_watch(done=status in (0, 130, 143))
    return status


_PEERS: dict = {}  # the watch on the job's other processes (jaxrl_llm.parallel.peers)


def _end_watch(*, done: bool) -> None:
    watch = _PEERS.pop("watch", None)
    if watch is not None:
        watch.finish() if done else watch.leave()


def _watch_peers(cfg) -> None:
    """Start the watch on the job's other processes (:func:`jaxrl_llm.parallel.watch_peers`):
    a lost process stops this one with a line naming it and the last complete checkpoint."""
    from jaxrl_llm.parallel import watch_peers
    from jaxrl_llm.train.run.checkpoint_steps import last_checkpoint_words

    where = os.path.join(cfg.output_dir, "checkpoints")
    _PEERS["watch"] = watch_peers(lambda: last_checkpoint_words(where))


def _split_resume(args: argparse.Namespace) -> None:
    """``--resume`` takes ``auto`` or ``true`` as its value; a dotted override right after it
    (``--resume max_steps=6``) is an override, as before ``--resume`` took a value."""
    value = getattr(args, "resume", None)
    if value in (None, "true", "auto"):
        return
    if "=" in value:
        args.overrides = list(args.overrides) + [value]
        args.resume = "true"
        return
    raise ConfigError(f"--resume {value!r}: expected --resume or --resume auto")


def join_job(args: argparse.Namespace, cfg=None) -> bool:
    """Join a multi-process job: from ``--coordinator / --num-processes / --process-id`` (or
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``), or by JAX's own
    detection where a launcher announces several processes
    (:func:`jaxrl_llm.parallel.detected_cluster`). Returns whether the process joined one.
    Config sizes stay global: every process runs the same config.

    With ``cfg`` (the run's config), JAX's heartbeat timeout follows
    ``distributed.failure_timeout_s`` (+ 30 s)."""
    from jaxrl_llm.parallel import detected_cluster, initialize_distributed
    from jaxrl_llm.parallel.distributed import FAILURE_TIMEOUT_S

    joined = initialize_distributed(
        getattr(args, "coordinator", None),
        getattr(args, "num_processes", None),
        getattr(args, "process_id", None),
        auto_detect=detected_cluster() is not None,
        connect_timeout_s=getattr(args, "connect_timeout", None),
        failure_timeout_s=FAILURE_TIMEOUT_S if cfg is None else cfg.distributed.failure_timeout_s,
    )
    if joined:
        import jax

        print(
            f"jaxrl-llm train: process {jax.process_index()} of {jax.process_count()}, "
            f"{jax.local_device_count()} local / {jax.device_count()} devices",
            file=sys.stderr,
            flush=True,
        )
    return joined


def _probe_environment(cfg) -> None:
    """``--dry-run``: the environment checks of a real run (its class, keyword arguments and,
    with ``env.check``, one ``reset`` on the first training row and one ``step("")``;
    :func:`jaxrl_llm.train.online.episode_sampler.check_environment`), on the untokenised first row."""
    if not cfg.is_online or cfg.env is None:
        return
    from jaxrl_llm.data import Format
    from jaxrl_llm.data.pipeline import load_examples
    from jaxrl_llm.train.online.episode_sampler import check_environment

    examples, _ = load_examples(cfg.data.train, Format.PROMPT)
    if examples:
        check_environment(cfg.env, examples[0])


def resume_command(args: argparse.Namespace) -> str:
    """The shell command that resumes the run ``args`` started (its config and overrides, the
    job's flags, ``--resume auto``), quoted for a POSIX shell."""
    overrides = [o for o in args.overrides if not o.replace(" ", "").startswith("resume=")]
    job = []
    for flag, name in (
        ("--coordinator", "coordinator"),
        ("--num-processes", "num_processes"),
        ("--process-id", "process_id"),
        ("--connect-timeout", "connect_timeout"),
    ):
        value = getattr(args, name, None)
        if value is not None:
            job += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(["jaxrl-llm", "train", args.config, *overrides, *job, "--resume", "auto"])


def _eval_only(cfg) -> int:
    """``--eval-only``: the held-out metrics of ``model.source`` under the run's settings,
    written to ``output_dir/eval.json``; the ``checkpoints/`` folder the trainer's checkpointer
    makes is removed again when it was not there before (nothing was saved in it)."""
    if not cfg.is_online or cfg.data.eval is None:
        raise ConfigError(
            "--eval-only needs an online config with data.eval (held-out prompts to sample); "
            "for an offline run, or a model with no config: jaxrl-llm eval MODEL --data FILE "
            "--reward NAME (docs/evaluation.md)"
        )
    from jaxrl_llm.train.online.trainer import OnlineTrainer
    from jaxrl_llm.train.run import paths

    checkpoints = os.path.join(cfg.output_dir, "checkpoints")
    made_here = not paths.is_remote(cfg.output_dir) and not os.path.lexists(checkpoints)
    trainer = OnlineTrainer(cfg)
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.close()
        if made_here:
            _remove_unsaved_checkpoints(checkpoints)
    os.makedirs(cfg.output_dir, exist_ok=True)
    with open(os.path.join(cfg.output_dir, "eval.json"), "w", encoding="utf-8") as f:
        json.dump({"model": cfg.model.source, **metrics}, f, indent=2)
    for k, v in metrics.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    return 0


def _remove_unsaved_checkpoints(folder: str) -> None:
    """Remove ``folder`` (a ``checkpoints/`` made by a checkpointer that saved nothing) when it
    holds no file but the tokenizer copy the checkpointer writes when it is made."""
    import shutil

    tokenizer = os.path.join(folder, "tokenizer")
    for root, _, files in os.walk(folder):
        if files and not (root == tokenizer or root.startswith(tokenizer + os.sep)):
            return
    shutil.rmtree(folder, ignore_errors=True)


def _print_summary(cfg, summary: dict) -> None:
    for line in held_out_lines(_with_eval_before(cfg, summary)):
        print(line)
    if "train_time_s" in summary:
        print(f"{training_time(summary)}; run directory: {cfg.output_dir}")


def _with_eval_before(cfg, summary: dict) -> dict:
    """A resumed run's summary with the held-out metrics before training read back from the
    step-0 row of its ``metrics.jsonl`` (the first run's evaluation), when there is one."""
    if summary.get("eval_before") or not summary.get("eval_after"):
        return summary
    from jaxrl_llm.train.run.logging import read_metrics
    from jaxrl_llm.train.run.paths import log_dir

    try:
        rows = read_metrics(log_dir(cfg))
    except OSError:
        return summary
    before = {
        k: v
        for r in rows
        if r.get("step") == 0
        for k, v in r.items()
        if k in summary["eval_after"] and isinstance(v, (int, float))
    }
    return {**summary, "eval_before": before} if before else summary


def held_out_lines(summary: dict) -> list[str]:
    """``held-out <metric>: before -> after`` for each headline held-out metric of a run's
    summary; a resumed run, which does not evaluate before its first step, gets the value
    after (the one before is the step-0 row of ``metrics.jsonl``)."""
    before = summary.get("eval_before") or {}
    after = summary.get("eval_after") or {}
    n = after.get("eval/num_examples")
    lines = []
    for key in after:
        if (
            key.startswith("eval/")
            and key.count("/") == 1
            and not key.endswith(("num_examples", "num_tokens", "valid", "completion_length"))
            and (key in before or not before)
        ):
            start = f"{before[key]:.3f} -> " if key in before else ""
            lines.append(
                f"held-out {key[5:]}: {start}{after[key]:.3f}"
                + (f" ({n} examples, greedy)" if n is not None else "")
                + ("" if key in before else " (before training: metrics.jsonl, step 0)")
            )
    return lines


def training_time(summary: dict) -> str:
    """``training time: X min over N steps`` of a run's summary: the steps this command
    trained (a resumed run's after its ``start_step``, which is named)."""
    last, first = summary.get("steps"), int(summary.get("start_step") or 0)
    trained = last - first if isinstance(last, int) else last
    text = f"training time: {summary['train_time_s'] / 60:.1f} min over {trained} steps"
    if first and isinstance(last, int) and last > first:
        text += f" ({first + 1}-{last}, resumed from step {first})"
    elif first:
        text += f" (resumed from step {first})"
    return text

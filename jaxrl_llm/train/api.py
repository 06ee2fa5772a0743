"""Training from Python: the same code path as ``jaxrl-llm train``.

``jaxrl-llm train CONFIG key=value`` and these calls run the same checks
(:func:`check_run`) and the same run (:func:`run_training`)::

    import jaxrl_llm

    summary = jaxrl_llm.train("configs/grpo.yaml", max_steps=50, rollout={"group_size": 4})

    def correct(prompts, completions, answer, **kwargs):       # TRL's reward signature
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    trainer = jaxrl_llm.GRPOTrainer(
        model="smollm2-135m-instruct",
        reward_funcs=[correct],
        train_dataset=[{"prompt": [{"role": "user", "content": "2 + 3?"}], "answer": "5"}, ...],
        args={"output_dir": "runs/mine", "max_steps": 50},
    )
    summary = trainer.train()

A config is a YAML path, a dict or a :class:`~jaxrl_llm.train.config.run_config.RunConfig`;
keyword overrides are top-level keys, nested dicts merged into their section
(``rollout={"group_size": 4}``), or ``section__key=value``. Reward functions and environment
classes are Python objects: they are named in the run's config by ``module:qualname`` and
imported back the way a config's ``rewards: [{name: my_mod:fn}]`` is (a function defined in a
script or notebook, whose module is ``__main__``, works in that process). A reward that has no
importable name (a lambda, ``functools.partial``, a bound method) is held in this process as
``python:<label>``; a resume in a new process asks for it again, in one line. In-memory
datasets (a list of dicts, or a ``datasets.Dataset``) are written to
``output_dir/data/{train,eval}.jsonl`` once the run's checks pass, so a resume reads the same
rows (other rows for a run with checkpoints are refused). The formats are TRL's
(``docs/data.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.train.compile.memory_check import check_step_memory
from jaxrl_llm.train.config.config_io import from_dict, load_config, to_dict
from jaxrl_llm.train.config.plan import RunPlan, plan_run
from jaxrl_llm.train.config.preflight import (
    check_lengths,
    check_mesh,
    check_routing,
    check_tokenizer_sizes,
    check_trackers,
)
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.python_inputs import (
    check_arguments,
    importable_name,
    reward_func_name,
    rows_text,
    write_rows,
)
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.output_dir import (
    check_output_dir,
    checkpoint_steps,
    jax_main_process,
    made_output_dir,
)

#: Seeds are unsigned 32-bit (numpy's and JAX's PRNG keys take them).
MAX_SEED = 2**32 - 1


def check_run(cfg: RunConfig, *, rows_to_write: Iterable[str] = ()) -> RunPlan:
    """Everything checked before a model loads: the mesh and the batch (the plan), a tiny
    model's sizes, the lengths and routing against a model config known before it loads, the
    step's memory estimate, the trackers' packages, the seed, the data files, and that
    ``output_dir`` can hold this run.

    Args:
      cfg: the run's config.
      rows_to_write: data files that in-memory rows will be written to once these checks pass
        (:func:`build_config`); they need not exist yet.

    Raises:
      ConfigError: one line naming the key to change.
    """
    pending = set(rows_to_write)
    check_model_alias(cfg.model.source)
    plan = plan_run(cfg, check_mesh(cfg))
    check_tokenizer_sizes(cfg)
    check_lengths(cfg)
    check_routing(cfg)
    check_step_memory(cfg, plan)
    check_trackers(cfg)
    if not 0 <= cfg.seed <= MAX_SEED:
        raise ConfigError(f"seed: expected an integer in [0, {MAX_SEED}], got {cfg.seed}")
    for key in ("train", "eval"):
        src = getattr(cfg.data, key, None)
        if (
            isinstance(src, str)
            and src.endswith((".jsonl", ".parquet"))
            and not os.path.isfile(src)
            and src not in pending
        ):
            raise ConfigError(f"data.{key}: no such data file {src!r}")
    check_output_dir(cfg)
    return plan


def check_model_alias(source: Any) -> None:
    """A bare ``model.source`` name (no ``/``, no ``:``) must be ``tiny``, a model alias or
    an existing path: a mistyped alias is refused before anything loads, not at load time.

    Raises:
      ConfigError: one line with the closest alias.
    """
    if not isinstance(source, str) or source == "tiny" or "/" in source or ":" in source:
        return
    from jaxrl_llm.interop.aliases import MODEL_ALIASES

    if source in MODEL_ALIASES or os.path.exists(source):
        return
    raise ConfigError(
        f"model.source {source!r}: not a model alias{did_you_mean(source, MODEL_ALIASES)} nor "
        f"a file or directory here; known aliases: {sorted(MODEL_ALIASES)}"
    )


#: Sections only online algorithms read; ``train`` only offline ones.
ONLINE_SECTIONS = (
    "rollout",
    "rewards",
    "eval",
    "ppo",
    "process_reward",
    "env",
    "teacher",
    "distill",
)


def paths_beside(cfg: RunConfig, config_path: str, *, say: Callable[[str], Any] | None = None):
    """``cfg`` with a relative data file (``data.train``, ``data.eval``) or model directory
    (``model.source``) that does not exist from the current directory read from beside the
    config file instead: its folder, or the folder above it (the shipped ``configs/*.yaml``
    name ``data/...`` from the repository's root), where it exists there. So
    ``jaxrl-llm train /path/to/repo/configs/sft.yaml`` works from any directory. ``say`` gets
    one line per path moved. ``output_dir`` stays relative to the current directory.
    """
    folder = os.path.dirname(os.path.abspath(config_path))

    def beside(path: Any) -> str | None:
        if not isinstance(path, str) or not path or os.path.isabs(path) or os.path.exists(path):
            return None
        if ":" in path.split("/")[0]:  # hf:org/name, a module:function
            return None
        for root in (folder, os.path.dirname(folder)):
            candidate = os.path.join(root, path)
            if os.path.exists(candidate):
                return candidate
        return None

    data: dict[str, Any] = {}
    for key in ("train", "eval"):
        moved = beside(getattr(cfg.data, key))
        if moved is not None:
            data[key] = moved
    source = beside(cfg.model.source)
    for key, value in [*(("data." + k, v) for k, v in data.items()), ("model.source", source)]:
        if value is not None and say is not None:
            say(f"{key}: {value} (relative to the config file; not found from {os.getcwd()})")
    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data))
    if source is not None:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, source=source))
    return cfg


def check_loaded_step_memory(loop: Any) -> None:
    """The step-memory check of :func:`check_run` for a model whose config is known only once
    it has loaded (an alias, a hub id, a GGUF file, a PEFT adapter): after the trainer is
    built, before its first step compiles, with what the loaded weights and optimizer state
    already hold counted as available to them (:func:`~jaxrl_llm.train.config.preflight.
    check_step_memory`). A source known before loading was checked by :func:`check_run`.

    Raises:
      ConfigError: one line with the rows, the estimate and the memory free.
    """
    from jaxrl_llm.train.compile.aot_inputs import per_device_bytes
    from jaxrl_llm.train.config.preflight import known_model_config

    cfg = loop.cfg
    if known_model_config(cfg.model.source, cfg.model.tiny) is not None:
        return
    p = loop.policy
    resident = per_device_bytes(p.state) + (per_device_bytes(p.base) if p.base is not None else 0)
    check_step_memory(cfg, loop.plan, model_config=p.config, resident_bytes=resident)


def resolved_config(cfg: RunConfig, plan: RunPlan) -> dict:
    """The config as the run resolved it (the loss section with its defaults), a dict,
    without the sections this algorithm does not read (an SFT run's ``rollout``, a GRPO run's
    ``train`` and ``ppo``, ...): what ``--dry-run`` prints. ``config.yaml`` keeps them all."""
    out = to_dict(cfg)
    out["loss"] = to_dict(plan.loss_config)
    algo = cfg.algo
    unread = set() if cfg.is_online else set(ONLINE_SECTIONS)
    if cfg.is_online:
        unread.add("train")
        unread.update(k for k in ("process_reward", "env") if out.get(k) is None)
        if not algo.critic:
            unread.add("ppo")
        if not algo.teacher:
            unread.update(("teacher", "distill"))
    return {k: v for k, v in out.items() if k not in unread}


def run_training(cfg: RunConfig) -> dict:
    """Run a checked config (:func:`check_run`) to the end; returns its summary (also written
    to ``output_dir/summary.json``): the loop's (held-out metrics before / after, timings,
    ``steps``) and ``start_step``, the step a resumed run continued from (0 for a fresh one;
    ``train_time_s`` counts the steps after it).

    Raises:
      RunStopped: Ctrl-C or SIGTERM stopped the run (a checkpoint was saved where one was
        due; :mod:`jaxrl_llm.train.run.signals`).
    """
    import jax

    from jaxrl_llm.train.run.run_state import output_dir_lock
    from jaxrl_llm.train.run.signals import RunStopped, stop_signals, synced_stops

    check_output_dir(cfg)  # again: another run may have written checkpoints since the check
    if jax_main_process():  # the model loads and the first programs compile before any step
        print(start_line(cfg), file=sys.stderr, flush=True)
    lock = paths.lock_dir(cfg)  # output_dir when local; the local log directory for a bucket
    # the trainer writes config.yaml once it holds the lock and any resume succeeded
    with (
        made_output_dir(cfg.output_dir),
        made_output_dir(lock) if paths.is_remote(cfg.output_dir) else contextlib.nullcontext(),
        output_dir_lock(lock),
        stop_signals(),
        # across processes a stop during start-up (model load, compile) is held until every
        # process agrees on it before step 1 (RunLoop), so that all end the same way
        synced_stops(jax.process_count() > 1),
    ):
        if cfg.is_online:
            from jaxrl_llm.train.online.voting_eval import voting_online_trainer

            trainer = voting_online_trainer()(cfg)
        else:
            from jaxrl_llm.train.offline.trainer import OfflineTrainer

            trainer = OfflineTrainer(cfg)
        try:
            check_loaded_step_memory(trainer)
            summary = trainer.run()
        except RunStopped as e:  # the steps it finished are logged: plots and a summary too
            write_run_outputs(cfg, stopped_summary(e, trainer.start_step))
            raise
        finally:
            trainer.close()
        summary["start_step"] = trainer.start_step  # a resumed run trained the steps after it
    write_run_outputs(cfg, summary)
    return summary


def stopped_summary(stop: Any, start_step: int) -> dict:
    """The ``summary.json`` of a run a signal stopped (:class:`~jaxrl_llm.train.run.signals.
    RunStopped` ``stop``): how it stopped, its exit status and the step it started from."""
    return {"stopped": stop.message, "exit_status": stop.exit_status, "start_step": start_step}


def write_run_outputs(cfg: RunConfig, summary: dict) -> None:
    """Write a run's plots (``logging.plots``) and ``summary.json`` into its log directory,
    for a run that ended and for one a signal stopped alike. A run that logged no metrics
    (stopped before step 1) gets its summary and no plots."""
    log_dir = paths.log_dir(cfg)
    if cfg.logging.plots and os.path.isfile(os.path.join(log_dir, "metrics.jsonl")):
        from jaxrl_llm.train.run.plots import plot_run

        plot_run(log_dir)
    if os.path.isdir(log_dir):
        with open(os.path.join(log_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)


#: How :func:`start_line` begins (a progress line, as the trainers' ``data: ...``).
START_PREFIX = "start: "


def start_line(cfg: RunConfig) -> str:
    """The line a run prints before its model loads (the load and the first compiles take
    seconds to minutes with nothing else to show): what trains, on what, where to."""
    lora = f" (LoRA r={cfg.model.lora.rank})" if cfg.model.lora is not None else ""
    what = "resuming " if cfg.resume and checkpoint_steps(cfg.output_dir) else ""
    return (
        f"{START_PREFIX}{what}{cfg.algorithm} on {cfg.model.source}{lora}, {cfg.max_steps} "
        f"steps, into {cfg.output_dir}: loading the model, then compiling the first step"
    )


def train(
    config: str | Mapping[str, Any] | RunConfig,
    /,
    *,
    reward_funcs: Iterable[Callable | tuple[Callable, float]] = (),
    environment: type | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    **overrides: Any,
) -> dict:
    """Train ``config`` with ``overrides``; returns the run's summary (module docstring).

    Args:
      config: a YAML path, a dict or a ``RunConfig``.
      reward_funcs: Python reward functions (or ``(fn, weight)``), added to ``rewards``.
      environment: an environment class (``reset`` / ``step``), the run's ``env.name``.
      train_dataset, eval_dataset: rows in memory (a list of dicts or a ``datasets.Dataset``):
        ``data.train`` / ``data.eval``.
      **overrides: config keys (module docstring).

    Raises:
      ConfigError: the config, an override or a Python object cannot be used (one line).
    """
    cfg = build_config(
        config,
        reward_funcs=reward_funcs,
        environment=environment,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        **overrides,
    )
    check_run(cfg)
    return run_training(cfg)


def build_config(
    config: str | Mapping[str, Any] | RunConfig,
    /,
    *,
    reward_funcs: Iterable[Callable | tuple[Callable, float]] = (),
    environment: type | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    **overrides: Any,
) -> RunConfig:
    """The ``RunConfig`` :func:`train` runs (its arguments).

    In-memory datasets go to ``output_dir/data/{train,eval}.jsonl``, written only once the run's
    checks (:func:`check_run`) pass, and never over the saved rows of a run that holds
    checkpoints: a resume must read the rows it was trained on.

    Raises:
      ConfigError: an argument of the wrong type, the config, or rows that differ from a
        resumed run's (one line each).
    """
    check_arguments(
        config=config,
        reward_funcs=reward_funcs,
        environment=environment,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    if isinstance(config, RunConfig):
        base = to_dict(config)
    elif isinstance(config, Mapping):
        base = dict(config)
    else:
        path = os.fspath(config)
        base = to_dict(paths_beside(load_config(RunConfig, path, []), path))
    merged = _merge(base, _nested(overrides))
    rewards = list(merged.get("rewards") or [])
    if callable(reward_funcs):  # TRL takes one function as well as a list
        reward_funcs = [reward_funcs]
    for item in reward_funcs:
        fn, weight = item if isinstance(item, tuple) else (item, 1.0)
        name = reward_func_name(fn, [str(r.get("name", "")) for r in rewards])
        rewards.append({"name": name, "weight": float(weight)})
    if rewards:
        merged["rewards"] = rewards
    if environment is not None:
        env = dict(merged.get("env") or {})
        env["name"] = importable_name(environment, "environment")
        merged["env"] = env
    out = merged.get("output_dir")
    texts: dict[str, str] = {}
    for key, rows in (("train", train_dataset), ("eval", eval_dataset)):
        if rows is None:
            continue
        if not out:
            raise ConfigError(f"{key}_dataset: an output_dir is required to hold the rows")
        data = dict(merged.get("data") or {})
        data[key] = os.path.join(str(out), "data", f"{key}.jsonl")
        texts[data[key]] = rows_text(rows, f"{key}_dataset")
        merged["data"] = data
    cfg = from_dict(RunConfig, merged)
    for path, text in texts.items():  # before anything is written: errors name the user's row
        check_rows(text, f"{os.path.basename(path).split('.')[0]}_dataset", cfg.algo.data_format)
    if texts:
        check_run(cfg, rows_to_write=texts)
        for path, text in texts.items():
            write_rows(text, path, cfg)
    return cfg


def check_rows(text: str, what: str, fmt: str) -> None:
    """Parse in-memory rows (their JSONL ``text``) as data format ``fmt``, each named as the
    caller knows it: ``train_dataset[3]`` (0-based, the list's or ``datasets.Dataset``'s index).

    Raises:
      DataError: one line naming the row and the field (with a rename for a common dataset's
        columns).
    """
    from jaxrl_llm.data import Record, parse_example

    for i, line in enumerate(text.splitlines()):
        parse_example(Record(json.loads(line), f"{what}[{i}]"), fmt)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees (levanter's ``StepInfo`` shape: one record, the hook reads what it
    needs).

    Attributes:
      step: the step just finished (0 for an evaluation before the first).
      max_steps: the run's last step.
      metrics: the step's metrics as the trainer returned them (before the loop adds its
        evaluation and timing entries).
      trainer: the :class:`~jaxrl_llm.train.trainers.Trainer` (``.model``, ``.save_model``,
        ``.config``).
    """

    step: int
    max_steps: int
    metrics: Mapping[str, Any]
    trainer: Any


class Callback:
    """Hooks at a cadence, by TRL's names (``TrainerCallback``); override the ones you need.

    Attributes:
      every: ``on_step_end`` runs every ``every`` steps (levanter's ``add_hook(every=...)``).
    """

    every: int = 1

    def on_step_end(self, info: StepInfo) -> None:
        """After a training step whose number is a multiple of :attr:`every`."""

    def on_evaluate(self, info: StepInfo, metrics: Mapping[str, float]) -> None:
        """After each evaluation (before training, every ``eval.every`` steps, at the end,
        :meth:`~jaxrl_llm.train.trainers.Trainer.evaluate`) with its ``eval/...`` metrics."""

    def on_save(self, info: StepInfo, path: str) -> None:
        """After a checkpoint of ``info.step`` is written (``path``: its directory)."""


def _nested(overrides: Mapping[str, Any]) -> dict:
    """``section__key=value`` keyword overrides as nested dicts."""
    out: dict = {}
    for key, value in overrides.items():
        parts = key.split("__")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _merge(base: dict, over: Mapping[str, Any]) -> dict:
    """``over`` merged into ``base``: dicts key by key (a section's other keys kept)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out

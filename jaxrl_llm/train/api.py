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
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import from_dict, load_config, to_dict
from jaxrl_llm.train.config.plan import RunPlan, plan_run
from jaxrl_llm.train.config.preflight import (
    check_lengths,
    check_mesh,
    check_routing,
    check_step_memory,
    check_tokenizer_sizes,
    check_trackers,
)
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.run import paths

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
    _check_output_dir(cfg)
    return plan


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
    from jaxrl_llm.train.run.run_state import output_dir_lock
    from jaxrl_llm.train.run.signals import stop_signals

    _check_output_dir(cfg)  # again: another run may have written checkpoints since the check
    if jax_main_process():  # the model loads and the first programs compile before any step
        print(start_line(cfg), file=sys.stderr, flush=True)
    lock = paths.lock_dir(cfg)  # output_dir when local; the local log directory for a bucket
    # the trainer writes config.yaml once it holds the lock and any resume succeeded
    with (
        made_output_dir(cfg.output_dir),
        made_output_dir(lock) if paths.is_remote(cfg.output_dir) else contextlib.nullcontext(),
        output_dir_lock(lock),
        stop_signals(),
    ):
        if cfg.is_online:
            trainer = voting_online_trainer()(cfg)
        else:
            from jaxrl_llm.train.offline.trainer import OfflineTrainer

            trainer = OfflineTrainer(cfg)
        try:
            check_loaded_step_memory(trainer)
            summary = trainer.run()
        finally:
            trainer.close()
        summary["start_step"] = trainer.start_step  # a resumed run trained the steps after it
    if cfg.logging.plots:
        from jaxrl_llm.train.run.plots import plot_run

        plot_run(paths.log_dir(cfg))
    with open(os.path.join(paths.log_dir(cfg), "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    return summary


#: How :func:`start_line` begins (a progress line, as the trainers' ``data: ...``).
START_PREFIX = "start: "


def start_line(cfg: RunConfig) -> str:
    """The line a run prints before its model loads (the load and the first compiles take
    seconds to minutes with nothing else to show): what trains, on what, where to."""
    lora = f" (LoRA r={cfg.model.lora.rank})" if cfg.model.lora is not None else ""
    what = "resuming " if cfg.resume and _checkpoint_steps(cfg.output_dir) else ""
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
    _check_arguments(
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
        texts[data[key]] = _rows_text(rows, f"{key}_dataset")
        merged["data"] = data
    cfg = from_dict(RunConfig, merged)
    if texts:
        check_run(cfg, rows_to_write=texts)
        for path, text in texts.items():
            _write_rows(text, path, cfg)
    return cfg


def importable_name(obj: Any, what: str) -> str:
    """``module:qualname`` of a function or class that imports back as itself.

    Raises:
      ConfigError: a lambda, a nested function or an object its module does not hold.
    """
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not callable(obj) or module is None or "<" in qualname:
        raise ConfigError(
            f"{what}: {obj!r} has no importable name (a lambda or a nested function); define "
            f"it at the top level of a module, a script or a notebook"
        )
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise ConfigError(f"{what}: {module}:{qualname} does not import back as {obj!r}")
    return f"{module}:{qualname}"


def reward_func_name(fn: Callable, taken: list[str]) -> str:
    """The config name of a reward function given in Python: ``module:qualname`` when it
    imports back as itself (a resume in a new process imports it), else ``python:<label>``,
    held in this process (a lambda, ``functools.partial``, a bound method: a resume in a new
    process asks for it again; :func:`~jaxrl_llm.rewards.registry.hold_callable`)."""
    from jaxrl_llm.rewards.registry import hold_callable

    if not callable(fn):
        raise ConfigError(f"reward_funcs: {fn!r} is not callable")
    try:
        return importable_name(fn, "reward_funcs")
    except ConfigError:
        return hold_callable(fn, taken=taken)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees (levanter's ``StepInfo`` shape: one record, the hook reads what it
    needs).

    Attributes:
      step: the step just finished (0 for an evaluation before the first).
      max_steps: the run's last step.
      metrics: the step's metrics as the trainer returned them (before the loop adds its
        evaluation and timing entries).
      trainer: the :class:`Trainer` (``.model``, ``.save_model``, ``.config``).
    """

    step: int
    max_steps: int
    metrics: Mapping[str, Any]
    trainer: Trainer


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
        :meth:`Trainer.evaluate`) with its ``eval/...`` metrics."""

    def on_save(self, info: StepInfo, path: str) -> None:
        """After a checkpoint of ``info.step`` is written (``path``: its directory)."""


class _Hook(Callback):
    """A function ``fn(StepInfo)`` run after every ``every`` steps (:meth:`Trainer.add_hook`)."""

    def __init__(self, fn: Callable[[StepInfo], Any], every: int):
        if every < 1:
            raise ConfigError(f"add_hook: every must be >= 1, got {every}")
        self.fn, self.every = fn, every

    def on_step_end(self, info: StepInfo) -> None:
        """Run the function."""
        self.fn(info)


class Trainer:
    """A run from Python in TRL's shape: ``Trainer(model=..., reward_funcs=[...],
    train_dataset=..., args=...).train()``; the algorithm is the class's (``GRPOTrainer``,
    ``DPOTrainer``, ...) or ``algorithm=``.

    Besides :meth:`train`: :meth:`evaluate`, :meth:`save_model` (a Hugging Face directory),
    :attr:`model` (the parameters) and callbacks (:class:`Callback`, :meth:`add_hook`). The
    model loads (and the programs compile) on first use of any of them.

    Args:
      model: ``model.source`` (an alias, HF directory, GGUF file, hub id, PEFT adapter, run
        directory), or a dict for the ``model`` section.
      reward_funcs: Python reward functions (or ``(fn, weight)``), any callable: a function
        imports back on a resume; a lambda, ``functools.partial`` or bound method is held in
        this process (a resume in a new process asks for it again).
      environment, train_dataset, eval_dataset: as :func:`train` takes them.
      args: the rest of the config: a typed config with TRL's names
        (:class:`~jaxrl_llm.train.trl_config.GRPOConfig`, ...), a dict, a YAML path or a
        ``RunConfig``; ``output_dir`` and ``max_steps`` are required.
      callbacks: :class:`Callback` objects.
      **overrides: config keys, as :func:`train` takes them.
    """

    algorithm: str | None = None

    def __init__(
        self,
        model: str | Mapping[str, Any] | None = None,
        *,
        reward_funcs: Iterable[Callable | tuple[Callable, float]] = (),
        environment: type | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        args: Any = None,
        algorithm: str | None = None,
        callbacks: Iterable[Callback] = (),
        **overrides: Any,
    ):
        from jaxrl_llm.train.trl_config import TrainingConfig

        model, base = _trainer_arguments(type(self).__name__, model, args, algorithm)
        if isinstance(base, TrainingConfig):
            wanted = algorithm or self.algorithm
            if wanted and base.algorithm != wanted:
                raise ConfigError(
                    f"args: a {type(base).__name__} is for {base.algorithm}, this trainer runs "
                    f"{wanted}"
                )
            base = base.to_dict()
        if not isinstance(base, (str, RunConfig)):
            base = dict(base)
            base.setdefault("algorithm", algorithm or self.algorithm)
        if model is not None:
            overrides["model"] = {"source": model} if isinstance(model, str) else model
        self.config = build_config(
            base,
            reward_funcs=reward_funcs,
            environment=environment,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            **overrides,
        )
        self.plan = check_run(self.config)
        self.callbacks: list[Callback] = list(callbacks)
        self._loop: Any = None
        self.step = 0  # the last step trained

    def add_callback(self, callback: Callback) -> None:
        """Add a :class:`Callback` (TRL's name)."""
        self.callbacks.append(callback)

    def add_hook(self, fn: Callable[[StepInfo], Any], *, every: int = 1) -> None:
        """Run ``fn(StepInfo)`` after every ``every`` steps (levanter's ``add_hook``)."""
        self.callbacks.append(_Hook(fn, every))

    @property
    def loop(self) -> Any:
        """The run loop (:class:`~jaxrl_llm.train.online.trainer.OnlineTrainer` or the
        offline one), built on first use: the model loads and the programs compile."""
        if self._loop is None:
            if jax_main_process():
                print(start_line(self.config), file=sys.stderr, flush=True)
            with made_output_dir(self.config.output_dir):
                loop = _hooked_loop(self.config.is_online)(self.config, owner=self)
                try:
                    check_loaded_step_memory(loop)
                except BaseException:
                    loop.close()
                    raise
                self._loop = loop
        return self._loop

    @property
    def model(self) -> Any:
        """The policy's parameters (a pytree of arrays; LoRA adapters merged into the base)."""
        return self.loop.policy.full_params()

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer."""
        return self.loop.policy.tokenizer

    _started = False  # train() was called
    _finished = False  # ... and ran to the end

    def train(self) -> dict:
        """Run to the end; the summary (held-out metrics before / after, timings), also
        written to ``output_dir/summary.json``. Called again after a stop (Ctrl-C, an error),
        it continues the run as ``--resume`` does; after a run that ended, it is refused (one
        line)."""
        if self._finished:
            raise ConfigError(
                f"{type(self).__name__}.train(): this trainer's run already ended "
                f"(max_steps={self.config.max_steps} in {self.config.output_dir!r}); to train "
                f"further, build a new trainer with args resume=True and a larger max_steps"
            )
        if self._started:  # the first call stopped: a fresh loop resumes its newest checkpoint
            self.config = dataclasses.replace(self.config, resume=True)
            self._loop = None
        self._started = True
        _check_output_dir(self.config)  # again: another run may have written checkpoints since
        loop = self.loop
        try:
            summary = loop.run()
        finally:
            loop.close()
        summary["start_step"] = loop.start_step
        if self.config.logging.plots:
            from jaxrl_llm.train.run.plots import plot_run

            plot_run(paths.log_dir(self.config))
        summary_path = os.path.join(paths.log_dir(self.config), "summary.json")
        with open(summary_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
        self._finished = True
        return summary

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics now (``eval/...``; empty without ``eval_dataset`` / ``data.eval``);
        online runs add ``eval/maj@k`` and ``eval/samples-<step>.jsonl`` as ``eval`` asks."""
        return self.loop.evaluate()

    def save_model(self, output_dir: str | None = None) -> str:
        """Write the policy (LoRA adapters merged) as a Hugging Face directory, default
        ``output_dir/hf`` (``hf/`` of the local log directory when ``output_dir`` is a URI,
        :func:`~jaxrl_llm.train.run.paths.log_dir`); returns its path."""
        import jax

        from jaxrl_llm.interop import export_hf
        from jaxrl_llm.parallel import to_host

        policy = self.loop.policy
        run = self.config.output_dir
        out = output_dir or os.path.join(
            paths.log_dir(self.config) if paths.is_remote(run) else run, "hf"
        )
        params = jax.device_get(to_host(policy.full_params()))
        tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
        export_hf(out, config=policy.config, params=params, tokenizer=tok)
        return out

    # ----- what the run loop reports (the hooked loop calls these) ------------------------
    def _info(self, metrics: Mapping[str, Any]) -> StepInfo:
        return StepInfo(self.step, self.config.max_steps, dict(metrics), self)

    def _step_ended(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.step = step
        info = self._info(metrics)
        for cb in self.callbacks:
            if step % max(int(getattr(cb, "every", 1)), 1) == 0:
                cb.on_step_end(info)

    def _evaluated(self, metrics: Mapping[str, float]) -> None:
        info = self._info({})
        for cb in self.callbacks:
            cb.on_evaluate(info, metrics)

    def _saved(self, step: int) -> None:
        path = paths.join(paths.resolve(self.config.output_dir), "checkpoints", str(step))
        info = dataclasses.replace(self._info({}), step=step)
        for cb in self.callbacks:
            cb.on_save(info, path)


_HOOKED: dict[bool, type] = {}


def _hooked_loop(online: bool) -> type:
    """The online or offline run loop with :class:`Trainer`'s reports around its step,
    evaluation and save (a subclass, made on first use so that importing this module loads
    no JAX program)."""
    if online in _HOOKED:
        return _HOOKED[online]
    from jaxrl_llm.train.offline.trainer import OfflineTrainer

    Base: type = voting_online_trainer() if online else OfflineTrainer

    class Hooked(Base):  # type: ignore[valid-type,misc]
        def __init__(self, cfg: RunConfig, *, owner: Trainer):
            self.owner = owner
            self.saved: set[int] = set()
            super().__init__(cfg)

        def train_step(self, step: int) -> dict:
            metrics = super().train_step(step)
            self.owner._step_ended(step, metrics)
            return metrics

        def evaluate(self) -> dict[str, float]:
            metrics = super().evaluate()
            self.owner._evaluated(metrics)
            return metrics

        def save(self, step: int, *, force: bool = False, data: dict | None = None) -> None:
            super().save(step, force=force, data=data)
            if step not in self.saved:
                self.saved.add(step)
                if self.owner.callbacks:  # the write is asynchronous: on_save sees it done
                    self.ckpt.wait_until_finished()
                    self.owner._saved(step)

    Hooked.__name__ = Hooked.__qualname__ = f"Hooked{Base.__name__}"
    _HOOKED[online] = Hooked
    return Hooked


def vote_eval(
    rollouts: Any, items: list, settings: Any, metric: str, *, step: int, folder: str
) -> dict[str, float]:
    """``eval/maj@k`` (``settings.maj_at``) and, with ``settings.write_samples``,
    ``folder/samples-<step>.jsonl``: ``settings.num_samples`` sampled completions per held-out
    prompt, drawn with the seeds of ``eval/pass@k`` (the same completions; the online
    rollouts' ``evaluate``) and scored by reward ``metric``.

    Args:
      rollouts: the run's :class:`~jaxrl_llm.train.online.rollout.Rollouts`.
      items: the held-out prompts (tokenised); the first ``settings.num_examples`` are used.
      settings: the ``eval`` section (:class:`~jaxrl_llm.train.config.sections.EvalSection`).
      metric: the reward whose score 1 is correct.
      step: the step evaluated (the samples file's name).
      folder: where the samples file goes (JAX's process 0 writes it).
    """
    import numpy as np

    from jaxrl_llm.rewards.voting import extract_votes, maj_at_k, sample_records

    if not (settings.maj_at or settings.write_samples) or not settings.num_samples:
        return {}
    items = items[: settings.num_examples or None]
    n = settings.num_samples
    answers: list[list] = []
    correct: list[list[bool]] = []
    records: list[dict] = []
    for i in range(0, len(items), settings.batch_size):
        exp = rollouts.sample(items[i : i + settings.batch_size], seed=7_777_777 + i, num_samples=n)
        if exp is None:  # across processes: this process's share of the batch is empty
            continue
        scores = np.asarray(exp.scores[metric], np.float64)
        votes = extract_votes(exp.texts)
        for g in range(0, len(exp.texts), n):
            answers.append(votes[g : g + n])
            correct.append([bool(x == 1.0) for x in scores[g : g + n]])
        if settings.write_samples:
            prompts = exp.sources if exp.sources is not None else exp.prompts
            refs = [e.get("answer") for e in exp.extras]
            records += sample_records(
                list(prompts),
                list(exp.texts),
                scores.tolist(),
                group_size=n,
                step=step,
                references=refs if any(r is not None for r in refs) else None,
            )
    if settings.write_samples and jax_main_process():
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"samples-{step}.jsonl"), "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    # across processes each scored its share of the prompts (process 0's are in the file)
    from jaxrl_llm.parallel import gather_numbers

    mine = [
        maj_at_k(answers, correct, k) * len(answers) if answers else 0.0 for k in settings.maj_at
    ]
    sums = gather_numbers(np.array([len(answers), *mine], np.float64)).sum(0)
    return {f"eval/maj@{k}": float(v / max(sums[0], 1)) for k, v in zip(settings.maj_at, sums[1:])}


_VOTING: list[type] = []


def voting_online_trainer() -> type:
    """The online run loop whose evaluations add ``eval/maj@k`` and the samples file
    (:func:`vote_eval`, as the run's ``eval`` section asks) after the greedy metrics and
    ``eval/pass@k``; both ``jaxrl-llm train`` (:func:`run_training`) and the Python trainers
    run it. A subclass made on first use, so that importing this module loads no JAX
    program."""
    if _VOTING:
        return _VOTING[0]
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    class VotingOnlineTrainer(OnlineTrainer):
        """:class:`~jaxrl_llm.train.online.trainer.OnlineTrainer` with ``eval.maj_at`` and
        ``eval.write_samples``."""

        _last_step: int | None = None

        def train_step(self, step: int) -> dict:
            metrics = super().train_step(step)
            self._last_step = step
            return metrics

        def evaluate(self) -> dict[str, float]:
            metrics = super().evaluate()
            if metrics and self.eval_data is not None:
                step = self.start_step if self._last_step is None else self._last_step
                metrics.update(
                    vote_eval(
                        self.rollouts,
                        self.eval_data.items,
                        self.cfg.eval,
                        self.eval_metric,
                        step=step,
                        folder=os.path.join(paths.log_dir(self.cfg), "eval"),
                    )
                )
            return metrics

    _VOTING.append(VotingOnlineTrainer)
    return VotingOnlineTrainer


def jax_main_process() -> bool:
    """Whether this is JAX's process 0 (the one that writes files)."""
    import jax

    return jax.process_index() == 0


class GRPOTrainer(Trainer):
    """GRPO from Python (:class:`Trainer`; ``algorithm: grpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.GRPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "grpo"


class PPOTrainer(Trainer):
    """PPO with its critic from Python (:class:`Trainer`; ``algorithm: ppo``)."""

    algorithm = "ppo"


class RLOOTrainer(Trainer):
    """RLOO from Python (:class:`Trainer`; ``algorithm: rloo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.RLOOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "rloo"


class OnlineDPOTrainer(Trainer):
    """Online DPO from Python (:class:`Trainer`; ``algorithm: online_dpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.OnlineDPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "online_dpo"


class SFTTrainer(Trainer):
    """Supervised fine-tuning from Python (:class:`Trainer`; ``algorithm: sft``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.SFTConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "sft"


class DPOTrainer(Trainer):
    """DPO from Python (:class:`Trainer`; ``algorithm: dpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.DPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "dpo"


class KTOTrainer(Trainer):
    """KTO from Python (:class:`Trainer`; ``algorithm: kto``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.KTOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "kto"


class ORPOTrainer(Trainer):
    """ORPO from Python (:class:`Trainer`; ``algorithm: orpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.ORPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "orpo"


class RewardTrainer(Trainer):
    """A reward model (scalar head, preference pairs) from Python (:class:`Trainer`; ``algorithm: reward_model``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.RewardConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "reward_model"


# ----- helpers ----------------------------------------------------------------------------------


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


def _rows_text(rows: Any, what: str) -> str:
    """In-memory rows (a list of dicts or a ``datasets.Dataset``) as JSONL text."""
    if hasattr(rows, "to_list"):  # a datasets.Dataset
        rows = rows.to_list()
    _check_rows_type(rows, what)
    rows = list(rows)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError(f"{what}: expected a non-empty list of dicts (or a datasets.Dataset)")
    try:
        return "\n".join(json.dumps(dict(r), ensure_ascii=False) for r in rows) + "\n"
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what}: a row cannot be written as JSON ({e})") from None


def _check_rows_type(rows: Any, what: str) -> None:
    """Rows must be a list (an iterable) of dicts or a ``datasets.Dataset``."""
    if hasattr(rows, "to_list"):
        return
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise ConfigError(
            f"{what}: expected a non-empty list of dicts (or a datasets.Dataset), got "
            f"{type(rows).__name__}"
            + ("; a data file is named by data={'train': PATH}" if isinstance(rows, str) else "")
        )


def _write_rows(text: str, path: str, cfg: RunConfig) -> None:
    """Write rows' JSONL ``text`` at ``path`` (atomically). The saved rows of a run with
    checkpoints (a resume, the checks have passed) are kept: the same rows are not rewritten,
    other rows are refused."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            same = f.read() == text
        if same:
            return
        steps = _checkpoint_steps(cfg.output_dir)
        if steps:
            raise ConfigError(
                f"{os.path.basename(path).split('.')[0]}_dataset: these rows differ from the "
                f"rows saved in {path}, which the run in {cfg.output_dir!r} trained on "
                f"(checkpoint step {steps[-1]}); pass the same rows to resume it, or choose a "
                f"new output_dir"
            )
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"{path}: the rows cannot be written ({e.strerror or e})") from None


def _check_arguments(
    *, config: Any, reward_funcs: Any, environment: Any, train_dataset: Any, eval_dataset: Any
) -> None:
    """One line for an argument of the wrong type (before anything reads it)."""
    if not isinstance(config, (str, os.PathLike, Mapping, RunConfig)):
        raise ConfigError(
            f"config: expected a YAML path, a dict or a RunConfig, got {type(config).__name__}"
        )
    funcs = [reward_funcs] if callable(reward_funcs) else reward_funcs
    if isinstance(funcs, (str, bytes, Mapping)) or not isinstance(funcs, Iterable):
        raise ConfigError(
            f"reward_funcs: expected a list of functions or (function, weight) pairs, got "
            f"{type(reward_funcs).__name__}"
        )
    for i, item in enumerate(funcs):
        fn, weight = item if isinstance(item, tuple) and len(item) == 2 else (item, 1.0)
        if not callable(fn) or isinstance(fn, type):
            raise ConfigError(
                f"reward_funcs[{i}]: expected a function or a (function, weight) pair, got {item!r}"
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError(f"reward_funcs[{i}]: the weight must be a number, got {weight!r}")
        if weight != weight or abs(weight) == float("inf"):
            raise ConfigError(f"reward_funcs[{i}]: the weight must be finite, got {weight!r}")
    if environment is not None and not isinstance(environment, type):
        raise ConfigError(
            f"environment: expected a class (with reset and step), got {type(environment).__name__}"
        )
    for name, rows in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if rows is not None:
            _check_rows_type(rows, name)


def _trainer_arguments(
    name: str, model: Any, args: Any, algorithm: Any
) -> tuple[str | dict | None, Any]:
    """A trainer class's ``model`` and ``args`` checked (one line each) and made plain:
    ``(model, base config)``."""
    if model is not None and not isinstance(model, (str, os.PathLike, Mapping)):
        raise ConfigError(
            f"{name}: model: expected a model source (an alias, a path, a hub id) or a dict for "
            f"the model section, got {type(model).__name__}"
        )
    from jaxrl_llm.train.trl_config import TrainingConfig

    if args is not None and not isinstance(
        args, (str, os.PathLike, Mapping, RunConfig, TrainingConfig)
    ):
        raise ConfigError(
            f"{name}: args: expected a dict, a YAML path, a RunConfig or a TrainingConfig, got "
            f"{type(args).__name__}"
        )
    if algorithm is not None and not isinstance(algorithm, str):
        raise ConfigError(f"{name}: algorithm: expected a string, got {type(algorithm).__name__}")
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    base = os.fspath(args) if isinstance(args, os.PathLike) else args
    return (dict(model) if isinstance(model, Mapping) else model), ({} if base is None else base)


def _checkpoint_steps(out: str) -> list[int]:
    """The complete steps under ``out/checkpoints``, ascending (``out`` may be a URI).

    Raises:
      ConfigError: a URI that cannot be listed: its filesystem package is missing (``gcsfs``
        for ``gs://``), or the store refused (credentials, a missing bucket), in one line.
    """
    from jaxrl_llm.train.run.checkpoint import complete_steps

    where = paths.join(paths.resolve(out), "checkpoints")
    if not paths.is_remote(out):
        return complete_steps(where)
    try:
        return complete_steps(where)
    except ImportError as e:
        raise ConfigError(
            f"output_dir {out!r}: {e} (epath opens this URI through fsspec and that package; "
            f"orbax writes the arrays through TensorStore's own driver)"
        ) from None
    except Exception as e:  # a store's own errors: credentials, a missing bucket, the network
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"output_dir {out!r} cannot be listed ({type(e).__name__}: {first}); check the "
            f"bucket and its credentials"
        ) from None


def _make_output_dir(out: str) -> None:
    """Create and probe a new ``output_dir`` (an existing one, a resume, is left as it is). A
    URI (``gs://...``) is left to orbax, which creates it at the first save and reports what
    it cannot write: probing a bucket here would need its credentials before the model loads."""
    if paths.is_remote(out):
        return
    try:
        if not os.path.isdir(out):
            os.makedirs(out, exist_ok=True)  # the processes of a job create it together
            probe = os.path.join(out, f".write_test.{os.getpid()}")
            with open(probe, "w", encoding="utf-8") as f:
                f.write("ok")
            os.remove(probe)
        elif not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    except OSError as e:
        raise ConfigError(
            f"output_dir {out!r} cannot be written ({e.strerror or e}); choose another output_dir"
        ) from None


@contextlib.contextmanager
def made_output_dir(out: str):
    """Create and probe ``output_dir`` (:func:`_make_output_dir`) around a run's start; when
    the run is refused or fails with nothing written (a bad reward, model or data found while
    the trainer is built), a directory this call created is removed again, so a refused
    config leaves no empty run directory with a ``.lock`` behind. Anything written (a
    ``metrics.jsonl``, a checkpoint, the rows of a Python dataset) keeps it."""
    fresh = not paths.is_remote(out) and not os.path.lexists(out)
    _make_output_dir(out)
    try:
        yield
    except BaseException:
        if fresh:
            _remove_if_unused(out)
        raise


def _remove_if_unused(out: str) -> None:
    """Remove ``out`` when it holds nothing of a run: only its ``.lock``, empty folders and
    the tokenizer copy a checkpointer writes when it is made (``checkpoints/tokenizer/``)."""
    import shutil

    tokenizer = os.path.join(out, "checkpoints", "tokenizer")
    for root, _, files in os.walk(out):
        if root == tokenizer or root.startswith(tokenizer + os.sep):
            continue
        if any(f != ".lock" or root != out for f in files):
            return
    shutil.rmtree(out, ignore_errors=True)


def _check_output_dir(cfg: RunConfig) -> None:
    """``output_dir`` must be a directory (or not exist yet) this process can write; a fresh
    run (no ``resume``) must not start over another run's checkpoints. On a URI
    (``gs://...``) only the latter is checked, through its filesystem package (the local
    checks, a file in the way, a link, write permission, have no meaning there)."""
    out = cfg.output_dir
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"output_dir {out!r}: not valid UTF-8 (checkpoint paths must be); rename it"
        ) from None
    if paths.is_remote(out):
        _check_fresh(cfg)
        return
    if os.path.islink(out) and not os.path.exists(out):
        raise ConfigError(
            f"output_dir {out!r} is a symbolic link that leads nowhere (a loop, or a link to a "
            f"missing directory); choose another output_dir"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(
            f"output_dir {out!r} exists and is not a directory; choose another output_dir"
        )
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(
            f"output_dir {out!r}: {parent!r} is a file, not a directory; choose another output_dir"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or parent.startswith(("/proc", "/sys")):
        raise ConfigError(f"output_dir {out!r}: {parent!r} is not writable; choose another")
    _check_fresh(cfg)


def _check_fresh(cfg: RunConfig) -> None:
    """A fresh run (no ``resume``) must not start over another run's checkpoints."""
    out = cfg.output_dir
    steps = _checkpoint_steps(out)
    if steps and not cfg.resume:
        raise ConfigError(
            f"output_dir {out!r} already holds checkpoints of a run (latest step "
            f"{steps[-1]}); pass --resume to continue it, or choose a new "
            f"output_dir"
        )

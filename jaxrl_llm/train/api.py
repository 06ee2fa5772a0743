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
script or notebook, whose module is ``__main__``, works in that process; a lambda or a nested
function is refused, as it has no importable name). In-memory datasets (a list of dicts, or a
``datasets.Dataset``) are written to ``output_dir/data/{train,eval}.jsonl``, so a resume reads
the same rows. The formats are TRL's (``docs/data.md``).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import from_dict, load_config, to_dict
from jaxrl_llm.train.config.plan import RunPlan, plan_run
from jaxrl_llm.train.config.preflight import check_mesh, check_tokenizer_sizes, check_trackers
from jaxrl_llm.train.config.run_config import RunConfig

#: Seeds are unsigned 32-bit (numpy's and JAX's PRNG keys take them).
MAX_SEED = 2**32 - 1


def check_run(cfg: RunConfig) -> RunPlan:
    """Everything checked before a model loads: the mesh and the batch (the plan), a tiny
    model's sizes, the trackers' packages, the seed, the data files, and that ``output_dir`` can hold this run.

    Raises:
      ConfigError: one line naming the key to change.
    """
    plan = plan_run(cfg, check_mesh(cfg))
    check_tokenizer_sizes(cfg)
    check_trackers(cfg)
    if not 0 <= cfg.seed <= MAX_SEED:
        raise ConfigError(f"seed: expected an integer in [0, {MAX_SEED}], got {cfg.seed}")
    for key in ("train", "eval"):
        src = getattr(cfg.data, key, None)
        if (
            isinstance(src, str)
            and src.endswith((".jsonl", ".parquet"))
            and not os.path.isfile(src)
        ):
            raise ConfigError(f"data.{key}: no such data file {src!r}")
    _check_output_dir(cfg)
    return plan


def resolved_config(cfg: RunConfig, plan: RunPlan) -> dict:
    """The config as the run resolved it (the loss section with its defaults), a dict."""
    out = to_dict(cfg)
    out["loss"] = to_dict(plan.loss_config)
    return out


def run_training(cfg: RunConfig) -> dict:
    """Run a checked config (:func:`check_run`) to the end; returns its summary (also written
    to ``output_dir/summary.json``).

    Raises:
      RunStopped: Ctrl-C or SIGTERM stopped the run (a checkpoint was saved where one was
        due; :mod:`jaxrl_llm.train.run.signals`).
    """
    from jaxrl_llm.train.run.run_state import output_dir_lock
    from jaxrl_llm.train.run.signals import stop_signals

    _make_output_dir(cfg.output_dir)
    # the trainer writes config.yaml once it holds the lock and any resume succeeded
    with output_dir_lock(cfg.output_dir), stop_signals():
        if cfg.is_online:
            from jaxrl_llm.train.online.trainer import train_online

            summary = train_online(cfg)
        else:
            from jaxrl_llm.train.offline.trainer import train_offline

            summary = train_offline(cfg)
    if cfg.logging.plots:
        from jaxrl_llm.train.run.plots import plot_run

        plot_run(cfg.output_dir)
    with open(os.path.join(cfg.output_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    return summary


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
    """The ``RunConfig`` :func:`train` runs (its arguments), in-memory datasets written."""
    if isinstance(config, RunConfig):
        base = to_dict(config)
    elif isinstance(config, Mapping):
        base = dict(config)
    else:
        base = to_dict(load_config(RunConfig, str(config), []))
    merged = _merge(base, _nested(overrides))
    rewards = list(merged.get("rewards") or [])
    for item in reward_funcs:
        fn, weight = item if isinstance(item, tuple) else (item, 1.0)
        rewards.append({"name": importable_name(fn, "reward_funcs"), "weight": float(weight)})
    if rewards:
        merged["rewards"] = rewards
    if environment is not None:
        env = dict(merged.get("env") or {})
        env["name"] = importable_name(environment, "environment")
        merged["env"] = env
    out = merged.get("output_dir")
    for key, rows in (("train", train_dataset), ("eval", eval_dataset)):
        if rows is None:
            continue
        if not out:
            raise ConfigError(f"{key}_dataset: an output_dir is required to hold the rows")
        data = dict(merged.get("data") or {})
        data[key] = _write_rows(rows, os.path.join(out, "data", f"{key}.jsonl"), f"{key}_dataset")
        merged["data"] = data
    return from_dict(RunConfig, merged)


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


class Trainer:
    """A run from Python in TRL's shape: ``Trainer(model=..., reward_funcs=[...],
    train_dataset=..., args={...}).train()``; the algorithm is the class's (``GRPOTrainer``,
    ``DPOTrainer``, ...) or ``algorithm=``.

    Args:
      model: ``model.source`` (an alias, HF directory, GGUF file, hub id, PEFT adapter, run
        directory), or a dict for the ``model`` section.
      reward_funcs, environment, train_dataset, eval_dataset: as :func:`train` takes them.
      args: the rest of the config (a dict, a YAML path or a ``RunConfig``); ``output_dir``
        and ``max_steps`` are required.
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
        args: str | Mapping[str, Any] | RunConfig | None = None,
        algorithm: str | None = None,
        **overrides: Any,
    ):
        base: Any = {} if args is None else args
        if not isinstance(base, (str, RunConfig)):
            base = dict(base)
            base.setdefault("algorithm", algorithm or self.algorithm)
        if model is not None:
            overrides["model"] = {"source": model} if isinstance(model, str) else dict(model)
        self.config = build_config(
            base,
            reward_funcs=reward_funcs,
            environment=environment,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            **overrides,
        )
        self.plan = check_run(self.config)

    def train(self) -> dict:
        """Run to the end; the summary (held-out metrics before / after, timings)."""
        return run_training(self.config)


class GRPOTrainer(Trainer):
    """GRPO from Python (:class:`Trainer`; ``algorithm: grpo``)."""

    algorithm = "grpo"


class PPOTrainer(Trainer):
    """PPO with its critic from Python (:class:`Trainer`; ``algorithm: ppo``)."""

    algorithm = "ppo"


class RLOOTrainer(Trainer):
    """RLOO from Python (:class:`Trainer`; ``algorithm: rloo``)."""

    algorithm = "rloo"


class OnlineDPOTrainer(Trainer):
    """Online DPO from Python (:class:`Trainer`; ``algorithm: online_dpo``)."""

    algorithm = "online_dpo"


class SFTTrainer(Trainer):
    """Supervised fine-tuning from Python (:class:`Trainer`; ``algorithm: sft``)."""

    algorithm = "sft"


class DPOTrainer(Trainer):
    """DPO from Python (:class:`Trainer`; ``algorithm: dpo``)."""

    algorithm = "dpo"


class KTOTrainer(Trainer):
    """KTO from Python (:class:`Trainer`; ``algorithm: kto``)."""

    algorithm = "kto"


class ORPOTrainer(Trainer):
    """ORPO from Python (:class:`Trainer`; ``algorithm: orpo``)."""

    algorithm = "orpo"


class RewardTrainer(Trainer):
    """A reward model (scalar head, preference pairs) from Python (:class:`Trainer`; ``algorithm: reward_model``)."""

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


def _write_rows(rows: Any, path: str, what: str) -> str:
    """Rows in memory written as JSONL at ``path``; the path."""
    if hasattr(rows, "to_list"):  # a datasets.Dataset
        rows = rows.to_list()
    rows = list(rows)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError(f"{what}: expected a non-empty list of dicts (or a datasets.Dataset)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        text = "\n".join(json.dumps(dict(r), ensure_ascii=False) for r in rows) + "\n"
    except TypeError as e:
        raise ConfigError(f"{what}: a row cannot be written as JSON ({e})") from None
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _make_output_dir(out: str) -> None:
    """Create and probe a new ``output_dir`` (an existing one, a resume, is left as it is)."""
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


def _check_output_dir(cfg: RunConfig) -> None:
    """``output_dir`` must be a directory (or not exist yet) this process can write; a fresh
    run (no ``resume``) must not start over another run's checkpoints."""
    out = cfg.output_dir
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"output_dir {out!r}: not valid UTF-8 (checkpoint paths must be); rename it"
        ) from None
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
    ckpt = os.path.join(out, "checkpoints")
    steps = sorted(int(e) for e in os.listdir(ckpt) if e.isdigit()) if os.path.isdir(ckpt) else []
    if steps and not cfg.resume:
        raise ConfigError(
            f"output_dir {out!r} already holds checkpoints of a run (latest step "
            f"{steps[-1]}); pass --resume to continue it, or choose a new "
            f"output_dir"
        )

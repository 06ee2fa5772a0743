"""Python objects handed to :func:`jaxrl_llm.train.api.train` and the trainers, made config
values: reward functions and environment classes named (``module:qualname``, or held in this
process as ``python:<label>``), in-memory rows checked and written as JSONL, and every argument
of the wrong type refused in one line before anything reads it.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.run.output_dir import checkpoint_steps


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


def rows_text(rows: Any, what: str) -> str:
    """In-memory rows (a list of dicts or a ``datasets.Dataset``) as JSONL text."""
    if hasattr(rows, "to_list"):  # a datasets.Dataset
        rows = rows.to_list()
    check_rows_type(rows, what)
    rows = list(rows)
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError(f"{what}: expected a non-empty list of dicts (or a datasets.Dataset)")
    try:
        return "\n".join(json.dumps(dict(r), ensure_ascii=False) for r in rows) + "\n"
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what}: a row cannot be written as JSON ({e})") from None


def check_rows_type(rows: Any, what: str) -> None:
    """Rows must be a list (an iterable) of dicts or a ``datasets.Dataset``."""
    if hasattr(rows, "to_list"):
        return
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise ConfigError(
            f"{what}: expected a non-empty list of dicts (or a datasets.Dataset), got "
            f"{type(rows).__name__}"
            + ("; a data file is named by data={'train': PATH}" if isinstance(rows, str) else "")
        )


def write_rows(text: str, path: str, cfg: RunConfig) -> None:
    """Write rows' JSONL ``text`` at ``path`` (atomically). The saved rows of a run with
    checkpoints (a resume, the checks have passed) are kept: the same rows are not rewritten,
    other rows are refused."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            same = f.read() == text
        if same:
            return
        steps = checkpoint_steps(cfg.output_dir)
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


def check_arguments(
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
            check_rows_type(rows, name)

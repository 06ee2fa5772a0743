"""Environments by config name, and building them with the checks a run makes at start-up."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from jaxrl_llm.envs.base import (
    EnvError,
    check_environment_class,
    check_messages,
    check_step,
)
from jaxrl_llm.envs.games import GuessNumberEnv, SingleTurnEnv
from jaxrl_llm.envs.tools import ToolEnv
from jaxrl_llm.errors import ConfigError

ENVIRONMENTS: dict[str, type] = {
    "single_turn": SingleTurnEnv,
    "tools": ToolEnv,
    "guess_number": GuessNumberEnv,
}


def environment_class(name: str) -> type:
    """The class of a built-in name or ``package.module:Class``; :class:`ConfigError` naming
    ``env.name`` when it is not an environment class."""
    cls: Any = ENVIRONMENTS.get(name)
    if cls is None and ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as e:
            raise ConfigError(f"env.name: cannot import {name!r} ({e})") from None
    if cls is None:
        raise ConfigError(
            f"env.name: unknown environment {name!r}; built-in: {', '.join(ENVIRONMENTS)}, "
            f"or package.module:Class"
        )
    check_environment_class(cls, name)
    return cls


def environment_factory(name: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    """``() -> a new environment instance`` (one per episode); building one now turns a bad
    keyword into a :class:`ConfigError` naming ``env.kwargs``."""
    cls = environment_class(name)
    kw = dict(kwargs)
    try:
        cls(**kw)
    except TypeError as e:
        raise ConfigError(f"env.kwargs: {name}: {e}") from None
    return lambda: cls(**kw)


def probe_environment(factory: Callable[[], Any], item: dict, name: str) -> None:
    """One ``reset(item)`` and one ``step("")`` on a fresh instance: a :class:`ConfigError` when
    either returns the wrong type (or raises), before anything compiles."""
    env = factory()
    try:
        check_messages(env.reset(item), f"env {name!r}: reset")
        check_step(env.step(""), f"env {name!r}")
    except EnvError as e:
        raise ConfigError(f"env.name: {e}") from None
    except Exception as e:  # noqa: BLE001 - report the user's environment failing at start-up
        raise ConfigError(
            f"env.name: {name!r} failed its start-up check (reset on the first training row, "
            f"then step('')): {type(e).__name__}: {e}  (set env.check=false to skip)"
        ) from None

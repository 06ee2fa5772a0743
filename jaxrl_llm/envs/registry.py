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
from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.rewards.user_code import shared_runner

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
            f"env.name: unknown environment {name!r}{did_you_mean(name, ENVIRONMENTS)}; "
            f"built-in: {', '.join(ENVIRONMENTS)}, "
            f"or package.module:Class"
        )
    check_environment_class(cls, name)
    return cls


def environment_factory(
    name: str, kwargs: dict[str, Any], *, timeout_s: float | None = None
) -> Callable[[], Any]:
    """``() -> a new environment instance`` (one per episode); building one now turns a bad
    keyword, or a constructor that raises anything (``sys.exit`` included) or does not return
    within ``timeout_s``, into a :class:`ConfigError` naming ``env.kwargs``. The constructor
    runs on a user-code thread (:mod:`jaxrl_llm.rewards.user_code`)."""
    cls = environment_class(name)
    kw = dict(kwargs)
    res = shared_runner("env").call(lambda: cls(**kw), timeout_s=timeout_s)
    if not res.ok:
        exc = res.exception
        if isinstance(exc, ConfigError):  # the class checked its own arguments
            raise ConfigError(str(exc)) from None
        if isinstance(exc, TypeError):
            raise ConfigError(f"env.kwargs: {name}: {exc}") from None
        raise ConfigError(
            f"env.kwargs: {name}({', '.join(f'{k}={v!r}' for k, v in kw.items())}) failed: "
            f"{res.error}"[:600]
        ) from None
    return lambda: cls(**kw)


def probe_environment(
    factory: Callable[[], Any], item: dict, name: str, *, timeout_s: float | None = None
) -> None:
    """One ``reset(item)`` and one ``step("")`` on a fresh instance: a :class:`ConfigError` when
    either returns the wrong type, an empty opening, raises anything or does not answer within
    ``timeout_s``, before anything compiles. The calls run on a user-code thread."""

    def probe() -> None:
        env = factory()
        opening = check_messages(env.reset(item), f"env {name!r}: reset")
        if not opening:
            raise EnvError(f"env {name!r}: reset returned no messages (an empty opening)")
        check_step(env.step(""), f"env {name!r}")

    res = shared_runner("env").call(probe, timeout_s=timeout_s)
    if res.ok:
        return
    if isinstance(res.exception, EnvError):
        raise ConfigError(f"env.name: {res.exception}") from None
    raise ConfigError(
        f"env.name: {name!r} failed its start-up check (reset on the first training row, "
        f"then step('')): {res.error}  (set env.check=false to skip)"
    ) from None

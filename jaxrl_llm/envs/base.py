"""The environment protocol: what a multi-turn environment is, and the checks a run makes of one.

An environment is a class; a run builds one instance per episode with the config's
``env.kwargs``::

    class MyEnv:
        def __init__(self, **kwargs): ...
        def reset(self, item: dict) -> list[dict]:   # one data row -> the opening chat messages
        def step(self, text: str) -> Step:           # the policy's last turn, decoded

``reset`` sees the data row as a dict: ``{"prompt": <the row's prompt, text or messages>,
**<its other columns>}``. After every policy turn the run calls ``step`` with the turn's
text; the returned :class:`Step` carries the environment's reply (chat messages, appended to
the conversation through the tokenizer's chat template), a reward (summed over the episode)
and whether the episode is over. The episode also ends after ``env.max_turns`` policy turns or
when its token budget is spent (then it counts as truncated).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Protocol

from jaxrl_llm.errors import ConfigError, JaxrlError


class EnvError(JaxrlError, RuntimeError):
    """An environment broke its contract (``step`` returned something other than a
    :class:`Step`) or failed in every episode of several consecutive steps."""


@dataclasses.dataclass(frozen=True)
class Step:
    """What an environment answers to one policy turn.

    Attributes:
      messages: chat messages to append (roles ``user``, ``tool``, ``system``, as the chat
        template allows), e.g. ``[{"role": "tool", "content": "42"}]``; ``[]`` = none.
      reward: this turn's reward (the episode's reward is the sum, plus the configured reward
        functions on the final transcript).
      done: the episode is over (the messages, if any, are not appended).
      info: numeric counters summed over the batch's episodes into ``env/<key>`` metrics
        (e.g. ``{"tool_calls": 1, "tool_errors": 0}``).
    """

    messages: list[dict] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = dataclasses.field(default_factory=dict)


class Environment(Protocol):
    """The environment protocol (see the module docstring)."""

    def reset(self, item: dict) -> list[dict]:
        """The episode's opening chat messages for the data row ``item``."""
        ...

    def step(self, text: str) -> Step:
        """The environment's answer to the policy's last turn ``text``."""
        ...


def _takes_one_argument(fn: Any) -> bool:
    """``fn(self, x)`` can be called with one positional argument besides ``self``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # no signature to read (a builtin): the call will tell
    params = list(sig.parameters.values())[1:]  # drop self
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    var = any(p.kind is p.VAR_POSITIONAL for p in params)
    return len(required) <= 1 and (len(positional) >= 1 or var)


def check_environment_class(cls: Any, name: str) -> None:
    """A :class:`ConfigError` naming ``env.name`` unless ``cls`` is a class with ``reset(item)``
    and ``step(text)`` methods."""
    if not inspect.isclass(cls):
        raise ConfigError(
            f"env.name: {name!r} is a {type(cls).__name__}, not a class (an environment is a "
            f"class with reset(item) -> list[dict] and step(text) -> Step)"
        )
    for method, arg in (("reset", "item"), ("step", "text")):
        fn = getattr(cls, method, None)
        if not callable(fn):
            raise ConfigError(f"env.name: {name!r} has no {method}({arg}) method")
        if not _takes_one_argument(fn):
            raise ConfigError(
                f"env.name: {name!r}.{method} must take one argument ({arg}), got "
                f"{method}{inspect.signature(fn)}"
            )


def check_messages(messages: Any, where: str) -> list[dict]:
    """``messages`` as a list of ``{"role": str, "content": str}`` dicts, else :class:`EnvError`
    naming ``where``."""
    if not isinstance(messages, list | tuple) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise EnvError(
            f"{where} must return chat messages, a list of {{'role': str, 'content': str}} "
            f"dicts; got {str(messages)[:120]!r}"
        )
    return [dict(m) for m in messages]


def check_step(result: Any, where: str) -> Step:
    """``result`` if it is a valid :class:`Step`, else :class:`EnvError` naming ``where``."""
    if not isinstance(result, Step):
        raise EnvError(
            f"{where}.step returned {type(result).__name__}, not jaxrl_llm.envs.Step "
            f"(return Step(messages=[...], reward=..., done=...))"
        )
    check_messages(result.messages, f"{where}.step")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        raise EnvError(f"{where}.step returned a non-numeric reward {result.reward!r}") from None
    if not math.isfinite(reward):
        raise EnvError(f"{where}.step returned a non-finite reward {reward}")
    return result

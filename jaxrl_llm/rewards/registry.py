"""Reward functions by config name: the one table a run's ``rewards:`` section is read against.

A run config lists rewards as ``{name, weight, kwargs}``. ``name`` is a key of
:data:`REWARD_FUNCTIONS` or ``"package.module:function"`` for a function of your own, called as
TRL calls one (:mod:`jaxrl_llm.rewards.calling`); ``kwargs`` are bound to it, and a keyword the
function does not name is a start-up error (a misspelt option would otherwise vanish into
``**kwargs``). A callable handed to the Python API that cannot be imported back (a lambda, a
``functools.partial``, a bound method) is held in this process under ``python:<label>``
(:func:`hold_callable`); a resume in another process asks for it again.

Factories take the :class:`RewardContext` of the run (the policy's tokenizer, the generation
budget), so that a reward such as DAPO's overlong punishment can measure lengths in the
policy's own tokens without the config repeating them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.rewards.base import DEFAULT_TIMEOUT_S, RewardSet, RewardSpec
from jaxrl_llm.rewards.calling import CALL_KEYWORDS, call_shape
from jaxrl_llm.rewards.math_answer import math_answer_reward
from jaxrl_llm.rewards.math_verify import math_verify_reward
from jaxrl_llm.rewards.process import outcome_as_process
from jaxrl_llm.rewards.sandbox import code_execution_reward
from jaxrl_llm.rewards.shaping import make_format_reward, make_length_penalty, make_overlong_reward


@dataclasses.dataclass(frozen=True)
class RewardContext:
    """What a reward factory may know about the run.

    Attributes:
      tokenizer: ``text -> token ids`` of the policy (None when the run has none yet).
      max_new_tokens: the rollout's generation budget in tokens (None offline).
      load_reward_model: ``path -> (params, model_config, tokenizer)`` for the ``reward_model``
        reward (the train layer provides the loader; rewards do not import interop).
    """

    tokenizer: Callable[[str], Sequence[int]] | None = None
    max_new_tokens: int | None = None
    load_reward_model: Callable[[str], Any] | None = None


def bind_reward(fn: Callable, **kw) -> Callable:
    """``fn`` with ``kw`` bound; each must be a named parameter of ``fn`` (not one of the
    call's own keywords, ``prompts, completions, completion_ids, trainer_state``, nor, for a
    function called positionally, its first two parameters). A keyword ``fn`` does not name
    is a TypeError listing the ones it takes."""
    if not kw:
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to check (a builtin): the call will tell
        return functools.partial(fn, **kw)
    skip = 0 if call_shape(fn).by_keyword else 2
    named = [
        n
        for i, (n, p) in enumerate(params.items())
        if n not in CALL_KEYWORDS
        and (p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and i >= skip))
    ]
    unknown = sorted(set(kw) - set(named))
    if unknown:
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(
            f"{name}() got an unexpected keyword argument "
            f"{', '.join(repr(u) for u in unknown)}; it takes: "
            f"{', '.join(named) or 'no options'}"
        )
    return functools.partial(fn, **kw)


def _overlong(ctx: RewardContext, *, max_len: int | None = None, buffer: int, unit: str = "tokens"):
    """DAPO's soft overlong punishment; lengths in the policy's tokens against the rollout's
    ``max_new_tokens`` unless given (the reward's weight is DAPO's penalty factor)."""
    max_len = ctx.max_new_tokens if max_len is None else max_len
    if max_len is None:
        raise TypeError("overlong: max_len is required outside an online run")
    return make_overlong_reward(
        max_len=max_len,
        buffer=buffer,
        unit=unit,
        tokenizer=ctx.tokenizer if unit == "tokens" else None,
    )


def _code_execution(ctx: RewardContext, **kw):
    """Unit tests in the sandbox; the isolation is resolved now, so a machine without a
    boundary fails at start-up (or warns, with ``allow_unisolated: true``) instead of marking
    every sample invalid later."""
    import logging

    from jaxrl_llm.rewards.sandbox import resolve_isolation
    from jaxrl_llm.rewards.sandbox_launch import Isolation

    fn = bind_reward(code_execution_reward, **kw)
    iso = resolve_isolation(
        kw.get("isolation", Isolation.AUTO),
        allow_unisolated=bool(kw.get("allow_unisolated", False)),
    )
    if iso == Isolation.PROCESS:
        logging.getLogger("jaxrl_llm").warning(
            "code_execution: no kernel isolation on this machine; untrusted completions run "
            "as this user (allow_unisolated: true)"
        )
    return fn


def _reward_model(ctx: RewardContext, *, path: str, **kw):
    """A trained reward model (HF directory / checkpoint with a scalar head) as a reward."""
    from jaxrl_llm.rewards.reward_model import make_reward_model_reward

    if ctx.load_reward_model is None:
        raise TypeError("reward_model: this run provides no model loader")
    params, config, encode = ctx.load_reward_model(path)
    return make_reward_model_reward(params, config, tokenizer=encode, **kw)


# Reward functions by config name -> factory(ctx, **kwargs) -> reward function. One explicit table.
REWARD_FUNCTIONS: dict[str, Callable[..., Callable]] = {
    "math_answer": lambda ctx, **kw: bind_reward(math_answer_reward, **kw),
    "format": lambda ctx, **kw: make_format_reward(**kw),
    "length_penalty": lambda ctx, **kw: make_length_penalty(**kw),
    "overlong": _overlong,
    "code_execution": _code_execution,
    "math_verify": lambda ctx, **kw: bind_reward(math_verify_reward, **kw),
    "reward_model": _reward_model,
}


#: Prefix of a config name that stands for a callable held in this process (:func:`hold_callable`).
HELD_PREFIX = "python:"
# Callables handed to the Python API that cannot be imported back, by their config name.
_HELD: dict[str, Callable] = {}


def callable_label(fn: Callable) -> str:
    """A readable name of a callable: its qualified name (through ``functools.partial`` and
    bound methods), e.g. ``<lambda>``, ``Scorer.score``, ``partial(reward_len)``."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_label(fn.func)})"
    inner = getattr(fn, "__func__", fn)  # a bound method
    name = getattr(inner, "__qualname__", None) or type(fn).__qualname__
    return name.replace("<locals>.", "")


def hold_callable(fn: Callable, *, taken: Sequence[str] = ()) -> str:
    """Hold ``fn`` in this process and return its config name, ``python:<label>`` (a
    ``#n`` suffix when ``taken`` names hold that label already). A run resumed in another
    process cannot import it back: :func:`build_reward` then asks for it again."""
    base = HELD_PREFIX + callable_label(fn)
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    _HELD[name] = fn
    return name


def held_callable(name: str, key: str, *, what: str = "reward") -> Callable:
    """The callable held as ``name`` (:func:`hold_callable`).

    Raises:
      ConfigError: it is not held in this process (a resume from another one), in one line.
    """
    fn = _HELD.get(name)
    if fn is None:
        raise ConfigError(
            f"{key}: {name!r} was a Python {what} (a lambda, functools.partial or bound method) "
            f"given to the trainer, which a new process cannot import; pass it again "
            f"(jaxrl_llm.GRPOTrainer(..., reward_funcs=[...], args={{..., 'resume': True}})), "
            f"or name a module:function instead"
        )
    return fn


def import_function(path: str, key: str, *, what: str = "reward") -> Callable:
    """``"package.module:function"`` -> the callable; :class:`ConfigError` naming ``key``."""
    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"{key}: cannot import {what} {path!r} ({e}); the module must be importable: "
            f"beside the config file or in the working directory (jaxrl-llm train adds both), "
            f"or on PYTHONPATH"
        ) from None
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{key}: cannot import {what} {path!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(f"{key}: {path!r} is not callable")
    return fn


def build_reward(
    name: str, kwargs: dict[str, Any], *, key: str, ctx: RewardContext = RewardContext()
) -> Callable:
    """One reward function from its config ``name`` and ``kwargs`` (``key`` names the config
    entry in errors)."""
    factory = REWARD_FUNCTIONS.get(name)
    if factory is None and ":" in name:
        fn = (
            held_callable(name, f"{key}.name")
            if name.startswith(HELD_PREFIX)
            else import_function(name, f"{key}.name")
        )
        factory = lambda _ctx, **kw: bind_reward(fn, **kw)  # noqa: E731
    if factory is None:
        raise ConfigError(
            f"{key}.name: unknown reward {name!r}{did_you_mean(name, REWARD_FUNCTIONS)}; "
            f"available: {', '.join(sorted(REWARD_FUNCTIONS))}, or package.module:function"
        )
    try:
        return factory(ctx, **kwargs)
    except TypeError as e:
        raise ConfigError(f"{key}.kwargs: {e}") from None


def build_reward_set(items: Sequence[Any], *, ctx: RewardContext = RewardContext()) -> RewardSet:
    """The weighted :class:`RewardSet` of a config's ``rewards`` list (items with ``name``,
    ``weight``, ``kwargs`` and optionally ``timeout_s``, ``on_error``: plain records built by
    tools may leave those two out)."""
    specs = [
        RewardSpec(
            build_reward(item.name, dict(item.kwargs), key=f"rewards[{i}]", ctx=ctx),
            weight=item.weight,
            name=item.name,
            timeout_s=getattr(item, "timeout_s", DEFAULT_TIMEOUT_S),
            on_error=getattr(item, "on_error", "invalid"),
            # a function of the user's is called as TRL calls it (message lists for
            # conversational rows); the built-ins read text
            conversational=item.name not in REWARD_FUNCTIONS,
        )
        for i, item in enumerate(items)
    ]
    return RewardSet(specs, encode=ctx.tokenizer)


def build_step_scorer(
    name: str, kwargs: dict[str, Any], *, outcome: Callable, delimiter: str
) -> Callable:
    """A process-reward step scorer: ``outcome_as_process`` (every prefix scored with the
    ``outcome`` reward) or ``"package.module:function"`` with ``kwargs`` bound."""
    if name == "outcome_as_process":
        return outcome_as_process(outcome, delimiter=delimiter)
    fn = import_function(name, "process_reward.name")
    try:
        return bind_reward(fn, **kwargs)
    except TypeError as e:
        raise ConfigError(f"process_reward.kwargs: {e}") from None

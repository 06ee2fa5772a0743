"""Multi-turn environments and tool calls.

An environment is a class with ``reset(item) -> list[dict]`` (the opening chat messages of an
episode, from one data row) and ``step(text) -> Step`` (its answer to the policy's turn);
:mod:`jaxrl_llm.envs.base` holds the protocol and its checks, :mod:`.episodes` plays episodes
on the continuous-batching engine with environment calls in a thread pool, :mod:`.chat`
turns messages into tokens without re-tokenising the policy's turns. Built-ins
(:data:`ENVIRONMENTS`): ``single_turn``, ``tools`` (Qwen/Hermes ``<tool_call>`` JSON or Gemma 4's ``<|tool_call>call:``; a safe
``calculator`` and sandboxed ``python``), ``guess_number``.
"""

from jaxrl_llm.envs.base import (
    EnvError,
    Environment,
    Step,
    check_environment_class,
    check_messages,
    check_step,
)
from jaxrl_llm.envs.calculator import CalculatorError, calculate
from jaxrl_llm.envs.chat import ChatCodec
from jaxrl_llm.envs.episodes import Episode, run_episodes
from jaxrl_llm.envs.games import GuessNumberEnv, SingleTurnEnv
from jaxrl_llm.envs.registry import (
    ENVIRONMENTS,
    environment_class,
    environment_factory,
    probe_environment,
)
from jaxrl_llm.envs.tools import (
    BUILTIN_TOOLS,
    CALL_FORMATS,
    ToolEnv,
    call_tool,
    parse_gemma4_tool_call,
    parse_tool_call,
    tool_schema,
    tools_system_prompt,
)

__all__ = [
    "BUILTIN_TOOLS",
    "CALL_FORMATS",
    "CalculatorError",
    "ChatCodec",
    "ENVIRONMENTS",
    "EnvError",
    "Environment",
    "Episode",
    "GuessNumberEnv",
    "SingleTurnEnv",
    "Step",
    "ToolEnv",
    "calculate",
    "call_tool",
    "check_environment_class",
    "check_messages",
    "check_step",
    "environment_class",
    "environment_factory",
    "parse_gemma4_tool_call",
    "parse_tool_call",
    "probe_environment",
    "run_episodes",
    "tool_schema",
    "tools_system_prompt",
]

"""Tool calling: tools as plain Python functions, their descriptions, the call format, and the
``tools`` environment.

A tool is a function with type hints and a docstring (its first paragraph describes the tool;
an ``Args:`` section describes the arguments). Its JSON description, in the OpenAI /
Hugging Face ``tools`` form, is read from both (:func:`tool_schema`). The policy calls a tool
in the format of the Qwen / Hermes chat templates::

    <tool_call>{"name": "calculate", "arguments": {"expression": "123 * 456"}}</tool_call>

and gets the result back as a ``tool`` message. A turn without a tool call is the policy's
final answer and ends the episode. Built-in tools: ``calculator`` (:func:`jaxrl_llm.envs.
calculator.calculate`) and ``python`` (a program run in the code sandbox,
:func:`jaxrl_llm.rewards.run_python`, its stdout returned). A tool that raises answers with
``error: <message>``; nothing a tool does ends the episode with an exception.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

from jaxrl_llm.envs.base import Step
from jaxrl_llm.envs.calculator import calculate
from jaxrl_llm.errors import ConfigError

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints.

    Args:
      code: the program's source; print the values you need.
    """
    from jaxrl_llm.rewards import run_python

    result = run_python(code, timeout_s=5.0)
    if result.reason not in ("passed",):
        tail = (result.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"{result.reason}: " + " | ".join(tail))
    return result.stdout.strip()


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculate, "python": python}


def _describe(fn: Callable) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph and its ``Args:`` descriptions."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    m = re.search(r"^Args:\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if m:
        for line in m.group(1).splitlines():
            name, sep, text = line.strip().partition(":")
            if sep and name.isidentifier():
                args[name] = text.strip()
    return summary, args


def tool_schema(fn: Callable) -> dict:
    """The OpenAI / Hugging Face description of a tool function (name, description, JSON
    parameters from the type hints); :class:`ConfigError` for a parameter without a hint of
    str / int / float / bool or a function without a docstring."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    summary, arg_docs = _describe(fn)
    if not summary:
        raise ConfigError(f"env.kwargs.tools: tool {name!r} needs a docstring (its description)")
    hints = typing.get_type_hints(fn)
    props: dict[str, dict] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        kind = _JSON_TYPES.get(hints.get(p.name))  # type: ignore[arg-type]
        if kind is None:
            raise ConfigError(
                f"env.kwargs.tools: {name}({p.name}) needs a type hint of str, int, float or bool"
            )
        props[p.name] = {"type": kind, "description": arg_docs.get(p.name, "")}
        if p.default is p.empty:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": summary,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def resolve_tools(tools: list[str] | tuple[str, ...]) -> dict[str, Callable]:
    """Tool functions by the name the policy calls them with, from config entries (a built-in
    name or ``package.module:function``)."""
    from jaxrl_llm.rewards import import_function

    out: dict[str, Callable] = {}
    for entry in tools:
        fn = BUILTIN_TOOLS.get(entry)
        if fn is None and ":" in entry:
            fn = import_function(entry, "env.kwargs.tools", what="tool")
        if fn is None:
            raise ConfigError(
                f"env.kwargs.tools: unknown tool {entry!r}; built-in: "
                f"{', '.join(BUILTIN_TOOLS)}, or package.module:function"
            )
        out[fn.__name__] = fn
    if not out:
        raise ConfigError("env.kwargs.tools: list at least one tool, e.g. [calculator]")
    return out


def tools_system_prompt(schemas: list[dict], preamble: str = "") -> str:
    """A short system prompt: one line per tool (``name(arg: type, ...): description``) and
    the call format (short prompts are cheap to prefill on every episode)."""
    lines = [preamble.strip()] if preamble.strip() else []
    lines.append("Tools:")
    for s in schemas:
        fn = s["function"]
        args = ", ".join(f"{k}: {v['type']}" for k, v in fn["parameters"]["properties"].items())
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    lines.append(
        'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call> and wait '
        "for its result. Reply without a tool call when you know the answer."
    )
    return "\n".join(lines)


def parse_tool_call(text: str) -> tuple[str, dict] | str | None:
    """The first ``<tool_call>`` in ``text``: ``(name, arguments)``, an error message when it is
    not valid JSON of that form, or None when there is no tool call."""
    m = TOOL_CALL.search(text)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        return f"error: the tool call is not valid JSON ({e.msg})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'error: a tool call is {"name": <tool name>, "arguments": {...}}'
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return "error: the tool call's arguments are not a JSON object"
    if not isinstance(args, dict):
        return "error: the tool call's arguments are not a JSON object"
    return call["name"], args


def call_tool(tools: dict[str, Callable], name: str, args: dict) -> tuple[str, bool]:
    """``(result text, ok)`` of one tool call; every failure is an ``error: ...`` text."""
    fn = tools.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}; tools: {', '.join(tools)}", False
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        return f"error: bad arguments for {name}: {e}", False
    try:
        return str(fn(**args)), True
    except Exception as e:  # noqa: BLE001 - a tool error is an answer to the policy
        return f"error: {e}", False


class ToolEnv:
    """The ``tools`` environment: the policy may call tools; a turn without a call ends the
    episode (its text is the final answer the reward functions score). ``Step.info`` counts
    ``tool_calls``, ``tool_errors``, ``final_answers`` and ``clean_tool_use`` (a final answer
    after at least one tool call and no failed one).

    Args:
      tools: tool names (``calculator``, ``python``) or ``package.module:function``.
      system_prompt: text put before the tool list in the system message.
      call_reward: reward added per successful tool call (default 0: the reward functions on
        the final answer decide).
      error_reward: reward added per failed tool call (default 0).
    """

    def __init__(
        self,
        tools: list[str] | tuple[str, ...] = ("calculator",),
        system_prompt: str = "",
        call_reward: float = 0.0,
        error_reward: float = 0.0,
    ):
        self.tools = resolve_tools(tools)
        self.schemas = [tool_schema(fn) for fn in self.tools.values()]
        self.system = tools_system_prompt(self.schemas, system_prompt)
        self.call_reward, self.error_reward = float(call_reward), float(error_reward)
        self.calls = self.errors = 0

    def reset(self, item: dict) -> list[dict]:
        """The system message with the tools, then the row's prompt (text or messages)."""
        prompt = item.get("prompt")
        if isinstance(prompt, str):
            chat = [{"role": "user", "content": prompt}]
        else:
            chat = [dict(m) for m in (prompt or ())]
        if chat and chat[0].get("role") == "system":
            chat[0] = {"role": "system", "content": chat[0]["content"] + "\n\n" + self.system}
            return chat
        return [{"role": "system", "content": self.system}, *chat]

    def step(self, text: str) -> Step:
        """Answer a tool call with a ``tool`` message; end the episode on a final answer."""
        call = parse_tool_call(text)
        if call is None:
            clean = int(self.calls > 0 and self.errors == 0)
            return Step(done=True, info={"final_answers": 1, "clean_tool_use": clean})
        if isinstance(call, str):
            content, ok = call, False
        else:
            content, ok = call_tool(self.tools, *call)
        self.calls, self.errors = self.calls + 1, self.errors + (not ok)
        return Step(
            messages=[{"role": "tool", "content": content}],
            reward=self.call_reward if ok else self.error_reward,
            info={"tool_calls": 1, "tool_errors": int(not ok)},
        )

"""Tool calling: tools as plain Python functions, their descriptions, the call format, and the
``tools`` environment.

A tool is a function with type hints and a docstring (its first paragraph describes the tool;
an ``Args:`` section describes the arguments). Its JSON description, in the OpenAI /
Hugging Face ``tools`` form, is read from both (:func:`tool_schema`). The policy calls a tool
in the format of the Qwen / Hermes chat templates::

    <tool_call>{"name": "calculate", "arguments": {"expression": "123 * 456"}}</tool_call>

or, with ``call_format="gemma4"``, in Gemma 4's format (transformers' response template for
``gemma4``, ``transformers/cli/serving/utils.py``: a name after ``call:``, the arguments an
object with bare keys and strings between ``<|"|>`` marks)::

    <|tool_call>call:calculate{expression:<|"|>123 * 456<|"|>}<tool_call|>

and gets the result back as a ``tool`` message. A turn without a tool call is the policy's
final answer and ends the episode. Built-in tools: ``calculator`` (:func:`jaxrl_llm.envs.
calculator.calculate`) and ``python`` (a program run in the code sandbox,
:func:`jaxrl_llm.rewards.run_python`, its stdout returned). A tool that raises answers with
``error: <message>``; nothing a tool does ends the episode with an exception.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import typing
from collections.abc import Callable
from typing import Any

from jaxrl_llm.envs.base import Step
from jaxrl_llm.envs.calculator import calculate
from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.models.families.gpt_oss import harmony
from jaxrl_llm.rewards.user_code import shared_runner

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
#: Gemma 4's tool-call marks and its string delimiter.
GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'
#: The parser reads at most this many characters of a turn (a policy can write megabytes of
#: unclosed tags; two ``str.find`` calls over a bounded prefix keep a turn's parse linear).
MAX_SCAN_CHARS = 65_536
#: A tool call's JSON longer than this is answered with an error, not parsed.
MAX_CALL_CHARS = 16_384
#: Seconds one tool call may take by default (``ToolEnv(tool_timeout_s=...)``).
DEFAULT_TOOL_TIMEOUT_S = 10.0

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


def tool_entries(tools: Any) -> list[tuple[str, float | None]]:
    """``env.kwargs.tools`` as ``(name, timeout_s or None)`` pairs: a list of names or of
    ``{name, timeout_s}`` dicts; one name as a string is a one-element list."""
    if isinstance(tools, str):
        tools = [tools]
    if not isinstance(tools, list | tuple):
        raise ConfigError(
            f"env.kwargs.tools: a list of tool names, e.g. [calculator], got {tools!r}"
        )
    out: list[tuple[str, float | None]] = []
    for entry in tools:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            unknown = sorted(set(entry) - {"name", "timeout_s"})
            timeout = entry.get("timeout_s")
            if unknown or not (
                timeout is None
                or (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0)
            ):
                raise ConfigError(
                    f"env.kwargs.tools: {entry!r}: a tool is a name or {{name, timeout_s > 0}}"
                )
            out.append((entry["name"], None if timeout is None else float(timeout)))
        elif isinstance(entry, str):
            out.append((entry, None))
        else:
            raise ConfigError(
                f"env.kwargs.tools: {entry!r} is not a tool name (a built-in, "
                f"package.module:function, or {{name, timeout_s}})"
            )
    return out


def resolve_tools(tools: Any) -> dict[str, Callable]:
    """Tool functions by the name the policy calls them with, from config entries (a built-in
    name or ``package.module:function``; see :func:`tool_entries`)."""
    from jaxrl_llm.rewards import import_function

    out: dict[str, Callable] = {}
    for entry, _ in tool_entries(tools):
        fn = BUILTIN_TOOLS.get(entry)
        if fn is None and ":" in entry:
            fn = import_function(entry, "env.kwargs.tools", what="tool")
        if fn is None:
            raise ConfigError(
                f"env.kwargs.tools: unknown tool {entry!r}{did_you_mean(entry, BUILTIN_TOOLS)}; "
                f"built-in: "
                f"{', '.join(BUILTIN_TOOLS)}, or package.module:function"
            )
        out[fn.__name__] = fn
    if not out:
        raise ConfigError("env.kwargs.tools: list at least one tool, e.g. [calculator]")
    return out


def tools_system_prompt(
    schemas: list[dict], preamble: str = "", call_format: str = "hermes"
) -> str:
    """A short system prompt: one line per tool (``name(arg: type, ...): description``) and
    the call format of :data:`CALL_FORMATS` (short prompts are cheap to prefill on every
    episode)."""
    lines = [preamble.strip()] if preamble.strip() else []
    lines.append("Tools:")
    for s in schemas:
        fn = s["function"]
        args = ", ".join(f"{k}: {v['type']}" for k, v in fn["parameters"]["properties"].items())
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    lines.append(
        f"Call a tool with {_call_format(call_format)[1]} and wait for its result. Reply "
        f"without a tool call when you know the answer."
    )
    return "\n".join(lines)


def parse_tool_call(text: str) -> tuple[str, dict] | str | None:
    """The first ``<tool_call>`` in ``text``: ``(name, arguments)``, an error message when it is
    not valid JSON of that form (nested too deeply, an integer of thousands of digits, longer
    than :data:`MAX_CALL_CHARS`), or None when there is no tool call. Linear in the text, of
    which it reads at most :data:`MAX_SCAN_CHARS` characters."""
    cut = len(text) > MAX_SCAN_CHARS
    text = text[:MAX_SCAN_CHARS]
    start = text.find(OPEN_TAG)
    if start < 0:
        return None
    end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
    if end < 0 and cut:
        return f"error: no </tool_call> within the first {MAX_SCAN_CHARS} characters of the turn"
    if end < 0:
        return None  # an unclosed tag is no call (the turn is a final answer)
    body = text[start + len(OPEN_TAG) : end].strip()
    if len(body) > MAX_CALL_CHARS:
        return f"error: the tool call is longer than {MAX_CALL_CHARS} characters"
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"error: the tool call is not valid JSON ({e.msg})"
    except RecursionError:
        return "error: the tool call is nested too deeply"
    except ValueError as e:  # e.g. an integer past Python's digit limit
        return f"error: the tool call cannot be read ({str(e)[:120]})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'error: a tool call is {"name": <tool name>, "arguments": {...}}'
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return "error: the tool call's arguments are not a JSON object"
    if not isinstance(args, dict):
        return "error: the tool call's arguments are not a JSON object"
    return call["name"], args


def parse_gemma4_tool_call(text: str) -> tuple[str, dict] | str | None:
    """The first Gemma 4 tool call in ``text`` (``<|tool_call>call:NAME{key:value, ...}
    <tool_call|>``, strings between ``<|"|>`` marks, keys bare or quoted): ``(name,
    arguments)``, an error message when it cannot be read, or None when there is none. Linear
    in the text, of which it reads at most :data:`MAX_SCAN_CHARS` characters."""
    cut = len(text) > MAX_SCAN_CHARS
    text = text[:MAX_SCAN_CHARS]
    start = text.find(GEMMA4_OPEN)
    if start < 0:
        return None
    end = text.find(GEMMA4_CLOSE, start + len(GEMMA4_OPEN))
    if end < 0 and cut:
        return f"error: no {GEMMA4_CLOSE} within the first {MAX_SCAN_CHARS} characters of the turn"
    if end < 0:
        return None
    call = text[start + len(GEMMA4_OPEN) : end].strip()
    if len(call) > MAX_CALL_CHARS:
        return f"error: the tool call is longer than {MAX_CALL_CHARS} characters"
    m = _NAME.match(call)
    if m is None:
        return "error: a tool call is call:<tool name>{key:value, ...}"
    body = call[m.end() :].strip() or "{}"
    try:
        args = json.loads(_gemma4_object_as_json(body))
    except (ValueError, RecursionError):
        return "error: the tool call's arguments are not an object of key:value pairs"
    if not isinstance(args, dict):
        return "error: the tool call's arguments are not an object of key:value pairs"
    return m.group(0), args


def parse_harmony_tool_call(text: str) -> tuple[str, dict] | str | None:
    """The first gpt-oss tool call in ``text`` in the harmony format (a message to
    ``functions.NAME`` with JSON arguments, :mod:`jaxrl_llm.models.families.gpt_oss.harmony`):
    ``(name, arguments)``, an error message when it cannot be read, or None when there is none.
    Linear in the text, of which it reads at most :data:`MAX_SCAN_CHARS` characters."""
    return harmony.parse_tool_call(text, max_scan=MAX_SCAN_CHARS, max_call=MAX_CALL_CHARS)


_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_WORD, _COLON = re.compile(r"[A-Za-z_]\w*"), re.compile(r"\s*:")


def _gemma4_object_as_json(body: str) -> str:
    """Gemma 4's argument object as JSON: ``<|"|>`` strings and bare keys quoted (JSON's own
    strings copied as they are). ValueError for an unclosed string."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        if body.startswith(GEMMA4_QUOTE, i):
            j = body.find(GEMMA4_QUOTE, i + len(GEMMA4_QUOTE))
            if j < 0:
                raise ValueError("unclosed string")
            out.append(json.dumps(body[i + len(GEMMA4_QUOTE) : j]))
            i = j + len(GEMMA4_QUOTE)
        elif body[i] == '"':
            j = i + 1
            while j < n and body[j] != '"':
                j += 2 if body[j] == "\\" else 1
            out.append(body[i : j + 1])
            i = j + 1
        elif (m := _WORD.match(body, i)) is not None:  # a bare key, or true / false / null
            i = m.end()
            out.append(json.dumps(m.group(0)) if _COLON.match(body, i) else m.group(0))
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


#: Tool-call formats by name: (parser, how the system prompt shows a call). ``hermes``: the
#: Qwen / Hermes JSON in ``<tool_call>`` tags; ``gemma4``: Gemma 4's ``<|tool_call>call:``;
#: ``harmony``: gpt-oss's message to ``functions.NAME``.
CALL_FORMATS: dict[str, tuple[Callable[[str], Any], str]] = {
    "hermes": (parse_tool_call, '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'),
    "gemma4": (
        parse_gemma4_tool_call,
        f"{GEMMA4_OPEN}NAME{{key:{GEMMA4_QUOTE}text{GEMMA4_QUOTE},n:1}}{GEMMA4_CLOSE}",
    ),
    "harmony": (parse_harmony_tool_call, harmony.CALL_EXAMPLE),
}


def _call_format(name: str) -> tuple[Callable[[str], Any], str]:
    try:
        return CALL_FORMATS[name]
    except KeyError:
        raise ConfigError(
            f"env.kwargs.call_format: unknown tool-call format {name!r}"
            f"{did_you_mean(name, CALL_FORMATS)}; known: "
            f"{', '.join(CALL_FORMATS)}"
        ) from None


def call_tool(
    tools: dict[str, Callable],
    name: str,
    args: dict,
    *,
    timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
) -> tuple[str, bool]:
    """``(result text, ok)`` of one tool call; every failure (an exception, ``sys.exit``, no
    answer within ``timeout_s``, a result that cannot be printed) is an ``error: ...`` text.
    The tool runs on a thread of :func:`~jaxrl_llm.rewards.user_code.shared_runner`."""
    fn = tools.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}; tools: {', '.join(tools)}"[:500], False
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        return f"error: bad arguments for {name}: {e}"[:500], False
    res = shared_runner("tool").call(lambda: str(fn(**args)), timeout_s=timeout_s)
    if res.ok:
        return res.value, True
    exc = res.exception
    msg = str(exc) if isinstance(exc, Exception) and str(exc) else res.error
    return f"error: {msg}"[:2000], False


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
      tool_timeout_s: seconds a tool call may take (default 10; a ``{name, timeout_s}`` entry
        of ``tools`` sets its own); past it the call is answered ``error: timeout ...``.
      call_format: how the policy writes a call, a :data:`CALL_FORMATS` name: ``hermes``
        (default; Qwen, Llama, SmolLM), ``gemma4`` or ``harmony`` (gpt-oss).
      tools_prompt: how the tools are described to the policy: ``auto`` (the default: the
        tokenizer's chat template renders them from ``tools=``, as TRL does, when it writes
        tool descriptions; else this environment's own text), ``template`` (the template's
        rendering or an error) or ``env`` (always the environment's text,
        :func:`tools_system_prompt`). ``reset`` returns the messages with the environment's
        text; the episode runner takes it out again (:meth:`without_tools_text`) when the
        template renders the tools.
    """

    def __init__(
        self,
        tools: Any = ("calculator",),
        system_prompt: str = "",
        call_reward: float = 0.0,
        error_reward: float = 0.0,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        call_format: str = "hermes",
        tools_prompt: str = "auto",
    ):
        if tools_prompt not in ("auto", "template", "env"):
            raise ConfigError(
                f"env.kwargs.tools_prompt: auto | template | env, got {tools_prompt!r}"
            )
        self.tools_prompt = tools_prompt
        self.parse = _call_format(call_format)[0]
        self.tools = resolve_tools(tools)
        names = {e: n for (e, _), n in zip(tool_entries(tools), self.tools)}
        self.timeouts = {
            names[e]: (t if t is not None else float(tool_timeout_s))
            for e, t in tool_entries(tools)
        }
        self.schemas = [tool_schema(fn) for fn in self.tools.values()]
        self.system = tools_system_prompt(self.schemas, system_prompt, call_format)
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

    @property
    def template_tools(self) -> list[dict] | None:
        """The tool descriptions for the chat template's ``tools=`` (None with
        ``tools_prompt: env``)."""
        return None if self.tools_prompt == "env" else self.schemas

    def without_tools_text(self, messages: list[dict]) -> list[dict]:
        """``reset``'s messages without this environment's tool text (the system message it
        added, or the text it appended to the row's own system message)."""
        if not messages or messages[0].get("role") != "system":
            return messages
        content = messages[0].get("content")
        if content == self.system:
            return messages[1:]
        suffix = "\n\n" + self.system
        if isinstance(content, str) and content.endswith(suffix):
            return [{**messages[0], "content": content[: -len(suffix)]}, *messages[1:]]
        return messages

    def step(self, text: str) -> Step:
        """Answer a tool call with a ``tool`` message; end the episode on a final answer."""
        call = self.parse(text)
        if call is None:
            clean = int(self.calls > 0 and self.errors == 0)
            return Step(done=True, info={"final_answers": 1, "clean_tool_use": clean})
        if isinstance(call, str):
            content, ok = call, False
        else:
            content, ok = call_tool(self.tools, *call, timeout_s=self.timeouts.get(call[0]))
        self.calls, self.errors = self.calls + 1, self.errors + (not ok)
        return Step(
            messages=[{"role": "tool", "content": content}],
            reward=self.call_reward if ok else self.error_reward,
            info={"tool_calls": 1, "tool_errors": int(not ok)},
        )

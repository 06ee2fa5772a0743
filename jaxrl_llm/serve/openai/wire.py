"""From OpenAI request fields to engine inputs, and from samples back to response fields.

- :func:`check_messages`, :func:`check_tools`: malformed messages or tools are a 400 naming
  the message and the field;
- :func:`chat_prompt`: messages (and tools) rendered by the tokenizer's chat template with the
  generation prompt, encoded without special tokens (the template writes its own), as
  :func:`jaxrl_llm.data.encode_prompt` does;
- :func:`sampling_config`: the request's :class:`~jaxrl_llm.sampling.SamplingConfig`
  (temperature 0 is greedy);
- :func:`cut_at_stop`: a sample cut at the first stop string (the token that completes the stop
  string is the last one kept; its text is cut before the stop string, as vLLM does);
- :func:`tool_calls`: the family's call format (:data:`jaxrl_llm.envs.tools.CALL_FORMATS`)
  parsed out of a reply into OpenAI ``tool_calls``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from jaxrl_llm.envs.tools import CALL_FORMATS, CLOSE_TAG, GEMMA4_CLOSE, MAX_SCAN_CHARS
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.models.families.registry import entry_of
from jaxrl_llm.sampling import SamplingConfig
from jaxrl_llm.serve.openai.schema import ROLES, TOOL_CHOICES, Sampling
from jaxrl_llm.serve.server import ServeError

#: Where each call format's call ends (to look for the next call after it).
_CALL_END = {"hermes": CLOSE_TAG, "gemma4": GEMMA4_CLOSE}


def call_format_for(config: ModelConfig) -> str:
    """The :data:`~jaxrl_llm.envs.tools.CALL_FORMATS` name a family's chat template uses."""
    return entry_of(config.family).tool_call_format


def _bad(message: str) -> ServeError:
    return ServeError(400, message)


def _text_of(content: Any, where: str) -> str | None:
    """A message's content as text: a string, None, or a list of ``{"type": "text"}`` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}.content[{j}]: only text parts are served, got {kind!r}")
            if not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}].text must be a string")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}.content must be a string or a list of text parts")


def _check_call(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(f"{where}: a tool call is {{'type': 'function', 'function': {{'name', ...}}}}")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            raise _bad(f"{where}.function.arguments is not JSON") from None
    if not isinstance(args, dict):
        raise _bad(f"{where}.function.arguments is not a JSON object")
    # chat templates read the arguments as a mapping (transformers' convention)
    return {
        "type": "function",
        "id": call.get("id"),
        "function": {"name": fn["name"], "arguments": args},
    }


def check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them; a 400 naming the first malformed one."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
        msg: dict[str, Any] = {"role": role, "content": _text_of(m.get("content"), where)}
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise _bad(f"{where}.tool_calls: a list, on an assistant message only")
            msg["tool_calls"] = [
                _check_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)
            ]
        elif msg["content"] is None:
            raise _bad(f"{where}.content is missing")
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def check_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> list[dict] | None:
    """The request's tools (OpenAI's function form); a 400 for a malformed one, or a
    ``tool_choice`` that would need constrained decoding (``required``, a named function)."""
    if tool_choice not in TOOL_CHOICES:
        raise _bad(
            f"tool_choice {tool_choice!r} is not served (no constrained decoding); use 'auto' "
            "or 'none'"
        )
    if not tools:
        return None
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{i}]: a tool is {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}].function.name must be a non-empty string")
        if not isinstance(fn.get("parameters", {}), dict):
            raise _bad(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def chat_prompt(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """Token ids of ``messages`` through the chat template, the assistant turn opened."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise _bad("this model's tokenizer has no chat template; use /v1/completions")
    kw: dict[str, Any] = {"tools": tools} if tools else {}
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kw
        )
    except Exception as e:  # noqa: BLE001 - the template's own complaint, as one sentence
        raise _bad(f"the chat template cannot render these messages: {e}") from None
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return [int(t) for t in ids]


def sampling_config(req: Sampling) -> SamplingConfig:
    """The engine's sampling config of a request (temperature 0: greedy, log-probs at τ = 1)."""
    if req.presence_penalty or req.frequency_penalty or req.logit_bias:
        raise _bad("presence_penalty, frequency_penalty and logit_bias are not served")
    temp = 1.0 if req.temperature is None else float(req.temperature)
    return SamplingConfig(
        greedy=temp == 0.0,
        temperature=temp,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        min_p=req.min_p or 0.0,
        stop_token_ids=tuple(sorted(set(req.stop_token_ids or ()))),
    )


def stop_strings(req: Sampling) -> list[str]:
    """The request's stop strings (at most 4, none empty: OpenAI's rule)."""
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise _bad("stop: at most 4 non-empty strings")
    return stops


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Text of ``ids``, special tokens dropped (what a client shows)."""
    if tokenizer is None:
        return ""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def cut_at_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[int, str, bool]:
    """``(tokens kept, text, stopped)``: the shortest prefix of ``ids`` whose text holds a stop
    string, and that text cut before the stop string; all of ``ids`` when none occurs."""
    text = decode(tokenizer, ids)
    if not stops or not any(s in text for s in stops):
        return len(ids), text, False
    lo, hi = 1, len(ids)  # the text of a prefix holds a stop string from some length on
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(tokenizer, ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    text = decode(tokenizer, ids[:lo])
    at = min(text.find(s) for s in stops if s in text)
    return lo, text[:at], True


def tool_calls(text: str, call_format: str) -> tuple[str | None, list[dict]]:
    """``(content left, tool_calls)``: every well-formed call of ``call_format`` in ``text``
    (OpenAI's ``{"id", "type": "function", "function": {"name", "arguments": JSON}}``), and the
    text before the first call (None when empty). A malformed call stays in the content."""
    parse = CALL_FORMATS[call_format][0]
    end_tag = _CALL_END.get(call_format)
    calls: list[dict] = []
    first_at, rest, offset = None, text[:MAX_SCAN_CHARS], 0
    while rest:
        got = parse(rest)
        if not isinstance(got, tuple):
            break
        name, args = got
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        )
        if first_at is None:
            opens = {"hermes": "<tool_call>", "gemma4": "<|tool_call>"}.get(call_format)
            first_at = offset + rest.find(opens) if opens and opens in rest else 0
        if end_tag is None or end_tag not in rest:
            break
        cut = rest.find(end_tag) + len(end_tag)
        rest, offset = rest[cut:], offset + cut
    if not calls:
        return text, []
    content = text[:first_at].strip()
    return (content or None), calls


def token_text(tokenizer: Any, token: int) -> str:
    """One token's text as logprobs entries show it (special tokens written out)."""
    if tokenizer is None:
        return f"token_id:{token}"
    try:
        return tokenizer.decode([token], skip_special_tokens=False)
    except TypeError:
        return tokenizer.decode([token])

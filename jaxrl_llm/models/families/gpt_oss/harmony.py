"""gpt-oss's tool calls in the harmony response format (OpenAI 2025, "OpenAI Harmony Response
Format", https://cookbook.openai.com/articles/openai-harmony): a message is a header, then
``<|message|>``, its body, and ``<|end|>`` / ``<|call|>`` / ``<|return|>``; the next message
begins with ``<|start|>`` and its role. A tool call is the message whose header names a
recipient ``to=functions.NAME`` (in the role part or after the channel), with its JSON
arguments as the body, ended by ``<|call|>``::

    <|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant<|channel|>commentary
    to=functions.calculator <|constrain|>json<|message|>{"expression": "2+3"}<|call|>

(a completion continues a prompt that ends in ``<|start|>assistant``). The ``tools``
environment reads it as the ``harmony`` call format
(:data:`jaxrl_llm.envs.tools.CALL_FORMATS`). Pure string code: it imports nothing.
"""

from __future__ import annotations

import json
import re

START, MESSAGE, END, CALL, RETURN = "<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"
_MARKS = re.compile(r"(<\|start\|>|<\|message\|>|<\|end\|>|<\|call\|>|<\|return\|>)")
_RECIPIENT = re.compile(r"to=functions\.([A-Za-z_][\w.-]*)")

#: How a system prompt shows a call.
CALL_EXAMPLE = (
    f'{START}assistant to=functions.NAME<|channel|>commentary json{MESSAGE}{{"key": ...}}{CALL}'
)


def parse_tool_call(text: str, *, max_scan: int, max_call: int) -> tuple[str, dict] | str | None:
    """The first harmony tool call in ``text``: ``(name, arguments)``; an error message when
    its body is not a JSON object (or longer than ``max_call`` characters); None when no
    message is addressed to a function. A call's body ends at its end mark (``<|call|>``), or
    at the end of the text when the sampler stopped on ``<|call|>`` and left it out. Linear in
    the text, of which it reads at most ``max_scan`` characters."""
    text = text[:max_scan]
    header_start, body_start, recipient = 0, None, None
    for m in _MARKS.finditer(text):
        mark = m.group(0)
        if mark == START:
            header_start, body_start, recipient = m.end(), None, None
        elif mark == MESSAGE and body_start is None:
            to = _RECIPIENT.search(text, header_start, m.start())
            recipient = None if to is None else to.group(1)
            body_start = m.end()
        elif mark != MESSAGE and body_start is not None:  # the message's end mark
            if recipient is not None:
                return _arguments(recipient, text[body_start : m.start()], max_call)
            header_start, body_start = m.end(), None
    if recipient is not None and body_start is not None:
        return _arguments(recipient, text[body_start:], max_call)
    return None


def _arguments(name: str, body: str, max_call: int) -> tuple[str, dict] | str:
    body = body.strip()
    if len(body) > max_call:
        return f"error: the tool call is longer than {max_call} characters"
    try:
        args = json.loads(body or "{}")
    except (ValueError, RecursionError):
        return "error: the tool call's arguments are not a JSON object"
    if not isinstance(args, dict):
        return "error: the tool call's arguments are not a JSON object"
    return name, args

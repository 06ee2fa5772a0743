"""Response objects of the OpenAI-compatible routes: one choice's fields from one sample.

The shapes follow the ``openai`` SDK's types (``ChatCompletion``, ``ChatCompletionChunk``,
``Completion``; https://platform.openai.com/docs/api-reference/chat/object), plus vLLM's
token ids when asked (``prompt_token_ids``; a choice's ``token_ids``: every token the engine
drew for it, the stop token included, cut after the token that completed a stop string).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.serve.openai.generation import Sample
from jaxrl_llm.serve.openai.wire import cut_at_stop, token_text, tool_calls


@dataclasses.dataclass(frozen=True)
class Shaping:
    """What a request asked of its choices' shape.

    ``stops``: stop strings; ``logprobs``: include log-probs (``top`` alternatives per token);
    ``token_ids``: vLLM's ``return_token_ids``; ``call_format``: parse tool calls in that
    format (None: leave the text as it is).
    """

    tokenizer: Any
    stops: tuple[str, ...] = ()
    logprobs: bool = False
    top: int = 0
    token_ids: bool = False
    call_format: str | None = None

    @property
    def buffered(self) -> bool:
        """A stream must wait for a choice's end (a stop string may cut it, a tool call is
        parsed whole, top log-probs come from a forward after the end)."""
        return bool(self.stops) or self.call_format is not None or self.top > 0


@dataclasses.dataclass
class Cut:
    """A sample as the client sees it: its tokens (cut at a stop string), text, finish."""

    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    text: str
    finish_reason: str


def cut(sample: Sample, shaping: Shaping) -> Cut:
    """``sample`` cut at the first stop string; finish_reason ``stop`` (a stop token or
    string) or ``length``."""
    k, text, stopped = cut_at_stop(shaping.tokenizer, sample.tokens, list(shaping.stops))
    finish = "stop" if stopped or sample.finished else "length"
    top = sample.top[:k] if sample.top is not None else None
    return Cut(sample.tokens[:k], sample.logprobs[:k], top, text, finish)


def _entry(tok: Any, token: int, logprob: float) -> dict[str, Any]:
    text = token_text(tok, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    shaping: Shaping, tokens: list[int], logprobs: list[float], top: list | None
) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    tok = shaping.tokenizer
    content = []
    for t, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        alts = top[t] if top is not None else []
        content.append(
            _entry(tok, token, lp) | {"top_logprobs": [_entry(tok, i, v) for i, v in alts]}
        )
    return {"content": content, "refusal": None}


def chat_choice(index: int, c: Cut, shaping: Shaping) -> dict[str, Any]:
    """One ``ChatCompletion`` choice of a :func:`cut` sample (tool calls parsed out of the text
    when asked)."""
    content: str | None = c.text
    message: dict[str, Any] = {"role": "assistant", "content": content}
    finish = c.finish_reason
    if shaping.call_format is not None:
        content, calls = tool_calls(c.text, shaping.call_format)
        message["content"] = content
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls"
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
    choice["logprobs"] = (
        chat_logprobs(shaping, c.tokens, c.logprobs, c.top) if shaping.logprobs else None
    )
    if shaping.token_ids:
        choice["token_ids"] = c.tokens
    return choice


def completion_logprobs(
    shaping: Shaping, tokens: list[int], logprobs: list[float], top: list | None, offset: int
) -> dict[str, Any]:
    """A completions choice's ``logprobs`` (the legacy shape: parallel lists)."""
    tok = shaping.tokenizer
    texts = [token_text(tok, t) for t in tokens]
    offsets, at = [], offset
    for s in texts:
        offsets.append(at)
        at += len(s)
    return {
        "tokens": texts,
        "token_logprobs": list(logprobs),
        "top_logprobs": [{token_text(tok, i): v for i, v in alts} for alts in top]
        if top is not None
        else None,
        "text_offset": offsets,
    }


def completion_choice(index: int, c: Cut, shaping: Shaping) -> dict[str, Any]:
    """One ``Completion`` choice of a :func:`cut` sample."""
    choice: dict[str, Any] = {"index": index, "text": c.text, "finish_reason": c.finish_reason}
    choice["logprobs"] = (
        completion_logprobs(shaping, c.tokens, c.logprobs, c.top, 0) if shaping.logprobs else None
    )
    if shaping.token_ids:
        choice["token_ids"] = c.tokens
    return choice


def usage(prompts: list[list[int]], choices_tokens: list[int]) -> dict[str, int]:
    """``usage``: prompt tokens (each prompt once, however many samples) and completion
    tokens (every choice's, as cut)."""
    p, c = sum(len(x) for x in prompts), sum(choices_tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

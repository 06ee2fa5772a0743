"""Request bodies of the OpenAI-compatible routes (pydantic), with vLLM's token-level extras.

The fields follow OpenAI's API reference (https://platform.openai.com/docs/api-reference/chat
and .../completions). vLLM's extensions that RL clients use to stay token-exact are accepted
under vLLM's names (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html):
``return_token_ids`` (the response then carries ``prompt_token_ids`` and each choice's
``token_ids``), ``stop_token_ids``, ``top_k``, ``min_p``; a completions ``prompt`` may be token
ids. Fields the engine cannot honour (penalties, ``logit_bias``, a forced tool) are refused
with one sentence rather than silently ignored; fields that change nothing here (``user``,
``metadata``, ``store``) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Sampling(_Body):
    """The sampling fields both routes share."""

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, lt=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False


class ChatRequest(Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(Sampling):
    """``POST /v1/completions``: ``prompt`` as text, token ids, or a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None


#: Roles a chat message may have.
ROLES = ("system", "developer", "user", "assistant", "tool")
#: ``tool_choice`` values the engine honours (no constrained decoding: none or auto).
TOOL_CHOICES = (None, "none", "auto")
FinishReason = Literal["stop", "length", "tool_calls"]

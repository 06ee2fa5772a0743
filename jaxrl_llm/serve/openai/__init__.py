"""An OpenAI-compatible, token-in/token-out endpoint on the paged engine:
``jaxrl-llm serve openai --model MODEL``.

Routes (:mod:`.routes`): ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions``, plain or streamed, with ``n``, ``temperature``, ``top_p``,
``max_tokens`` / ``max_completion_tokens``, ``stop`` (strings) and ``stop_token_ids``,
``seed``, ``logprobs`` / ``top_logprobs``, tools (rendered by the chat template, calls parsed
in the family's format into ``tool_calls``; ``tool_choice`` none or auto), and vLLM's
``return_token_ids`` (``prompt_token_ids`` and each choice's ``token_ids``: the exact ids the
engine drew, for RL clients that must not re-tokenise). Concurrent requests are decoded
together, joining the engine at chunk boundaries (:mod:`.generation`).

Log-probs are the behaviour log-probs the engine recorded, log softmax(z / τ)[token] at the
request's temperature (τ = 1 when greedy): what the trainer's
``jaxrl_llm.ops.token_logprobs(..., temperature=τ)`` gives for the same tokens.

Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, which the
``openai`` SDK turns into its exception classes (404 ``NotFoundError`` for an unknown model,
400 ``BadRequestError`` for a prompt over the context length, with the numbers).

Example::

    jaxrl-llm serve openai --model smollm2-135m-instruct --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.chat.completions.create(model="smollm2-135m-instruct",
                                   messages=[{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

from jaxrl_llm.envs.tools import CALL_FORMATS
from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.serve.openai.agent import (
    AgentOutcome,
    AgentRunner,
    Segment,
    check_rewards,
    load_agent,
    segments,
)
from jaxrl_llm.serve.openai.generation import Generator, Job, Sample, top_logprobs
from jaxrl_llm.serve.openai.routes import OpenAIRoutes
from jaxrl_llm.serve.openai.turns import EPISODE_HEADER, Turn, TurnRecorder
from jaxrl_llm.serve.openai.wire import call_format_for, cut_at_stop, tool_calls
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import Protocol

__all__ = [
    "EPISODE_HEADER",
    "AgentOutcome",
    "AgentRunner",
    "Endpoint",
    "Segment",
    "Turn",
    "TurnRecorder",
    "check_rewards",
    "endpoint",
    "load_agent",
    "segments",
    "Generator",
    "Job",
    "OpenAIRoutes",
    "Sample",
    "add_arguments",
    "build",
    "call_format_for",
    "cut_at_stop",
    "error_body",
    "protocol",
    "tool_calls",
    "top_logprobs",
]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The endpoint's own flags (``jaxrl-llm serve openai --help``)."""
    parser.add_argument("--max-len", type=int, default=2048, help="prompt + reply (default 2048)")
    parser.add_argument("--max-tokens", type=int, default=512, help="longest reply (default 512)")
    parser.add_argument("--num-slots", type=int, default=16, help="rows decoded together (16)")
    parser.add_argument("--page-size", type=int, default=16, help="KV-cache page size (16)")
    parser.add_argument("--chunk-steps", type=int, default=16, help="decode steps per chunk (16)")
    parser.add_argument("--dtype", default=None, help="float32 (default) or bfloat16")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the server (0)")
    parser.add_argument(
        "--tool-call-format",
        default=None,
        help="hermes, gemma4 or harmony (default: the model family's)",
    )


class Endpoint(NamedTuple):
    """The endpoint's parts: the protocol to serve, its generator (``swap`` new weights), its
    routes, and the turn recorder (None unless asked for)."""

    protocol: Protocol
    generator: Generator
    routes: OpenAIRoutes
    recorder: TurnRecorder | None


def endpoint(
    model: ServedModel,
    loop,
    *,
    max_len: int = 2048,
    max_tokens: int = 512,
    num_slots: int = 16,
    page_size: int = 16,
    chunk_steps: int = 16,
    dtype: str | None = None,
    seed: int = 0,
    tool_call_format: str | None = None,
    record_turns: bool = False,
) -> Endpoint:
    """The endpoint over ``model``, its device work on ``loop`` (an
    :class:`~jaxrl_llm.serve.EngineLoop`). ``max_len`` is clamped to the model's
    ``max_position_embeddings``; ``max_tokens`` to ``max_len``; ``record_turns`` records the
    requests that name an episode (:mod:`.turns`)."""
    fmt = tool_call_format or call_format_for(model.config)
    if fmt not in CALL_FORMATS:
        raise ConfigError(
            f"--tool-call-format {fmt!r} is not one of {', '.join(CALL_FORMATS)}"
            f"{did_you_mean(fmt, CALL_FORMATS)}"
        )
    max_len = min(int(max_len), int(model.config.rope.max_position_embeddings))
    gen = Generator(
        model.params,
        model.config,
        loop,
        seed=seed,
        num_slots=num_slots,
        page_size=page_size,
        max_len=max_len,
        gen_len=min(int(max_tokens), max_len - 1),
        chunk_steps=chunk_steps,
        dtype=dtype,
    )
    recorder = TurnRecorder() if record_turns else None
    routes = OpenAIRoutes(model, gen, fmt, recorder)
    proto = Protocol("openai", routes.router, prefix="/v1/", error_body=error_body)
    return Endpoint(proto, gen, routes, recorder)


def protocol(model: ServedModel, loop, **kw: Any) -> Protocol:
    """:func:`endpoint`'s protocol alone (what ``jaxrl-llm serve openai`` serves)."""
    return endpoint(model, loop, **kw).protocol


def build(args: argparse.Namespace, model: ServedModel, loop) -> Protocol:
    """``jaxrl-llm serve openai``'s protocol from its parsed flags."""
    return protocol(
        model,
        loop,
        max_len=args.max_len,
        max_tokens=args.max_tokens,
        num_slots=args.num_slots,
        page_size=args.page_size,
        chunk_steps=args.chunk_steps,
        dtype=args.dtype,
        seed=args.seed,
        tool_call_format=args.tool_call_format,
    )

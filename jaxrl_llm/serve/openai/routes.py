"""The routes of the OpenAI-compatible endpoint: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, plain or streamed (server-sent events, ``data: [DONE]`` last).

A stream sends each choice's new tokens after every decode chunk of the engine (chunk
granularity). A choice whose text a later token could still change is held until it ends:
with stop strings (a stop string may cut what was sent), tools (a call is parsed whole) or
top log-probs (computed after the end); it then arrives as one delta.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import fastapi
from fastapi.responses import StreamingResponse

from jaxrl_llm.serve.openai.generation import Generator, Job, Sample
from jaxrl_llm.serve.openai.schema import ChatRequest, CompletionRequest, Sampling
from jaxrl_llm.serve.openai.shapes import (
    Cut,
    Shaping,
    chat_choice,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    cut,
    usage,
)
from jaxrl_llm.serve.openai.turns import EPISODE_HEADER, Turn, TurnRecorder
from jaxrl_llm.serve.openai.wire import (
    chat_prompt,
    check_messages,
    check_tools,
    decode,
    sampling_config,
    stop_strings,
)
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import ServeError

#: A streamed choice's piece: ``(index, tokens, logprobs, text, cut or None) -> choice dict``.
Piece = Callable[[int, list[int], list[float], str, Cut | None], dict[str, Any]]


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _to_queue(aloop: asyncio.AbstractEventLoop, queue: asyncio.Queue, base: int):
    """A job's ``on_progress``: put ``("progress", choice index, tokens, logprobs)`` on the
    route's queue from the engine thread."""

    def put(i: int, tokens: list[int], logprobs: list[float]) -> None:
        aloop.call_soon_threadsafe(queue.put_nowait, ("progress", base + i, tokens, logprobs))

    return put


def _done_to_queue(aloop: asyncio.AbstractEventLoop, queue: asyncio.Queue, j: int):
    """A job future's done callback: put ``("done", job index, future)`` on the queue."""

    def put(fut: Any) -> None:
        aloop.call_soon_threadsafe(queue.put_nowait, ("done", j, fut))

    return put


class OpenAIRoutes:
    """The endpoint's routes over one :class:`~jaxrl_llm.serve.served.ServedModel`.

    Args:
      model: the served model (its ``name`` is the only model a request may name).
      generator: the :class:`~jaxrl_llm.serve.openai.generation.Generator` that decodes.
      call_format: how the model writes tool calls (a ``CALL_FORMATS`` name).
      recorder: records the turns of requests that name their episode
        (:data:`~jaxrl_llm.serve.openai.turns.EPISODE_HEADER`); None: nothing is recorded.
    """

    def __init__(
        self,
        model: ServedModel,
        generator: Generator,
        call_format: str,
        recorder: TurnRecorder | None = None,
    ):
        self.model, self.gen, self.call_format = model, generator, call_format
        self.recorder = recorder
        self.tok = model.tokenizer
        self.router = fastapi.APIRouter()
        self.router.add_api_route("/v1/models", self.models, methods=["GET"])
        self.router.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])
        self.router.add_api_route("/v1/completions", self.completions, methods=["POST"])

    # ----- checks -------------------------------------------------------------------------------

    def _check_model(self, name: str) -> None:
        if name != self.model.name:
            raise ServeError(
                404, f"The model {name!r} does not exist; this server serves {self.model.name!r}."
            )

    def _record(self, job: Job, cuts: list[Cut], samples: list[Sample]) -> None:
        """Each choice of ``job`` as a turn of its episode (when it names one)."""
        if self.recorder is None or job.episode is None:
            return
        for c, s in zip(cuts, samples, strict=True):
            turn = Turn(
                job.prompt, c.tokens, c.logprobs, s.versions[: len(c.tokens)], c.finish_reason
            )
            self.recorder.record(job.episode, turn)

    def _job(
        self,
        prompt: list[int],
        req: Sampling,
        max_tokens: int | None,
        top: int,
        episode: str | None = None,
    ) -> Job:
        """The engine job of one prompt, after the context-length and size checks (400s)."""
        p, ctx, gen = len(prompt), self.gen.max_len, self.gen.gen_len
        if p == 0:
            raise ServeError(400, "the prompt is empty")
        if p >= ctx:
            raise ServeError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your prompt "
                f"has {p} tokens. Please reduce the length of the messages or prompt.",
            )
        m = min(gen, ctx - p) if max_tokens is None else int(max_tokens)
        if self.gen.forced is not None:  # a training run's endpoint: its budget, not a 400
            m = min(m, gen)
        if m > gen:
            raise ServeError(
                400, f"max_tokens is {m}, more than this server's limit of {gen} tokens per reply"
            )
        if p + m > ctx:
            raise ServeError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{p + m} tokens ({p} in the prompt, {m} in the completion). Please reduce the "
                "length of the messages or completion.",
            )
        if req.n > self.gen.num_slots:
            raise ServeError(400, f"n is {req.n}; this server decodes at most {self.gen.num_slots}")
        return Job(
            prompt,
            req.n,
            m,
            self.gen.forced or sampling_config(req),
            prompt_id=None if req.seed is None else req.seed % 2**31,
            top_logprobs=top,
            episode=episode,
        )

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": f"{kind}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.model.name,
        }

    # ----- routes -------------------------------------------------------------------------------

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the one model served."""
        entry = {
            "id": self.model.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "jaxrl_llm",
            "max_model_len": self.gen.max_len,
        }
        return {"object": "list", "data": [entry]}

    async def chat(self, req: ChatRequest, request: fastapi.Request) -> Any:
        """``POST /v1/chat/completions``."""
        self._check_model(req.model)
        messages = check_messages(req.messages)
        tools = check_tools(req.tools, req.tool_choice)
        prompt = chat_prompt(self.tok, messages, tools)
        top = (req.top_logprobs or 0) if req.logprobs else 0
        episode = request.headers.get(EPISODE_HEADER)
        job = self._job(prompt, req, req.max_completion_tokens or req.max_tokens, top, episode)
        shaping = Shaping(
            self.tok,
            tuple(stop_strings(req)),
            logprobs=req.logprobs,
            top=top,
            token_ids=req.return_token_ids,
            call_format=self.call_format if tools and req.tool_choice != "none" else None,
        )
        head = self._head("chatcmpl") | {"object": "chat.completion"}
        if req.stream:
            return self._stream_chat(job, shaping, head, req)
        samples = await asyncio.wrap_future(self.gen.submit(job))
        cuts = [cut(s, shaping) for s in samples]
        self._record(job, cuts, samples)
        body = head | {
            "choices": [chat_choice(i, c, shaping) for i, c in enumerate(cuts)],
            "usage": usage([prompt], [len(c.tokens) for c in cuts]),
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt
        return body

    def _prompts(self, prompt: Any) -> list[list[int]]:
        """A completions ``prompt`` as token id lists (text gets the tokenizer's special tokens,
        e.g. BOS, as vLLM does)."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise ServeError(400, "prompt is empty")
        out = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                if self.tok is None:
                    raise ServeError(400, "this model has no tokenizer; send token ids")
                ids = [int(t) for t in self.tok(p)["input_ids"]]
            else:
                ids = [int(t) for t in p]
                bad = [t for t in ids if not 0 <= t < self.model.config.vocab_size]
                if bad:
                    raise ServeError(
                        400,
                        f"prompt {i} has token id {bad[0]}, outside the vocabulary "
                        f"(0..{self.model.config.vocab_size - 1})",
                    )
            out.append(ids)
        return out

    async def completions(self, req: CompletionRequest, request: fastapi.Request) -> Any:
        """``POST /v1/completions``: one job per prompt, choices prompt-major."""
        self._check_model(req.model)
        if req.echo or req.suffix:
            raise ServeError(400, "echo and suffix are not served")
        prompts = self._prompts(req.prompt)
        top = req.logprobs or 0
        episode = request.headers.get(EPISODE_HEADER)
        jobs = [self._job(p, req, req.max_tokens or 16, top, episode) for p in prompts]
        shaping = Shaping(
            self.tok,
            tuple(stop_strings(req)),
            logprobs=req.logprobs is not None,
            top=top,
            token_ids=req.return_token_ids,
        )
        head = self._head("cmpl") | {"object": "text_completion"}
        if req.stream:
            return self._stream_completions(jobs, shaping, head, req)
        results = await asyncio.gather(*(asyncio.wrap_future(self.gen.submit(j)) for j in jobs))
        cuts = [cut(s, shaping) for samples in results for s in samples]
        for j, (job, samples) in enumerate(zip(jobs, results, strict=True)):
            self._record(job, cuts[j * req.n : (j + 1) * req.n], samples)
        choices = [completion_choice(i, c, shaping) for i, c in enumerate(cuts)]
        if req.return_token_ids:
            for i, ch in enumerate(choices):
                ch["prompt_token_ids"] = prompts[i // req.n]
        return head | {"choices": choices, "usage": usage(prompts, [len(c.tokens) for c in cuts])}

    # ----- streaming ----------------------------------------------------------------------------

    def _stream_chat(self, job: Job, shaping: Shaping, head: dict, req: ChatRequest) -> Any:
        head = head | {"object": "chat.completion.chunk"}

        def piece(i, tokens, logprobs, text, c):
            delta: dict[str, Any] = {"content": text}
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None}
            if c is not None:
                choice["finish_reason"] = c.finish_reason
                if shaping.call_format is not None:
                    full = chat_choice(i, c, shaping)
                    delta["content"] = full["message"]["content"]
                    if full["message"].get("tool_calls"):
                        calls = full["message"]["tool_calls"]
                        delta["tool_calls"] = [{"index": k} | t for k, t in enumerate(calls)]
                    choice["finish_reason"] = full["finish_reason"]
            top = c.top[-len(tokens) :] if c is not None and c.top is not None and tokens else None
            choice["logprobs"] = (
                chat_logprobs(shaping, tokens, logprobs, top) if shaping.logprobs else None
            )
            if shaping.token_ids:
                choice["token_ids"] = tokens
            return choice

        first = head | {
            "choices": [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(job.n)
            ]
        }
        if shaping.token_ids:
            first["prompt_token_ids"] = job.prompt
        return self._respond([job], shaping, head, first, piece, req)

    def _stream_completions(self, jobs: list[Job], shaping: Shaping, head: dict, req) -> Any:
        def piece(i, tokens, logprobs, text, c):
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": None}
            if c is not None:
                choice["finish_reason"] = c.finish_reason
            top = c.top[-len(tokens) :] if c is not None and c.top is not None and tokens else None
            choice["logprobs"] = (
                completion_logprobs(shaping, tokens, logprobs, top, 0) if shaping.logprobs else None
            )
            if shaping.token_ids:
                choice["token_ids"] = tokens
            return choice

        return self._respond(jobs, shaping, head, None, piece, req)

    def _respond(self, jobs, shaping, head, first, piece: Piece, req: Sampling) -> Any:
        opts = req.stream_options or {}
        events = self._events(jobs, shaping, head, first, piece, bool(opts.get("include_usage")))
        return StreamingResponse(events, media_type="text/event-stream")

    async def _events(
        self, jobs: list[Job], shaping: Shaping, head, first, piece: Piece, include_usage: bool
    ) -> AsyncIterator[str]:
        aloop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        n = jobs[0].n
        for j, job in enumerate(jobs):
            if not shaping.buffered:
                job.on_progress = _to_queue(aloop, queue, j * n)
            self.gen.submit(job).add_done_callback(_done_to_queue(aloop, queue, j))
        if first is not None:
            yield _sse(first)
        sent_tok, sent_text = [0] * (n * len(jobs)), [""] * (n * len(jobs))
        counts, left = [0] * (n * len(jobs)), len(jobs)
        while left:
            msg = await queue.get()
            if msg[0] == "progress":
                _, k, toks, lps = msg
                text = decode(self.tok, toks).rstrip("\ufffd")  # a character not yet whole
                if len(toks) > sent_tok[k] and text.startswith(sent_text[k]):
                    new = piece(
                        k, toks[sent_tok[k] :], lps[sent_tok[k] :], text[len(sent_text[k]) :], None
                    )
                    sent_tok[k], sent_text[k] = len(toks), text
                    yield _sse(head | {"choices": [new]})
                continue
            _, j, fut = msg
            left -= 1
            try:
                samples = fut.result()
            except Exception as e:  # noqa: BLE001 - the stream is open: the error is an event
                message = e.message if isinstance(e, ServeError) else f"{type(e).__name__}: {e}"
                yield _sse({"error": {"message": message, "type": "server_error", "code": 500}})
                break
            job_cuts = [cut(s, shaping) for s in samples]
            self._record(jobs[j], job_cuts, samples)
            for i, c in enumerate(job_cuts):
                k = j * n + i
                rest = c.text[len(sent_text[k]) :] if c.text.startswith(sent_text[k]) else c.text
                counts[k] = len(c.tokens)
                yield _sse(
                    head
                    | {
                        "choices": [
                            piece(k, c.tokens[sent_tok[k] :], c.logprobs[sent_tok[k] :], rest, c)
                        ]
                    }
                )
        if include_usage:
            yield _sse(head | {"choices": [], "usage": usage([jb.prompt for jb in jobs], counts)})
        yield "data: [DONE]\n\n"

"""Agents written against the ``openai`` SDK, run against the endpoint with every request
recorded as a turn, and their turns merged back into token-exact training segments.

An agent is ``run(client, model, row) -> reward`` (sync, given an ``openai.OpenAI``; or
``async``, given an ``openai.AsyncOpenAI``), e.g. a tool loop; it returns a number or a dict of
numbers (named rewards). :class:`AgentRunner` runs it once per episode with a client whose
requests carry the episode's id (:data:`~jaxrl_llm.serve.openai.turns.EPISODE_HEADER`), on a
user-code thread (:mod:`jaxrl_llm.rewards.user_code`: an agent that raises, exits or passes
its timeout costs its episode, never the caller), and returns its rewards with the turns the
endpoint recorded. An agent that makes no request, returns no reward or a non-number fails its
episode with one sentence.

:func:`segments` turns an episode's turns into training segments without re-tokenising: a
turn whose prompt starts with the previous segment's tokens (prompt, policy tokens, the
template's tokens between them) extends that segment, the tokens between marked as not the
policy's (mask 0); any other turn (the agent rewrote or compacted its context, or the
template's rendering of the reply is not the sampled ids) starts a new segment. Each segment
is a prompt and a completion whose policy tokens are exactly the ids the endpoint returned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import math
import numbers
import uuid
from collections.abc import Callable
from typing import Any

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards.user_code import shared_runner
from jaxrl_llm.serve.openai.turns import EPISODE_HEADER, Turn, TurnRecorder

#: ``run(client, model, row) -> number | {name: number}`` (or a coroutine function).
Agent = Callable[[Any, str, dict], Any]


def load_agent(spec: str) -> Agent:
    """The function ``module:name`` names; a :class:`ConfigError` naming ``env.kwargs.agent``
    when it cannot be imported or is not callable."""
    module_name, _, attr = str(spec).partition(":")
    if not module_name or not attr:
        raise ConfigError(f"env.kwargs.agent: write module:function, got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"env.kwargs.agent: cannot import {spec!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(f"env.kwargs.agent: {spec!r} is not a function")
    return fn


def check_rewards(value: Any) -> dict[str, float]:
    """An agent's return value as named rewards (a number is ``{"reward": x}``); ValueError
    with one sentence for anything else (None, a string, a bool, a non-finite number)."""

    def number(x: Any, what: str) -> float:
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ValueError(f"{what} is {type(x).__name__} {x!r}, not a number")
        if not math.isfinite(float(x)):
            raise ValueError(f"{what} is {x}, not a finite number")
        return float(x)

    if value is None:
        raise ValueError("the agent returned no reward (return a number or a dict of numbers)")
    if isinstance(value, dict):
        if not value:
            raise ValueError("the agent returned an empty dict of rewards")
        return {str(k): number(v, f"reward {k!r}") for k, v in value.items()}
    return {"reward": number(value, "the agent's reward")}


@dataclasses.dataclass
class AgentOutcome:
    """One episode of an agent: its rewards (None when it failed), the turns the endpoint
    recorded for it, why it failed (``error``) and whether it passed its timeout."""

    rewards: dict[str, float] | None
    turns: list[Turn]
    error: str | None = None
    timed_out: bool = False


class AgentRunner:
    """Runs an agent's episodes against an OpenAI-compatible endpoint that records turns.

    Args:
      agent: the agent function (see the module doc).
      base_url: the endpoint (``http://127.0.0.1:PORT/v1``).
      model: the model name the endpoint serves (passed to the agent).
      recorder: the endpoint's :class:`~jaxrl_llm.serve.openai.turns.TurnRecorder`.
      api_key: the endpoint's key (any string when it has none).
      timeout_s: seconds one episode may take.
    """

    def __init__(
        self,
        agent: Agent,
        base_url: str,
        model: str,
        recorder: TurnRecorder,
        *,
        api_key: str = "none",
        timeout_s: float | None = 600.0,
    ):
        self.agent, self.base_url, self.model = agent, base_url, model
        self.recorder, self.api_key, self.timeout_s = recorder, api_key, timeout_s

    def _episode(self, episode: str, row: dict) -> dict[str, float]:
        import openai  # the `openai` extra

        headers = {EPISODE_HEADER: episode}
        url, key = self.base_url, self.api_key
        if inspect.iscoroutinefunction(self.agent):

            async def go() -> Any:
                async with openai.AsyncOpenAI(
                    base_url=url, api_key=key, default_headers=headers, max_retries=0
                ) as client:
                    return await self.agent(client, self.model, row)

            value = asyncio.run(go())
        else:
            with openai.OpenAI(
                base_url=url, api_key=key, default_headers=headers, max_retries=0
            ) as client:
                value = self.agent(client, self.model, row)
        return check_rewards(value)

    def run(self, rows: list[dict]) -> list[AgentOutcome]:
        """One episode per row, all at once (their requests are decoded together); outcomes
        in row order."""
        runner = shared_runner("agent", max_workers=64)
        ids = [f"ep-{uuid.uuid4().hex}" for _ in rows]
        pending = [
            runner.submit(self._episode, e, row, timeout_s=self.timeout_s)
            for e, row in zip(ids, rows, strict=True)
        ]
        out = []
        for e, p in zip(ids, pending, strict=True):
            res = p.result()
            turns = self.recorder.take(e)
            error = res.error
            if error is None and not turns:
                error = "the agent made no request to the client"
            out.append(
                AgentOutcome(res.value if error is None else None, turns, error, res.timed_out)
            )
        return out


@dataclasses.dataclass
class Segment:
    """A prompt and a completion trained as one sequence.

    ``tokens``: the completion side; ``mask`` 1 on the policy's tokens (the ids the endpoint
    returned), 0 on the tokens between turns (the template's end of turn, tool results, the
    next generation prompt); ``logprobs``: behaviour log-probs (0 where mask is 0);
    ``versions``: the weights' version per token (-1 where mask is 0).
    """

    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


def segments(turns: list[Turn]) -> list[Segment]:
    """An episode's turns as token-exact segments (see the module doc), in order."""
    out: list[Segment] = []
    for t in turns:
        seg = out[-1] if out else None
        if seg is not None:
            so_far = seg.prompt + seg.tokens
            if t.prompt_token_ids[: len(so_far)] == so_far:
                gap = t.prompt_token_ids[len(so_far) :]
                seg.tokens += gap
                seg.mask += [0] * len(gap)
                seg.logprobs += [0.0] * len(gap)
                seg.versions += [-1] * len(gap)
            else:
                seg = None
        if seg is None:
            seg = Segment(list(t.prompt_token_ids))
            out.append(seg)
        seg.tokens += t.token_ids
        seg.mask += [1] * len(t.token_ids)
        seg.logprobs += t.logprobs
        seg.versions += t.versions
    return out

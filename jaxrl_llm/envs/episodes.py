"""Multi-turn episodes on the continuous-batching engine, with environment calls running beside
generation.

Every episode is a row of a :class:`~jaxrl_llm.sampling.PagedEngine` kept across turns. The
host loop alternates one engine chunk (all live rows decode) with the environment's answers:
a row whose turn ended is handed to a thread pool (``env.step(text)``) and leaves its slot;
the other rows keep decoding; when the answer arrives, its messages are encoded
(:class:`~jaxrl_llm.envs.chat.ChatCodec`) and appended to the row through its paged KV cache
(:meth:`PagedEngine.extend`, no prefill of the conversation), and the row decodes its next
turn. The host blocks on the pool only when no row is decoding. A group's G episodes whose
openings are equal share one prefill and the prompt's pages.

An episode ends when its environment says ``done``, after ``max_turns`` policy turns, when a
turn ends without a stop token (its per-turn budget), or when the completion side (policy and
environment tokens together) would exceed ``budget`` tokens; the last two count as truncated.
An environment that raises marks its episode invalid (``error``); the episode ends there.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from jaxrl_llm.envs.base import EnvError, check_messages, check_step
from jaxrl_llm.envs.chat import ChatCodec
from jaxrl_llm.sampling import PagedEngine, SamplingConfig


@dataclasses.dataclass
class Episode:
    """One episode: its data row, environment, conversation and outcome.

    Attributes:
      item: the data row given to ``reset``; prompt_id / sample_id: the row key (group, sample).
      env: the environment instance; messages: the conversation so far (opening, assistant
        turns, environment replies).
      row: the engine row id; tokens / mask / logprobs: the completion side after the opening
        (mask 1 = the policy's tokens, 0 = appended environment tokens, log-prob 0).
      opening_ids: the opening's token ids; reward: the summed step rewards; turns: policy
        turns taken; truncated: ended by a budget; error: why the environment failed (None =
        valid); env_s: seconds spent in ``reset``/``step``; info: summed ``Step.info``.
    """

    item: dict
    prompt_id: int
    sample_id: int
    env: Any
    fallback_ids: list[int]
    messages: list[dict] = dataclasses.field(default_factory=list)
    row: int = -1
    opening_ids: list[int] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    truncated: bool = False
    done: bool = False
    error: str | None = None
    env_s: float = 0.0
    info: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def final_text(self) -> str:
        """The policy's last turn (what the reward functions score)."""
        for m in reversed(self.messages):
            if m["role"] == "assistant":
                return m["content"]
        return ""


def _timed(fn: Callable, *args):
    t = time.perf_counter()
    try:
        return fn(*args), None, time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - an environment failure marks its episode invalid
        return None, e, time.perf_counter() - t


def run_episodes(
    params,
    model_config,
    episodes: list[Episode],
    *,
    codec: ChatCodec,
    sampling: SamplingConfig,
    seed: int,
    group_size: int,
    max_turns: int,
    turn_tokens: int,
    budget: int,
    workers: int = 8,
    num_slots: int | None = None,
    page_size: int = 16,
    chunk_steps: int = 8,
    dtype: str | None = None,
) -> dict[str, float]:
    """Play ``episodes`` (groups of ``group_size`` consecutive episodes of one prompt) to their
    end, in place; returns timing and engine metrics. See the module docstring."""
    stats: dict[str, float] = collections.defaultdict(float)
    t_start = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env") as pool:
        for ep, (msgs, err, dt) in zip(
            episodes, pool.map(lambda e: _timed(e.env.reset, e.item), episodes), strict=True
        ):
            ep.env_s += dt
            try:
                if err is not None:
                    raise err
                ep.messages = check_messages(msgs, "reset")
                ep.opening_ids = codec.opening(ep.messages)
            except Exception as e:  # noqa: BLE001
                _fail(ep, e)
        width = max(len(ep.opening_ids or ep.fallback_ids) for ep in episodes)
        n = len(episodes)
        engine = PagedEngine(
            params,
            model_config,
            sampling=sampling,
            seed=seed,
            num_slots=max(min(num_slots or n, n), group_size),
            page_size=page_size,
            max_len=width + budget,
            gen_len=turn_tokens,
            num_pages=n * -(-(width + budget) // page_size) + 1,  # kept rows wait on their env
            chunk_steps=chunk_steps,
            dtype=dtype,
        )
        by_row = _submit(engine, episodes, group_size, min(turn_tokens, budget))
        pending: dict[cf.Future, Episode] = {}
        while engine.busy or pending:
            if engine.busy:
                for r in engine.step():
                    ep = by_row[r]
                    if _turn_ended(ep, engine, codec):
                        pending[pool.submit(_timed, ep.env.step, ep.messages[-1]["content"])] = ep
                    elif ep.done:
                        engine.release(ep.row)
            ready = [f for f in pending if f.done()]
            if not ready and pending and not engine.busy:
                t = time.perf_counter()
                ready = list(cf.wait(pending, return_when=cf.FIRST_COMPLETED).done)
                stats["idle_s"] += time.perf_counter() - t
            for f in ready:
                ep = pending.pop(f)
                _answer(ep, f.result(), engine, codec, max_turns, turn_tokens, budget)
                if ep.done:
                    engine.release(ep.row)
        for ep in episodes:
            row = engine.rows[ep.row]
            ep.tokens, ep.mask, ep.logprobs = row.tokens, row.mask, row.logprobs
    stats["wall_s"] = time.perf_counter() - t_start
    stats["chunks"] = engine.stats["chunks"]
    return dict(stats)


def _fail(ep: Episode, e: BaseException) -> None:
    if isinstance(e, EnvError) and "not jaxrl_llm.envs.Step" in str(e):
        raise e  # a broken contract is a programming error, not a flaky episode
    ep.error = f"{type(e).__name__}: {e}"
    ep.done = True


def _submit(engine: PagedEngine, episodes: list[Episode], g: int, first: int) -> dict:
    """Queue every episode's first turn: a group with one opening shares its prefill."""
    by_row = {}
    for i in range(0, len(episodes), g):
        group = episodes[i : i + g]
        ok = all(ep.error is None for ep in group)
        if ok and all(ep.opening_ids == group[0].opening_ids for ep in group):
            rows = engine.submit(
                group[0].opening_ids,
                prompt_id=group[0].prompt_id,
                num_samples=len(group),
                max_new_tokens=first,
                keep=True,
            )
        else:
            rows = []
            for ep in group:
                ids = ep.opening_ids if ep.error is None else ep.fallback_ids
                rows += engine.submit(
                    ids,
                    prompt_id=ep.prompt_id,
                    num_samples=1,
                    max_new_tokens=first if ep.error is None else 1,
                    keep=ep.error is None,
                    first_sample=ep.sample_id,
                )
        for ep, r in zip(group, rows, strict=True):
            ep.row = r
            by_row[r] = ep
    return by_row


def _turn_ended(ep: Episode, engine, codec: ChatCodec) -> bool:
    """Record a finished policy turn; True when the environment should answer it."""
    row = engine.rows[ep.row]
    if ep.error is not None:  # the placeholder row of an episode whose reset failed
        return False
    turn = row.tokens[row.turn_start :]
    ep.turns += 1
    ep.messages.append({"role": "assistant", "content": codec.decode(turn)})
    if not row.finished:  # the turn hit its budget without a stop token
        ep.truncated = True
    return True


def _answer(ep, result, engine, codec, max_turns, turn_tokens, budget) -> None:
    """Apply the environment's answer to a turn: end the episode or append its reply."""
    out, err, dt = result
    ep.env_s += dt
    try:
        if err is not None:
            raise err
        step = check_step(out, "env")
    except Exception as e:  # noqa: BLE001
        _fail(ep, e)
        return
    ep.reward += float(step.reward)
    ep.info.update(step.info)
    row = engine.rows[ep.row]
    if step.done or ep.truncated or ep.turns >= max_turns:
        ep.done = True
        return
    try:
        ids = codec.reply(ep.messages, list(step.messages), last_token=row.tokens[-1])
    except Exception as e:  # noqa: BLE001 - a template that cannot continue this episode
        _fail(ep, e)
        return
    room = budget - len(row.tokens) - len(ids)
    if room < 1 or not ids:
        ep.truncated, ep.done = room < 1, True
        return
    ep.messages.extend(step.messages)
    engine.extend(ep.row, ids, max_new_tokens=min(turn_tokens, room))

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
An environment that raises (anything, ``sys.exit`` included), or whose ``reset`` / ``step``
does not answer within ``step_timeout_s``, marks its episode invalid (``error``; a timeout also
sets ``timed_out``); the episode ends there. The calls run on the daemon threads of
:class:`~jaxrl_llm.rewards.user_code.UserCodeRunner`, so nothing an environment does ends or
hangs the run. An opening longer than ``max_opening`` tokens (what the model's context leaves
beside the budget) fails its episode before it is prefilled (``opening_too_long``). A step
whose summed reward is not finite (1e308 + 1e308) fails its episode; numeric ``Step.info``
values are summed into ``info``, the others kept in ``notes`` (for ``samples.jsonl``).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import math
import numbers
import time
from typing import Any

import numpy as np

from jaxrl_llm.envs.base import EnvError, check_messages, check_step
from jaxrl_llm.envs.chat import ChatCodec
from jaxrl_llm.rewards.user_code import CallResult, shared_runner
from jaxrl_llm.sampling import PagedEngine, SamplingConfig

#: The largest float32: episode totals are trained on as float32.
FLOAT32_MAX = 3.4028234663852886e38


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
        valid); env_s: seconds spent in ``reset``/``step``; info: summed numeric
        ``Step.info`` values; notes: the last non-numeric ``Step.info`` value of each key;
        timed_out: a call passed ``step_timeout_s``; opening_too_long: the opening did not fit.
      prompt_routing / routing: with ``record_routing`` (a mixture of experts), the experts
        the engine routed the submitted prompt's tokens and the completion side's tokens to
        (``[len, L, k]`` each; :class:`~jaxrl_llm.sampling.engine.Row`), for routing replay.
      tools: the tool descriptions the chat template renders (``tools=``), or None when the
        environment describes its tools in its own text (:func:`template_tools`).
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
    info: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    timed_out: bool = False
    opening_too_long: bool = False
    prompt_routing: np.ndarray | None = None
    routing: np.ndarray | None = None
    tools: list[dict] | None = None

    @property
    def final_text(self) -> str:
        """The policy's last turn (what the reward functions score)."""
        for m in reversed(self.messages):
            if m["role"] == "assistant":
                return m["content"]
        return ""


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
    step_timeout_s: float | None = None,
    max_opening: int | None = None,
    record_routing: bool = False,
) -> dict[str, float]:
    """Play ``episodes`` (groups of ``group_size`` consecutive episodes of one prompt) to their
    end, in place; returns timing and engine metrics. See the module docstring.

    ``step_timeout_s`` bounds each ``reset`` / ``step`` call (None: no limit);
    ``max_opening`` bounds an opening's tokens (None: ``max_position_embeddings - budget``);
    ``record_routing`` (a mixture of experts) keeps every token's experts
    (:attr:`Episode.prompt_routing`, :attr:`Episode.routing`)."""
    stats: dict[str, float] = collections.defaultdict(float)
    t_start = time.perf_counter()
    pool = shared_runner("env", workers)
    ctx = int(model_config.max_position_embeddings) - budget
    limit = ctx if max_opening is None else min(max_opening, ctx)
    futures = [pool.submit(e.env.reset, e.item, timeout_s=step_timeout_s) for e in episodes]
    for ep, fut in zip(episodes, futures, strict=True):
        _opening(ep, fut.result(), codec, limit)
    _check_resets(episodes)
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
        record_routing=record_routing,
    )
    by_row = _submit(engine, episodes, group_size, min(turn_tokens, budget))
    pending: dict[cf.Future, Episode] = {}
    while engine.busy or pending:
        if engine.busy:
            for r in engine.step():
                ep = by_row[r]
                if _turn_ended(ep, engine, codec):
                    text = ep.messages[-1]["content"]
                    pending[pool.submit(ep.env.step, text, timeout_s=step_timeout_s)] = ep
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
        ep.prompt_routing, ep.routing = row.prompt_routing, row.token_routing()
    stats["wall_s"] = time.perf_counter() - t_start
    stats["chunks"] = engine.stats["chunks"]
    return dict(stats)


def _check_resets(episodes: list[Episode]) -> None:
    """Every episode of the batch failed at ``reset``: the environment cannot start one, and
    nothing would be trained on (a run of such batches would otherwise end "successfully").

    Raises:
      EnvError: naming the count and the first error (unless the run is stopping, whose
        calls are answered ``interrupted``).
    """
    errors = [ep.error for ep in episodes]
    if not errors or any(e is None for e in errors):
        return
    if any("interrupted" in str(e) for e in errors):
        return
    hint = ""
    if any(ep.opening_too_long for ep in episodes):
        hint = (
            "; raise data.max_length, lower rollout.max_new_tokens, or use a model with a "
            "longer context (model.tiny.max_position_embeddings for model.source: tiny)"
        )
    raise EnvError(
        f"every episode failed at reset ({len(errors)} of {len(errors)}); the first: "
        f"{errors[0]}{hint}"
    )


def _fail(ep: Episode, e: BaseException | str) -> None:
    if isinstance(e, EnvError) and "not jaxrl_llm.envs.Step" in str(e):
        raise e  # a broken contract is a programming error, not a flaky episode
    ep.error = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    ep.done = True


def template_tools(
    env: Any, messages: list[dict], codec: ChatCodec
) -> tuple[list[dict] | None, list[dict]]:
    """The tools the chat template renders for an episode and its opening messages.

    An environment that offers ``template_tools`` (the ``tools`` environment) has them rendered
    by the template (``tools=``, as TRL does) when the template writes tool descriptions; its
    own tool text then leaves the opening (``without_tools_text``). Otherwise (no tools, a
    template that ignores them) the messages stay as ``reset`` gave them.

    Raises:
      EnvError: the environment asks for the template (``tools_prompt: template``) and the
        template does not render tools.
    """
    tools = getattr(env, "template_tools", None)
    if not tools:
        return None, messages
    if not codec.renders_tools:
        if getattr(env, "tools_prompt", "auto") == "template":
            raise EnvError(
                "env.kwargs.tools_prompt=template, but the tokenizer's chat template does not "
                "render tools=; use tools_prompt: auto or env"
            )
        return None, messages
    strip = getattr(env, "without_tools_text", None)
    return list(tools), (strip(messages) if callable(strip) else messages)


def _opening(ep: Episode, res: CallResult, codec: ChatCodec, limit: int) -> None:
    """Check and encode the opening ``reset`` returned (or fail the episode)."""
    ep.env_s += res.seconds
    if not res.ok:
        ep.timed_out = res.timed_out
        _fail(ep, f"reset: {res.error}")
        return
    try:
        ep.messages = check_messages(res.value, "reset")
        if not ep.messages:
            raise EnvError("reset returned no messages (an empty opening)")
        ep.tools, ep.messages = template_tools(ep.env, ep.messages, codec)
        ep.opening_ids = codec.opening(ep.messages, tools=ep.tools)
    except Exception as e:  # noqa: BLE001 - a bad opening fails its episode
        _fail(ep, e)
        return
    if len(ep.opening_ids) > limit:
        ep.opening_too_long = True
        _fail(
            ep,
            f"reset: the opening has {len(ep.opening_ids)} tokens, more than the {limit} "
            f"that data.max_length / the model's context leave beside the budget",
        )
        ep.opening_ids = []


def add_info(ep: Episode, info: Any) -> None:
    """Sum the finite numeric values of a ``Step.info`` into ``ep.info``; keep the others
    (strings, lists, non-finite numbers) in ``ep.notes`` (``samples.jsonl``, not metrics)."""
    if not isinstance(info, dict):
        ep.notes["info"] = repr(info)[:300]
        return
    for k, v in info.items():
        key = str(k)
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)):
            ep.info[key] += v if isinstance(v, int) else float(v)  # type: ignore[assignment]
        elif isinstance(v, bool):
            ep.info[key] += int(v)
        else:
            ep.notes[key] = v if isinstance(v, str | int | float) else repr(v)[:300]


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
    ep.env_s += result.seconds
    if not result.ok:
        ep.timed_out = result.timed_out
        _fail(ep, f"step: {result.error}")
        return
    try:
        step = check_step(result.value, "env")
    except Exception as e:  # noqa: BLE001
        _fail(ep, e)
        return
    ep.reward += float(step.reward)
    add_info(ep, step.info)
    if not abs(ep.reward) <= FLOAT32_MAX:  # each turn's is finite; the sum may not be
        _fail(ep, f"step: the episode's summed reward {ep.reward} is not a finite float32")
        return
    row = engine.rows[ep.row]
    if step.done or ep.truncated or ep.turns >= max_turns:
        ep.done = True
        return
    try:
        ids = codec.reply(
            ep.messages, list(step.messages), last_token=row.tokens[-1], tools=ep.tools
        )
    except Exception as e:  # noqa: BLE001 - a template that cannot continue this episode
        _fail(ep, e)
        return
    room = budget - len(row.tokens) - len(ids)
    if room < 1 or not ids:
        ep.truncated, ep.done = room < 1, True
        return
    ep.messages.extend(step.messages)
    engine.extend(ep.row, ids, max_new_tokens=min(turn_tokens, room))

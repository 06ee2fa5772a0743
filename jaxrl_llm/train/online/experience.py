"""The record between rollout and learner: :class:`Experience`, and the buffer they meet in.

An :class:`Experience` is one batch of scored episodes on the host, rows in request order with
the G samples of a prompt consecutive (a group). The rollout side produces it
(:mod:`jaxrl_llm.train.online.rollout`), an algorithm strategy turns it into learner batches
(:mod:`jaxrl_llm.train.online.algorithms`). :class:`ExperienceBuffer` is the seam between the two: a
synchronous run puts one batch and takes it back at once; an asynchronous one
(:mod:`jaxrl_llm.train.online.producer`) lets the rollout side run ahead by at most
``max_staleness`` policy versions.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl_llm.parallel import gather_numbers, gather_strings
from jaxrl_llm.sampling import Rollout


@dataclasses.dataclass(frozen=True)
class Experience:
    """Scored episodes of one step (host numpy), N = prompts × G rows.

    Attributes:
      rollout: the sampler's :class:`~jaxrl_llm.sampling.Rollout` as numpy: completion
        ``tokens``/``mask`` ``[N, M]`` (mask 1 = a token the policy generated), behaviour
        ``logprobs [N, M]``, ``lengths``, ``truncated``, left-padded ``prompt_tokens`` /
        ``prompt_mask [N, P]``, ``prompt_ids`` / ``sample_ids [N]``; with
        ``rollout.routing_replay`` / ``record_routing`` a mixture of experts' ``routing
        [N, P + M, L, k]`` (:attr:`routing`).
      texts: N decoded completions. prompts: N decoded prompts. extras: N data rows' other
        columns (reward function fields).
      rewards: ``[N]`` float32 weighted reward (0 where invalid).
      valid: ``[N]`` bool, every reward function scored the row.
      scores: reward name -> ``[N]`` raw scores of each function (NaN where it failed).
      metrics: the reward set's metrics (per-function means, failures, timing).
      group_size: G.
      policy_version: ``[N]`` int, the optimizer step of the weights that sampled each row.
      context_mask: ``[N, M]`` 1 on every real completion-side token — the policy's and, in a
        multi-turn episode, the environment's (mask 0 in ``rollout.mask``); None = the
        policy's tokens only (single-turn).
      messages: N conversations (multi-turn: opening, turns, environment replies), or None.
      sources: N prompts as the data rows gave them (text or messages), or None.
      token_version: ``[N, M]`` int, the version each sampled token was drawn with (-1
        elsewhere) when generations may change weights midway (``rollout.partial``); None
        otherwise. ``policy_version`` is then each row's oldest.
    """

    rollout: Rollout
    texts: list[str]
    prompts: list[str]
    extras: list[dict[str, Any]]
    rewards: np.ndarray
    valid: np.ndarray
    scores: dict[str, np.ndarray]
    metrics: dict[str, float]
    group_size: int
    policy_version: np.ndarray
    context_mask: np.ndarray | None = None
    messages: list[list[dict]] | None = None
    sources: list[Any] | None = None
    token_version: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def routing(self) -> np.ndarray | None:
        """``[N, P + M, L, k]`` int16 the experts the sampler routed each token of each row
        (prompt, then completion) to in every layer, for rollout routing replay (R3, Ma et
        al. 2025, https://arxiv.org/abs/2510.11370); None when not recorded."""
        routing: Any = self.rollout.routing  # host numpy here
        return routing

    @property
    def num_groups(self) -> int:
        """Number of prompts (groups of G rows)."""
        return len(self.rewards) // self.group_size

    def select_groups(self, keep: np.ndarray) -> Experience:
        """The rows of the groups where ``keep [num_groups]`` is True (order kept)."""
        rows = np.repeat(np.asarray(keep, bool), self.group_size)
        pick = lambda xs: [x for x, k in zip(xs, rows) if k]  # noqa: E731
        return dataclasses.replace(
            self,
            rollout=jax.tree.map(lambda x: x[rows], self.rollout),
            texts=pick(self.texts),
            prompts=pick(self.prompts),
            extras=pick(self.extras),
            rewards=self.rewards[rows],
            valid=self.valid[rows],
            scores={k: v[rows] for k, v in self.scores.items()},
            policy_version=self.policy_version[rows],
            context_mask=None if self.context_mask is None else self.context_mask[rows],
            messages=None if self.messages is None else pick(self.messages),
            sources=None if self.sources is None else pick(self.sources),
            token_version=None if self.token_version is None else self.token_version[rows],
        )


def widen(ro: Rollout, width: int) -> Rollout:
    """``ro`` with its prompts left-padded to ``width`` columns (routing padded with the
    experts 0..k-1: masked, any valid ids)."""
    pad = width - ro.prompt_tokens.shape[1]
    if not pad:
        return ro
    host: Any = ro  # the Rollout's fields are host numpy arrays here
    routing: Any = ro.routing
    if routing is not None:
        fill = np.broadcast_to(
            np.arange(routing.shape[-1], dtype=routing.dtype),
            (routing.shape[0], pad, *routing.shape[2:]),
        )
        routing = np.concatenate([fill, routing], axis=1)
    return host._replace(
        prompt_tokens=np.pad(ro.prompt_tokens, ((0, 0), (pad, 0))),
        prompt_mask=np.pad(ro.prompt_mask, ((0, 0), (pad, 0))),
        routing=routing,
    )


def concat_experience(parts: list[Experience], *, max_groups: int) -> Experience:
    """Experience of several sampling rounds as one, cut to ``max_groups`` groups; prompts of
    different (bucketed) widths are left-padded to the widest. ``metrics`` are the first
    part's."""
    g = parts[0].group_size
    n = max_groups * g
    width = max(p.rollout.prompt_tokens.shape[1] for p in parts)

    def cat(xs):
        return np.concatenate(xs, 0)[:n]

    ro = jax.tree.map(lambda *xs: cat(xs), *[widen(p.rollout, width) for p in parts])

    def flat(name: str) -> list:
        return sum((getattr(p, name) for p in parts), [])[:n]

    def optional(name: str):
        if getattr(parts[0], name) is None:
            return None
        if name in ("context_mask", "token_version"):
            return cat([getattr(p, name) for p in parts])
        return flat(name)

    return Experience(
        rollout=ro,
        texts=flat("texts"),
        prompts=flat("prompts"),
        extras=flat("extras"),
        rewards=cat([p.rewards for p in parts]),
        valid=cat([p.valid for p in parts]),
        scores={k: cat([p.scores[k] for p in parts]) for k in parts[0].scores},
        metrics=parts[0].metrics,
        group_size=g,
        policy_version=cat([p.policy_version for p in parts]),
        context_mask=optional("context_mask"),
        messages=optional("messages"),
        sources=optional("sources"),
        token_version=optional("token_version"),
    )


#: Per call site of :func:`merge_process_metrics`, every metric name the processes have
#: agreed on so far, sorted; the same on every process (it only grows, at a call where every
#: process learns the new names at once).
_AGREED_NAMES: dict[str, list[str]] = collections.defaultdict(list)


def merge_process_metrics(metrics: dict[str, float], rows: int, *, site: str) -> dict[str, float]:
    """A step's metrics over every process's share (host-local experience), on every
    process: counts (failures, errors, timeouts, non-finite values, pairs, dropped/kept/
    filled groups) are summed; ``time/*``, maxima and rounds are the largest process's; data
    positions are process 0's (the same everywhere); the others, means over rows, are
    averaged weighted by each process's ``rows``. A key only some processes report (a
    failure count where one failed) is merged over those that do.

    One collective (:func:`~jaxrl_llm.parallel.gather_numbers`) when every process's names
    are among those agreed at earlier calls: each sends which of them it reports and their
    values in that order, with a flag saying whether it had a name beyond them. Only when one did
    are the names gathered (:func:`~jaxrl_llm.parallel.gather_strings`) and the values sent
    again. ``site`` names the call (every process makes the same calls in the same order):
    each keeps its own names, so a call sends only its own metrics. The two halves,
    :func:`metrics_numbers` and :func:`merged_metrics`, let a merge travel in one exchange
    with other numbers (:func:`~jaxrl_llm.parallel.gather_packed`)."""
    if jax.process_count() == 1:
        return metrics
    table = gather_numbers(metrics_numbers(metrics, rows, site=site))
    return merged_metrics(table, metrics, rows, site=site)


def metrics_numbers(metrics: dict[str, float], rows: int, *, site: str) -> np.ndarray:
    """What this process sends for a :func:`merge_process_metrics` at ``site`` (uint8, of one
    size on every process): its ``rows``, whether all its names are agreed, its values of the
    agreed names (NaN where it has none; float64) and which of them it reports (bits)."""
    names = _AGREED_NAMES[site]
    fits = set(metrics) <= set(names)
    mine = [float(metrics[k]) if k in metrics else np.nan for k in names]
    numbers = np.array([rows, float(fits), *mine], np.float64)
    flags = np.packbits(np.array([k in metrics for k in names], bool))
    return np.concatenate([numbers.view(np.uint8), flags])


def merged_metrics(
    table: np.ndarray, metrics: dict[str, float], rows: int, *, site: str
) -> dict[str, float]:
    """:func:`merge_process_metrics` from ``table``, every process's :func:`metrics_numbers`
    (``[processes, bytes]``, gathered); when a process had a name not yet agreed, the names
    are agreed and the values gathered again here (every process takes this branch
    together: the flag is in the table)."""
    agreed = _AGREED_NAMES[site]
    present, values = _unpack_metrics(table, len(agreed))
    if not values[:, 1].all():  # a process has a name the others have not seen yet
        names = gather_strings("\n".join(sorted(metrics)))
        new = {k for n in names for k in n.split("\n") if k}
        agreed[:] = sorted(new.union(agreed))
        table = gather_numbers(metrics_numbers(metrics, rows, site=site))
        present, values = _unpack_metrics(table, len(agreed))
    return _merge(metrics, agreed, present, values)


def _unpack_metrics(table: np.ndarray, names: int) -> tuple[np.ndarray, np.ndarray]:
    """Every process's ``[names]`` flags and ``[2 + names]`` numbers from gathered
    :func:`metrics_numbers`."""
    size = (2 + names) * 8
    present = np.unpackbits(table[:, size:], axis=1, count=names).astype(bool)
    return present, np.ascontiguousarray(table[:, :size]).view(np.float64)


def _merge(
    metrics: dict[str, float], agreed: list[str], present: np.ndarray, table: np.ndarray
) -> dict[str, float]:
    """The merge rules of :func:`merge_process_metrics` over the gathered values."""
    values = table[:, 2:]
    out: dict[str, float] = {}
    for j, key in enumerate(agreed):
        v = values[:, j]
        has = present[:, j] & ~np.isnan(v)
        if not has.any():
            if present[:, j].any():  # reported, but NaN everywhere
                out[key] = float("nan")
            continue
        v, weights = v[has], table[has, 0]
        if key.startswith(("time/", "data/")) or key.endswith(("_max", "rounds")):
            out[key] = float(v[0] if key.startswith("data/") else v.max())
        elif key.endswith("_min"):
            out[key] = float(v.min())
        elif key.endswith(("failures", "errors", "timeouts", "nonfinite", "failed", "pairs")) or (
            key.startswith("dynamic/groups_")
        ):
            out[key] = float(v.sum())
        else:
            out[key] = float((v * weights).sum() / max(weights.sum(), 1))
        if isinstance(metrics.get(key), int):
            out[key] = int(out[key])
    return out


def rl_batch(exp: Experience, advantages: np.ndarray, loss_weight: np.ndarray) -> dict:
    """The learner batch in the losses' ``rl`` layout: prompt (left-padded) + completion per
    row; ``attention_mask`` every real token (a multi-turn episode's environment tokens too:
    ``exp.context_mask``); ``loss_mask`` = the policy's tokens × ``loss_weight [N]``;
    ``old_logp`` the behaviour log-probs; ``advantages`` per sequence ``[N]`` (broadcast over
    the completion) or per token ``[N, M]``; ``routing [N, P + M, L, k]`` int32 when the
    sampler recorded it (:attr:`Experience.routing`)."""
    ro = exp.rollout
    p_tok, p_mask = np.asarray(ro.prompt_tokens), np.asarray(ro.prompt_mask)
    c_tok, c_mask = np.asarray(ro.tokens), np.asarray(ro.mask)
    n, p = p_tok.shape
    m = c_tok.shape[1]
    input_ids = np.concatenate([p_tok, c_tok], 1).astype(np.int32)
    c_attn = c_mask if exp.context_mask is None else np.asarray(exp.context_mask)
    attn = np.concatenate([p_mask, c_attn], 1).astype(np.int32)
    lmask = np.concatenate([np.zeros_like(p_mask), c_mask * loss_weight[:, None]], 1)
    old = np.concatenate([np.zeros((n, p), np.float32), np.asarray(ro.logprobs, np.float32)], 1)
    adv_c = np.repeat(advantages[:, None], m, 1) if advantages.ndim == 1 else advantages
    adv = np.concatenate([np.zeros((n, p), np.float32), adv_c.astype(np.float32)], 1)
    lmask = lmask.astype(np.int32)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attn,
        "loss_mask": lmask,
        "old_logp": (old * lmask).astype(np.float32),  # float32 × int32 would be float64
        "advantages": (adv * lmask).astype(np.float32),
    }
    if exp.routing is not None:
        batch["routing"] = np.asarray(exp.routing, np.int32)
    return batch


class ExperienceBuffer:
    """Where rollout and learner meet: a FIFO of :class:`Experience` batches.

    The learner takes the oldest batch whose rows were sampled at most ``max_staleness``
    policy versions before the learner's current version; older batches are dropped and
    counted. ``max_staleness = 0`` with one put per get is the synchronous loop (what the
    trainer's default); the asynchronous producer puts ahead of the learner.
    """

    def __init__(self, max_staleness: int = 0):
        self.max_staleness = int(max_staleness)
        self._queue: collections.deque[Experience] = collections.deque()
        self.dropped = 0

    def put(self, exp: Experience) -> None:
        """Add one batch (the rollout side)."""
        self._queue.append(exp)

    def get(self, version: int) -> Experience | None:
        """The oldest batch fresh enough for a learner at ``version`` (None when empty)."""
        while self._queue:
            exp = self._queue.popleft()
            if version - int(np.min(exp.policy_version)) <= self.max_staleness:
                return exp
            self.dropped += 1
        return None

    def __len__(self) -> int:
        return len(self._queue)

"""The learner side of the online loop: epochs × minibatches × micro-batches of the jitted,
sharded train step over one learner batch, and the step's metrics over those updates.

A minibatch of group-RL rows is laid out as micro-batches of whole groups, informative groups
first (:func:`skippable_layout`), so that the step can skip the forward and backward of the
micro-batches whose advantages are all zero (``make_train_step(skip_fn=...)``; exact).

On a mesh with a ``context`` axis of C > 1 devices (context parallelism), the learner batch's
token axis is left-padded to a multiple of C (:func:`jaxrl_llm.data.pad_length`): the prompt is
left-padded already, so every target stays in the last ``rollout.max_new_tokens`` columns that
the log-prob window reads, and the padded columns are masked (no result changes). The update's
forward and backward then split each row's tokens over the axis (ring attention); the rollout
that produced the batch ran unsharded along T.

With ``logprobs.pack`` (:class:`~jaxrl_llm.train.config.plan.PackSpec`) each update's rows are packed right before the
step (:func:`jaxrl_llm.data.pack_rl_batch`): after the minibatch and micro-batch layout, so
that a micro-batch's packed rows hold exactly its own episodes and zero-advantage skipping
still sees whole micro-batches of groups. The packed row length is then the multiple of C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl_llm.data.collate import pad_length
from jaxrl_llm.data.packing import pack_rl_batch, packing_stats
from jaxrl_llm.parallel import gather_numbers, rows_to_global, take_rows
from jaxrl_llm.parallel.context import context_size
from jaxrl_llm.train.config.plan import PackSpec, Rows
from jaxrl_llm.train.programs.step import STEP_METRICS, is_loss_share
from jaxrl_llm.train.run.faults import fault_point


def minibatch_order(rng: np.random.Generator, n: int, minibatches: int, group: int) -> np.ndarray:
    """Row order for splitting ``n`` rows into minibatches: a random permutation, of whole
    groups of ``group`` consecutive rows when the update needs them (a shared prompt, or
    skipping); the identity for one minibatch."""
    if minibatches <= 1:
        return np.arange(n)
    if group <= 1:
        return rng.permutation(n)
    groups = rng.permutation(n // group)
    return (groups[:, None] * group + np.arange(group)[None, :]).reshape(-1)


def informative_rows(batch: dict) -> np.ndarray:
    """``[n]`` bool: the rows with a nonzero advantage on a token the loss weighs."""
    n = len(batch["loss_mask"])
    adv = np.asarray(batch["advantages"]).reshape(n, -1)
    mask = np.asarray(batch["loss_mask"]).reshape(n, -1).astype(bool)
    return np.any((adv != 0) & mask, axis=1)


def skippable_order(informative: np.ndarray, group: int, micro_batches: int) -> np.ndarray:
    """The row order that lays a minibatch of whole groups (``group`` consecutive rows each;
    ``informative [n]`` per row) out for a train step with ``micro_batches`` strided
    micro-batches (``train.step.split_micro_batches``: micro-batch m holds rows m, m + M, …):
    each micro-batch holds whole groups, the groups with a nonzero advantage first, so the
    micro-batches left with only zero-advantage groups are skipped by the step. A
    permutation of rows, so the summed loss is the same."""
    groups = np.argsort(~informative.reshape(-1, group).any(axis=1), kind="stable")
    rows = (groups[:, None] * group + np.arange(group)[None, :]).reshape(micro_batches, -1)
    return rows.T.reshape(-1)  # batch row i*M + m = row i of micro-batch m


def skippable_layout(batch: dict, group: int, micro_batches: int) -> dict:
    """A minibatch reordered by :func:`skippable_order`."""
    order = skippable_order(informative_rows(batch), group, micro_batches)
    return {k: v[order] for k, v in batch.items()}


def mean_metrics(per_update: list[dict]) -> dict[str, float]:
    """The step's metrics over a step's updates (minibatches × epochs). The loss's own
    metrics are averaged over the micro-batches that ran (``computed_micro_batches``), and
    left out when none ran (all groups skipped): a 0 entropy or ratio would be misread."""
    out = {}
    w = np.array([float(m.get("computed_micro_batches", 1.0)) for m in per_update])
    for k in per_update[0]:
        v = np.array([float(m[k]) for m in per_update])
        if k in STEP_METRICS or is_loss_share(k):
            out[k] = float(v.mean())
        elif w.sum() > 0:
            out[k] = float((v * w).sum() / w.sum())
    return out


class Learner:
    """Runs the policy's train step over a learner batch.

    Args:
      step_fn: the jitted step ``(state, batch, frozen, hparams=None) -> (state, metrics)``.
      rows: the plan's :class:`~jaxrl_llm.train.config.plan.Rows`: epochs × minibatches updates per
        step, micro-batches per update (M > 1 lays each minibatch out for skipping,
        :func:`skippable_layout`), G rows per group, whole groups per minibatch or not.
      seed: minibatch permutations are functions of (seed, step).
      companions: ``companion(minibatch) -> metrics``, updates per minibatch on the same
        rows beside the policy's (PPO's critic).
      actor_drop: batch keys the policy's step does not take (the companions' entries).
      pack: pack the policy's rows before each step (:class:`~jaxrl_llm.train.config.plan.PackSpec`),
        or None.
    """

    def __init__(
        self,
        step_fn: Callable,
        rows: Rows,
        *,
        seed: int,
        companions: tuple[Callable[[dict], dict], ...] = (),
        actor_drop: tuple[str, ...] = (),
        pack: PackSpec | None = None,
    ):
        self.step_fn = step_fn
        self.epochs, self.minibatches = rows.epochs, rows.minibatches
        self.group, self.group_minibatches = rows.group, rows.group_minibatches
        self.micro_batches, self.seed = rows.micro_batches, seed
        self.companions, self.actor_drop = companions, actor_drop
        self.pack = pack

    def update(
        self, policy: Any, batch: dict, step: int, *, frozen: dict, hparams: dict | None = None
    ) -> dict[str, float]:
        """``epochs × minibatches`` updates of ``policy.state`` on ``batch``; the step's
        metrics (means over updates; ``nonfinite`` the max; ``update/computed_frac`` the
        share of micro-batches that ran when skipping). On a context mesh the batch's T is
        left-padded to a multiple of the context axis first (module docstring)."""
        c = context_size(policy.mesh)
        if self.pack is None:
            batch = pad_length(batch, c, side="left", pad_id=_pad_id(policy))
        else:
            t = np.shape(batch["input_ids"])[1]
            row_len = -(-(self.pack.row_len or t) // c) * c
            shards = int(policy.mesh.shape["data"] * policy.mesh.shape["fsdp"])
        fills: list[float] = []
        n = len(next(iter(batch.values())))
        rows = informative = None  # across processes: the whole step's rows, global arrays
        if jax.process_count() > 1:
            rows = rows_to_global(batch, policy.mesh)
            if self.micro_batches > 1:  # skipping lays minibatches out by these
                informative = gather_numbers(informative_rows(batch)).reshape(-1)
            n *= jax.process_count()
        mb = n // self.minibatches
        rng = np.random.default_rng(self.seed * 7919 + step)
        per_update: list[dict] = []
        for _ in range(self.epochs):
            order = minibatch_order(
                rng, n, self.minibatches, self.group if self.group_minibatches else 1
            )
            for j in range(self.minibatches):
                idx = order[j * mb : (j + 1) * mb]
                if rows is not None:  # a program gathers the minibatch from every host
                    if informative is not None:
                        idx = idx[skippable_order(informative[idx], self.group, self.micro_batches)]
                    sub = take_rows(rows, idx, policy.mesh)
                else:
                    sub = {k: v[idx] for k, v in batch.items()}
                    if self.micro_batches > 1:
                        sub = skippable_layout(sub, self.group, self.micro_batches)
                actor = {k: v for k, v in sub.items() if k not in self.actor_drop}
                if self.pack is not None:
                    actor = pack_rl_batch(
                        actor,
                        window=self.pack.window,
                        row_len=row_len,
                        micro_batches=self.micro_batches,
                        row_multiple=shards,
                        pad_id=_pad_id(policy),
                    )
                    fills.append(packing_stats(actor)["pack/fill"])
                if hparams is None:
                    policy.state, m = self.step_fn(policy.state, actor, frozen)
                else:
                    policy.state, m = self.step_fn(policy.state, actor, frozen, hparams)
                fault_point("update", step)
                for companion in self.companions:
                    m = {**m, **companion(sub)}
                per_update.append(m)
        per_update = jax.device_get(per_update)
        out = mean_metrics(per_update)
        out["nonfinite"] = float(max(float(m["nonfinite"]) for m in per_update))
        if fills:  # real tokens / packed token slots of the update's forwards
            out["pack/fill"] = float(np.mean(fills))
        if "computed_micro_batches" in out:  # the fraction of update micro-batches that ran
            out["update/computed_frac"] = out.pop("computed_micro_batches") / self.micro_batches
        return out


def context_padded(fn: Callable[[dict], Any], batch: dict, policy: Any) -> Any:
    """``fn(batch)`` with the batch's token axis T left-padded to a multiple of the policy
    mesh's context axis (as :meth:`Learner.update` pads it), so that a forward outside the
    update (the reference's, the correction's recompute) goes round the ring too, and every
    ``[N, T']`` array of the result cropped back to the last T columns (per-row results, and
    a preference batch's per-pair ones, pass unchanged). A no-op without context
    parallelism."""
    c = context_size(policy.mesh)
    if c <= 1:
        return fn(batch)
    out = fn(pad_length(batch, c, side="left", pad_id=_pad_id(policy)))
    if "input_ids" not in batch:  # pairs: per-pair results, nothing to crop
        return out
    t = np.shape(batch["input_ids"])[1]
    t_pad = t + (-t % c)
    return jax.tree.map(
        lambda x: x[:, t_pad - t :] if np.ndim(x) >= 2 and np.shape(x)[1] == t_pad else x, out
    )


def _pad_id(policy: Any) -> int:
    """The model's padding token id (0 when it has none): what padded ``input_ids`` hold."""
    pad = getattr(getattr(policy, "config", None), "pad_token_id", None)
    return 0 if pad is None else int(pad)

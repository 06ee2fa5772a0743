"""Packing: several sequences per row, each with its own segment id, instead of one padded row
each.

A batch of ragged sequences padded to its longest row spends the forward and backward on the
padding; packed into fixed-length rows it spends them on real tokens. With ``segment_ids`` the
model's attention never crosses sequences and ``positions`` restart at 0 in every segment, so
each sequence sees exactly the context it sees alone: packed and padded per-token log-probs
agree up to float rounding (Krell et al. 2021, "Efficient sequence packing without
cross-contamination", https://arxiv.org/abs/2107.02027).

Three layouts are packed here (numpy, on the host):

- :func:`pack_sequences`: SFT examples. Every per-token quantity (the loss mask) lives in the
  packed row itself.
- :func:`pack_preferences`: DPO-family pairs. Chosen and rejected sequences are packed like
  SFT rows; ``pair_index [R, L]`` says which of the 2B sequences (chosen b → b, rejected b →
  B + b, −1 on padding) each token belongs to, and the pair losses sum log-probs per sequence
  with it (``jaxrl_llm.losses.preference``). ``pair_valid [B]`` marks real pairs.
- :func:`pack_rl_batch`: the online learner's batch (left-padded prompt + completion per row,
  per-token advantages, behaviour log-probs...). Only the model inputs are packed; the
  per-token quantities stay one row per sequence, cut to the completion window ``[N, W]``, and
  ``unpack_index [N, W]`` gives for each of them the flat position in the packed rows of the
  token it scores. The loss gathers the packed log-probs back with it
  (:func:`jaxrl_llm.losses.forward_logps`), so every aggregation — token mean, per-sequence
  mean, GSPO's sequence ratio — sees exactly the padded batch's values.

Micro-batches: a train step splits every leading axis into M strided micro-batches (rows m,
m + M, …; ``jaxrl_llm.train.programs.step.split_micro_batches``). Packed rows and the per-sequence
leaves must split the same way, so the preference and RL packers pack each micro-batch's
sequences on their own, with indices local to it, and interleave the blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.data.tokenize import TokenizedPreference, TokenizedSequence
from jaxrl_llm.errors import DataError

# Keys of a packed forward (``[R, L]``); a batch that has them is packed already.
PACKED_KEYS = ("input_ids", "attention_mask", "segment_ids", "positions")


def first_fit(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Bins of sequence indices, first-fit in decreasing length order (each bin's total at
    most ``row_len``; ties keep index order, so the result is deterministic).

    First-fit decreasing uses at most 11/9·OPT + 6/9 bins (Dósa 2007).
    """
    if lengths and max(lengths) > row_len:
        raise DataError(
            f"a sequence has {max(lengths)} tokens, longer than the packed row length "
            f"{row_len}; raise the row length or apply the length policy first"
        )
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, f in enumerate(free):
            if lengths[i] <= f:
                bins[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(row_len - lengths[i])
    return [sorted(b) for b in bins]


def _write_rows(
    tokens: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    bins: list[list[int]],
    *,
    num_rows: int,
    row_len: int,
    pad_id: int,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Sequences written into ``num_rows`` rows as ``bins`` assign them: ``input_ids,
    attention_mask, loss_mask, segment_ids, positions [R, L]`` and each sequence's flat start
    ``row · L + column``. ``targets[i]`` is sequence i's loss mask (0 at its first token)."""
    shape = (num_rows, row_len)
    ids = np.full(shape, pad_id, np.int32)
    attn, loss, seg, pos = (np.zeros(shape, np.int32) for _ in range(4))
    starts = np.zeros(len(tokens), np.int64)
    for r, members in enumerate(bins):
        col = 0
        for s, i in enumerate(members, start=1):
            n = len(tokens[i])
            ids[r, col : col + n] = tokens[i]
            attn[r, col : col + n] = 1
            loss[r, col : col + n] = targets[i]
            loss[r, col] = 0  # never predicted from the previous segment
            seg[r, col : col + n] = s
            pos[r, col : col + n] = np.arange(n)
            starts[i] = r * row_len + col
            col += n
    arrays = {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "segment_ids": seg,
        "positions": pos,
    }
    return arrays, starts


def _pack_routing(
    routing: Sequence[np.ndarray], starts: np.ndarray, *, num_rows: int, row_len: int
) -> np.ndarray:
    """Each sequence's recorded experts ``[n_i, L, k]`` (its real tokens) written at its flat
    start in ``[R, row_len, L, k]``; padding slots hold the experts 0..k−1 (any valid ids:
    padding is masked)."""
    _, num_layers, k = routing[0].shape
    dtype = routing[0].dtype
    flat = np.broadcast_to(np.arange(k, dtype=dtype), (num_rows * row_len, num_layers, k)).copy()
    for r, start in zip(routing, starts, strict=True):
        flat[int(start) : int(start) + len(r)] = r
    return flat.reshape(num_rows, row_len, num_layers, k)


def _interleave(blocks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Blocks of equal shapes → one batch whose strided micro-batch m (rows m, m + M, …) is
    block m."""
    return {
        k: np.stack([b[k] for b in blocks], axis=1).reshape(-1, *blocks[0][k].shape[1:])
        for k in blocks[0]
    }


def _rows_per_block(needed: int, cap: int, multiple: int) -> int:
    """Packed rows per micro-batch: ``needed`` rounded up to a step of about an eighth of
    ``cap`` (the unpacked row count), itself a multiple of ``multiple`` (the batch shards).
    At most ~8 distinct shapes, so a run compiles a few train-step programs, not one per
    batch, at a cost of at most one step of all-padding rows."""
    step = -(-max(-(-cap // 8), 1) // multiple) * multiple
    return -(-max(needed, 1) // step) * step


def pack_sequences(
    items: Sequence[TokenizedSequence],
    *,
    row_len: int,
    num_rows: int | None = None,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Pack several (prompt + completion) examples into each row of length ``row_len``.

    Examples are placed first-fit in decreasing length order (:func:`first_fit`); each keeps
    its own segment id (1, 2, … within its row; 0 marks padding) and positions restarting at
    0, so with ``segment_ids`` the model's attention never crosses examples and every example
    sees exactly the context it would see alone: packed and unpacked per-token log-probs agree.
    The first token of each segment is a prompt token, so ``loss_mask`` is 0 at every segment
    start (no token is predicted from the previous example).

    Args:
      items: tokenised sequences, each at most ``row_len`` long.
      row_len: T of the packed rows.
      num_rows: pad to exactly this many rows (extra rows are all padding); None: as many as
        needed.
      pad_id: token id for padding.

    Returns:
      ``input_ids, attention_mask, loss_mask, segment_ids, positions`` [R, row_len] int32.
    """
    if not items:
        raise DataError("no sequences to collate")
    tokens = [np.asarray((*x.prompt_ids, *x.completion_ids), np.int32) for x in items]
    targets = [
        np.r_[
            np.zeros(len(x.prompt_ids), np.int32),
            np.ones(len(x.completion_ids), np.int32)
            if x.completion_mask is None
            else np.asarray(x.completion_mask, np.int32),
        ]
        for x in items
    ]
    bins = first_fit([len(t) for t in tokens], row_len)
    n_rows = len(bins) if num_rows is None else num_rows
    if len(bins) > n_rows:
        raise DataError(
            f"{len(items)} examples need {len(bins)} packed rows of {row_len} "
            f"tokens, more than num_rows={num_rows}"
        )
    arrays, _ = _write_rows(tokens, targets, bins, num_rows=n_rows, row_len=row_len, pad_id=pad_id)
    return arrays


def pack_preferences(
    items: Sequence[TokenizedPreference],
    *,
    row_len: int,
    num_rows: int | None = None,
    micro_batches: int = 1,
    row_multiple: int = 1,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Preference pairs packed: every chosen and rejected sequence (prompt + response) a
    segment of a row of ``row_len`` tokens.

    The pair losses (``jaxrl_llm.losses.dpo_model_loss`` / ``simpo_model_loss`` / ``orpo_model_loss`` and
    ``preference_reference_logps``) recognise the layout by ``pair_index`` and sum each
    sequence's log-probs over its segment: the same per-pair sums as the padded
    ``[2B, T]`` forward, without its padding.

    Args:
      items: B tokenised pairs.
      row_len: L, at least the longest prompt + response.
      num_rows: R, packed rows in all (a multiple of ``micro_batches``); None: the rows
        every micro-batch needs, rounded up to one of a few sizes (few compiled shapes).
      micro_batches: M; pairs i, i + M, … (strided, as the train step splits) are packed in
        block i with indices local to it.
      row_multiple: with ``num_rows`` None, rows per micro-batch are a multiple of this (the
        mesh's batch shards).
      pad_id: token id for padding.

    Returns:
      ``input_ids, attention_mask, loss_mask, segment_ids, positions, pair_index [R, L]`` and
      ``pair_valid [B]`` (1 where both responses have tokens).
    """
    if not items:
        raise DataError("no preference pairs to collate")
    b = len(items)
    if b % micro_batches or (num_rows is not None and num_rows % micro_batches):
        raise DataError(
            f"{b} pairs / {num_rows} rows cannot be split into {micro_batches} micro-batches"
        )
    blocks_in, bins_all = [], []
    for m in range(micro_batches):
        pairs = [items[i] for i in range(m, b, micro_batches)]
        tokens, targets = [], []
        for side in ("chosen_ids", "rejected_ids"):
            for x in pairs:
                resp = getattr(x, side)
                tokens.append(np.asarray((*x.prompt_ids, *resp), np.int32))
                targets.append(
                    np.r_[np.zeros(len(x.prompt_ids), np.int32), np.ones(len(resp), np.int32)]
                )
        bins = first_fit([len(t) for t in tokens], row_len)
        blocks_in.append((tokens, targets))
        bins_all.append(bins)
    need = max(len(bins) for bins in bins_all)
    if num_rows is None:
        per_block = _rows_per_block(need, 2 * b // micro_batches, row_multiple)
    else:
        per_block = num_rows // micro_batches
    if need > per_block:
        raise DataError(
            f"{b} preference pairs need {need * micro_batches} packed rows of {row_len} "
            f"tokens, more than num_rows={num_rows}"
        )
    blocks = []
    for (tokens, targets), bins in zip(blocks_in, bins_all):
        arrays, starts = _write_rows(
            tokens, targets, bins, num_rows=per_block, row_len=row_len, pad_id=pad_id
        )
        index = np.full(per_block * row_len, -1, np.int32)
        for i, start in enumerate(starts):  # chosen b -> b, rejected b -> B_m + b
            index[start : start + len(tokens[i])] = i
        arrays["pair_index"] = index.reshape(per_block, row_len)
        blocks.append(arrays)
    out = _interleave(blocks)
    valid = [int(len(x.chosen_ids) > 0 and len(x.rejected_ids) > 0) for x in items]
    out["pair_valid"] = np.asarray(valid, np.int32)
    return out


def pack_rl_batch(
    batch: dict[str, Any],
    *,
    window: int,
    row_len: int | None = None,
    micro_batches: int = 1,
    row_multiple: int = 1,
    pad_id: int = 0,
) -> dict[str, Any]:
    """The online learner's batch with its model inputs packed (module docstring).

    Each row's real tokens (``attention_mask`` 1: the prompt's and the completion's, a
    multi-turn episode's environment tokens too) become one segment, in order, with positions
    0, 1, …: what the padded row's ``cumsum(mask) − 1`` positions are on those tokens. Every
    other ``[N, T]`` leaf (``loss_mask``, ``advantages``, ``old_logp``, ``ref_logp``,
    ``is_weights``, …) is cut to its last ``window`` columns, where every target of a rollout
    batch sits; per-row ``[N]`` leaves and scalars pass unchanged. A ``routing [N, T, L, k]``
    leaf (a mixture of experts' recorded experts, routing replay) is packed as the model
    inputs are, ``[M·R_m, L_row, L, k]``.

    Args:
      batch: the losses' ``rl`` layout (``jaxrl_llm.train.online.experience.rl_batch``), numpy,
        ``input_ids`` / ``attention_mask`` / ``loss_mask`` ``[N, T]``, rows left-padded.
      window: W, the completion columns (``rollout.max_new_tokens``); ``loss_mask`` must be
        0 before them.
      row_len: L of the packed rows (≥ every row's real tokens); None: T.
      micro_batches: M (dividing N): rows m, m + M, … are packed into block m.
      row_multiple: packed rows per micro-batch are a multiple of this (the mesh's batch
        shards).
      pad_id: token id for padding.

    Returns:
      ``input_ids, attention_mask, segment_ids, positions [M·R_m, L]``, ``unpack_index
      [N, W]`` int32 (flat index into the packed rows of the micro-batch that holds the row;
      0 where ``loss_mask`` is 0), the other per-token leaves ``[N, W]``.

    Raises:
      ValueError: a packed batch, a bad window or split, a target outside the window.
    """
    ids = np.asarray(batch["input_ids"])
    attn = np.asarray(batch["attention_mask"]).astype(bool)
    lmask = np.asarray(batch["loss_mask"])
    n, t = ids.shape
    row_len = t if row_len is None else int(row_len)
    if "segment_ids" in batch or "unpack_index" in batch:
        raise ValueError("pack_rl_batch: the batch is packed already")
    if not 1 <= window < t:
        raise ValueError(f"pack_rl_batch: window={window} must be in [1, T={t})")
    if n % micro_batches:
        raise ValueError(f"pack_rl_batch: {n} rows cannot split into {micro_batches} micro-batches")
    if np.any(lmask[:, : t - window]):
        raise ValueError(
            f"pack_rl_batch: loss_mask has targets before the last window={window} columns"
        )
    lengths = attn.sum(1)
    # rank of each real token inside its row: the packed column offset from the row's start
    rank = np.cumsum(attn, axis=1) - 1
    blocks, per_block_bins = [], []
    for m in range(micro_batches):
        rows = np.arange(m, n, micro_batches)
        per_block_bins.append(first_fit([int(lengths[i]) for i in rows], row_len))
    per_block = _rows_per_block(
        max(len(b) for b in per_block_bins), n // micro_batches, row_multiple
    )
    index = np.zeros((n, window), np.int32)
    for m, bins in enumerate(per_block_bins):
        rows = np.arange(m, n, micro_batches)
        tokens = [ids[i][attn[i]] for i in rows]
        targets = [np.zeros(len(x), np.int32) for x in tokens]
        arrays, starts = _write_rows(
            tokens, targets, bins, num_rows=per_block, row_len=row_len, pad_id=pad_id
        )
        del arrays["loss_mask"]  # the targets stay in the per-sequence [N, W] layout
        if "routing" in batch:  # a mixture of experts' recorded routing, packed as the tokens
            arrays["routing"] = _pack_routing(
                [np.asarray(batch["routing"][i])[attn[i]] for i in rows],
                starts,
                num_rows=per_block,
                row_len=row_len,
            )
        blocks.append(arrays)
        cols = slice(t - window, t)
        for j, i in enumerate(rows):
            index[i] = np.where(attn[i, cols], starts[j] + rank[i, cols], 0)
    out: dict[str, Any] = {}
    for key, x in batch.items():
        if key in ("input_ids", "attention_mask", "routing"):
            continue
        if np.ndim(x) >= 2 and np.shape(x)[:2] == (n, t):
            out[key] = np.asarray(x)[:, t - window :]
        else:
            out[key] = x
    index = np.where(out["loss_mask"] != 0, index, 0).astype(np.int32)
    out.update(_interleave(blocks))
    out["unpack_index"] = index
    return out


def packing_stats(batch: dict[str, Any]) -> dict[str, float]:
    """``pack/rows`` and ``pack/fill`` (real tokens / packed slots) of a packed batch."""
    attn = np.asarray(batch["attention_mask"])
    return {"pack/rows": float(attn.shape[0]), "pack/fill": float(attn.mean())}

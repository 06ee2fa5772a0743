"""Collation of tokenised examples into the shared batch layout (numpy arrays, ``[B, T]``).

Batch layout (produced here, consumed by ``jaxrl_llm.losses``); token data is batch-major
``[B, T]``, right-padded, int32:

- Sequence batch (SFT; KTO and pairwise-rank rows too): ``input_ids`` (prompt + completion),
  ``attention_mask`` (1 = real token) and ``loss_mask`` (1 where token t is a completion
  token, i.e. a target; ``loss_mask[:, 0]`` is always 0 because token t is predicted from
  position t − 1). Packed rows add ``segment_ids`` (1, 2, … per example in the row, 0 on
  padding) and ``positions`` (restarting at 0 in every segment, as
  ``jaxrl_llm.models.default_positions(mask, segment_ids)`` computes them).
- Preference batch: ``chosen_input_ids, chosen_attention_mask, chosen_loss_mask,
  rejected_input_ids, rejected_attention_mask, rejected_loss_mask`` (one common T).
- KTO batch: a sequence batch plus ``label [B]`` (1 desirable, 0 undesirable) and the
  mismatched KL rows ``kl_input_ids, kl_attention_mask, kl_loss_mask`` (prompt i with the
  completion of row (i + 1) mod B), used for KTO's reference point z0 (arXiv:2402.01306).
- Pairwise-rank batch: a sequence batch whose rows come in consecutive groups of
  ``group_size`` responses to one prompt, plus ``scores [B]`` float32.
- Prompt batch (online RL): ``prompt_ids`` / ``prompt_mask`` **left**-padded (so every
  prompt ends at the same column and decoding starts there), plus the examples' extra fields.

T is rounded up to a bucket (:func:`round_up_length`: a multiple of e.g. 64, or a power of two)
so that a jitted train step compiles only a few shapes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.data.tokenize import (
    TokenizedPreference,
    TokenizedPrompt,
    TokenizedRank,
    TokenizedSequence,
)
from jaxrl_llm.errors import ConfigError, DataError


class BucketMode(str, enum.Enum):
    """How a batch's longest row length is rounded up: to a multiple, a power of two, or not."""

    MULTIPLE = "multiple"
    POW2 = "pow2"
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class Padding:
    """Padding settings for collation.

    Attributes:
      pad_id: token id written in padded positions (masked everywhere, so any valid id works;
        usually ``tokenizer.pad_token_id`` or EOS).
      bucket: :class:`BucketMode`. multiple: the multiple for ``BucketMode.MULTIPLE`` (64).
      max_len: upper bound for the padded length (None: no bound); a bucket never exceeds it.
    """

    pad_id: int = 0
    bucket: BucketMode = BucketMode.MULTIPLE
    multiple: int = 64
    max_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "bucket", BucketMode(self.bucket))
        if self.multiple <= 0:
            raise ConfigError(f"Padding.multiple must be positive, got {self.multiple}")


def round_up_length(
    n: int,
    *,
    mode: BucketMode | str = BucketMode.MULTIPLE,
    multiple: int = 64,
    max_len: int | None = None,
) -> int:
    """Round a row length ``n`` up to its bucket, never below ``n`` nor above ``max(n, max_len)``.

    Examples: ``round_up_length(65, multiple=64) == 128``; ``round_up_length(65, mode="pow2") == 128``;
    ``round_up_length(100, multiple=64, max_len=100) == 100``.
    """
    mode = BucketMode(mode)
    n = max(int(n), 1)
    if mode == BucketMode.MULTIPLE:
        b = -(-n // multiple) * multiple
    elif mode == BucketMode.POW2:
        b = 1 << (n - 1).bit_length()
    else:
        b = n
    if max_len is not None:
        b = max(n, min(b, max_len))
    return b


def _bucket(n: int, padding: Padding) -> int:
    return round_up_length(
        n, mode=padding.bucket, multiple=padding.multiple, max_len=padding.max_len
    )


def _rows(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    t: int,
    pad_id: int,
    prefix: str = "",
    targets: Sequence[Sequence[int] | None] | None = None,
) -> dict[str, np.ndarray]:
    """Right-padded (prompt + completion) rows with attention and loss masks; ``targets[i]``
    (one 0/1 per completion token, None = all 1) marks row i's trained completion tokens."""
    b = len(pairs)
    ids = np.full((b, t), pad_id, np.int32)
    attn = np.zeros((b, t), np.int32)
    loss = np.zeros((b, t), np.int32)
    for i, (p, c) in enumerate(pairs):
        n_p, n = len(p), len(p) + len(c)
        if n > t:
            raise DataError(f"row {i} has {n} tokens, more than the padded length {t}")
        ids[i, :n_p] = p
        ids[i, n_p:n] = c
        attn[i, :n] = 1
        m = None if targets is None else targets[i]
        loss[i, n_p:n] = 1 if m is None else np.asarray(m, np.int32)
    loss[:, 0] = 0
    return {prefix + "input_ids": ids, prefix + "attention_mask": attn, prefix + "loss_mask": loss}


def _nonempty(items: Sequence[Any], what: str):
    if len(items) == 0:
        raise DataError(f"cannot collate an empty batch of {what}")


def collate_sequences(
    items: Sequence[TokenizedSequence], *, padding: Padding = Padding()
) -> dict[str, np.ndarray]:
    """Sequence batch (see module doc): ``input_ids``, ``attention_mask``, ``loss_mask`` [B, T]."""
    _nonempty(items, "sequences")
    pairs = [(x.prompt_ids, x.completion_ids) for x in items]
    t = _bucket(max(len(p) + len(c) for p, c in pairs), padding)
    return _rows(pairs, t, padding.pad_id, targets=[x.completion_mask for x in items])


def collate_preferences(
    items: Sequence[TokenizedPreference], *, padding: Padding = Padding()
) -> dict[str, np.ndarray]:
    """Preference batch: ``chosen_*`` and ``rejected_*`` ids / masks, each [B, T], one T."""
    _nonempty(items, "preference pairs")
    n = max(len(x.prompt_ids) + max(len(x.chosen_ids), len(x.rejected_ids)) for x in items)
    t = _bucket(n, padding)
    out = _rows([(x.prompt_ids, x.chosen_ids) for x in items], t, padding.pad_id, "chosen_")
    out.update(
        _rows([(x.prompt_ids, x.rejected_ids) for x in items], t, padding.pad_id, "rejected_")
    )
    return out


def collate_kto(
    items: Sequence[TokenizedSequence], *, padding: Padding = Padding()
) -> dict[str, np.ndarray]:
    """KTO batch: sequence rows, ``label [B]`` int32 and mismatched ``kl_*`` rows [B, T].

    KL row i pairs prompt i with the completion of row (i + 1) mod B (KTO's estimate of the
    reference point z0 = KL(π‖π_ref) from mismatched pairs, arXiv:2402.01306 §4). When
    ``padding.max_len`` is set, a KL completion that would not fit is cut from the right.
    """
    _nonempty(items, "KTO examples")
    labels = []
    for i, x in enumerate(items):
        if x.label is None:
            raise DataError(f"KTO batch row {i} has no label; build it with Format.KTO")
        labels.append(int(x.label))
    b = len(items)
    pairs = [(x.prompt_ids, x.completion_ids) for x in items]
    kl_pairs = [(items[i].prompt_ids, items[(i + 1) % b].completion_ids) for i in range(b)]
    if padding.max_len is not None:
        kl_pairs = [(p, c[: max(0, padding.max_len - len(p))]) for p, c in kl_pairs]
    n = max(len(p) + len(c) for p, c in pairs + kl_pairs)
    t = _bucket(n, padding)
    out = _rows(pairs, t, padding.pad_id)
    out.update(_rows(kl_pairs, t, padding.pad_id, "kl_"))
    out["label"] = np.asarray(labels, np.int32)
    return out


def collate_ranks(
    items: Sequence[TokenizedRank], *, padding: Padding = Padding()
) -> dict[str, np.ndarray]:
    """Pairwise-rank batch: G consecutive rows per prompt (B = examples × G) and ``scores [B]``.

    Every example in the batch must have the same number of responses G (the loss's
    ``group_size``).
    """
    _nonempty(items, "ranking groups")
    g = len(items[0].response_ids)
    for i, x in enumerate(items):
        if len(x.response_ids) != g:
            raise DataError(
                f"ranking example {i} has {len(x.response_ids)} responses, the first "
                f"has {g}; every group in a data set must have the same size"
            )
    pairs = [(x.prompt_ids, r) for x in items for r in x.response_ids]
    t = _bucket(max(len(p) + len(c) for p, c in pairs), padding)
    out = _rows(pairs, t, padding.pad_id)
    out["scores"] = np.asarray([s for x in items for s in x.scores], np.float32)
    return out


def collate_prompts(
    items: Sequence[TokenizedPrompt], *, padding: Padding = Padding()
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Prompt batch for online RL: left-padded ``prompt_ids`` / ``prompt_mask`` [B, T].

    Returns:
      (arrays, extras): ``extras[i]`` is example i's extra fields (e.g. ``{"answer": "42"}``).
    """
    _nonempty(items, "prompts")
    t = _bucket(max(len(x.prompt_ids) for x in items), padding)
    ids = np.full((len(items), t), padding.pad_id, np.int32)
    mask = np.zeros((len(items), t), np.int32)
    for i, x in enumerate(items):
        n = len(x.prompt_ids)
        ids[i, t - n :] = x.prompt_ids
        mask[i, t - n :] = 1
    return {"prompt_ids": ids, "prompt_mask": mask}, [dict(x.extras) for x in items]


def pad_length(
    batch: dict[str, Any], multiple: int, *, side: str = "right", pad_id: int = 0
) -> dict[str, Any]:
    """A batch whose token axis T is padded to a multiple of ``multiple`` (context
    parallelism splits T over that many devices).

    Every ``{prefix}input_ids`` ``[B, T]`` sets the T of its prefix (``""``, ``"chosen_"``,
    ``"kl_"`` ...); each leaf of rank ≥ 2 whose second dimension is the T of its longest
    matching prefix is padded along it: ``input_ids`` with ``pad_id``, everything else
    (masks, per-token log-probs, advantages, positions) with 0. Padded tokens are masked
    (attention and loss mask 0), so they enter no sum and no denominator: the loss, its
    gradient and every metric are unchanged.

    Args:
      batch: a batch in the losses' layout (numpy or jax arrays; padded leaves come back as
        numpy).
      multiple: C ≥ 1; 1 returns the batch unchanged.
      side: ``"right"`` for right-padded batches (offline), ``"left"`` for the online
        learner batch (prompt left-padded; every target stays in the last columns, where a
        log-prob ``window`` reads them). Left padding of packed rows (``segment_ids``) is
        refused: a pad column would join the first segment.
      pad_id: the token id written into padded ``input_ids``.

    Returns:
      A new dict (the caller's is not modified); leaves that need no padding are the same
      objects.

    Raises:
      ValueError: a bad ``multiple`` / ``side``, or left padding of ``segment_ids``.
    """
    if multiple < 1:
        raise ValueError(f"pad_length: multiple={multiple} must be >= 1")
    if side not in ("left", "right"):
        raise ValueError(f"pad_length: side={side!r}; use 'left' or 'right'")
    lengths = {
        k[: -len("input_ids")]: int(np.shape(v)[1])
        for k, v in batch.items()
        if k.endswith("input_ids") and np.ndim(v) >= 2
    }
    out = dict(batch)
    if multiple == 1 or not lengths:
        return out
    for key, x in batch.items():
        if np.ndim(x) < 2:
            continue
        prefixes = [p for p in lengths if key.startswith(p)]
        if not prefixes:
            continue
        t = lengths[max(prefixes, key=len)]
        extra = -t % multiple
        if x.shape[1] != t or not extra:
            continue
        if side == "left" and key.endswith("segment_ids"):
            raise ValueError(
                f"pad_length: left padding of packed rows ({key!r}) is not supported; "
                f"pad them on the right"
            )
        widths = [(0, 0)] * np.ndim(x)
        widths[1] = (extra, 0) if side == "left" else (0, extra)
        value = pad_id if key.endswith("input_ids") else 0
        out[key] = np.pad(np.asarray(x), widths, constant_values=value)
    return out

"""End-to-end helpers: source → validated examples → token ids (length policy) → collate fn."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

from jaxrl_llm.data.collate import (
    Padding,
    collate_kto,
    collate_preferences,
    collate_prompts,
    collate_ranks,
    collate_sequences,
)
from jaxrl_llm.data.formats import Example, Format, parse_example
from jaxrl_llm.data.packing import pack_preferences, pack_sequences
from jaxrl_llm.data.readers import read_records
from jaxrl_llm.data.tokenize import (
    LengthPolicy,
    LossOn,
    Tokenized,
    apply_length_policy,
    tokenize_example,
)
from jaxrl_llm.errors import ConfigError, DataError


def load_examples(
    source: Any, fmt: Format | str, *, split: str | None = None
) -> tuple[list[Example], list[str]]:
    """Read ``source`` (see :func:`~jaxrl_llm.data.readers.read_records`) and validate every
    record as ``fmt``.

    Returns:
      (examples, locations) — ``locations[i]`` names the file and line of ``examples[i]``.
    """
    fmt = Format(fmt)
    records = read_records(source, split=split)
    return [parse_example(r, fmt) for r in records], [r.location for r in records]


def _tokenize_at(tokenizer: Any, example: Example, where: str, **kwargs) -> Tokenized:
    """:func:`tokenize_example`, its DataError prefixed with the example's location."""
    try:
        return tokenize_example(tokenizer, example, **kwargs)
    except DataError as e:
        raise DataError(f"{where}: {e}") from None


@dataclasses.dataclass(frozen=True)
class PreparedData:
    """A tokenised data set ready for :func:`~jaxrl_llm.data.iterator.make_iterator`.

    Attributes:
      format: the :class:`Format`.
      items: tokenised examples (after the length policy).
      stats: ``{"total", "kept", "truncated", "dropped"}`` from the length policy.
      max_len: the length limit the policy enforced (``data.max_length``); None when unknown.
      length_policy: the :class:`~jaxrl_llm.data.tokenize.LengthPolicy` it enforced.
    """

    format: Format
    items: list[Tokenized]
    stats: dict[str, int]
    max_len: int | None = None
    length_policy: LengthPolicy | None = None

    def describe(self, what: str) -> str:
        """The kept count in words, for a run's ``data:`` line: ``"600 training examples"``
        (``what`` = ``"training examples"``), followed by what the length policy changed when
        it changed anything: ``"10 training examples (3 of 13 dropped: longer than
        data.max_length)"``, ``"(3 of 13 truncated to data.max_length)"``."""
        s = self.stats
        notes = [
            f"{s[key]} of {s['total']} {change}"
            for key, change in (
                ("dropped", "dropped: longer than data.max_length"),
                ("truncated", "truncated to data.max_length"),
            )
            if s.get(key)
        ]
        return f"{s['kept']} {what}" + (f" ({'; '.join(notes)})" if notes else "")


def prepare_dataset(
    source: Any,
    fmt: Format | str,
    tokenizer: Any,
    *,
    max_len: int,
    length_policy: LengthPolicy | str = LengthPolicy.ERROR,
    split: str | None = None,
    add_eos: bool = True,
    loss_on: LossOn | str = LossOn.ASSISTANT,
) -> PreparedData:
    """Read, validate, tokenise and length-check a data set in one call.

    Args:
      source: a .jsonl / .parquet path, a saved ``datasets`` directory or object, or a list
        of dicts.
      fmt: the :class:`Format` of its examples.
      tokenizer: a Hugging Face tokenizer or :class:`~jaxrl_llm.data.tokenize.CharTokenizer`.
      max_len: longest row in tokens. length_policy: see
        :class:`~jaxrl_llm.data.tokenize.LengthPolicy`.
      split: split of a ``DatasetDict``. add_eos: append EOS to completions.
      loss_on: which tokens of an SFT row are targets (:class:`~jaxrl_llm.data.LossOn`,
        ``data.loss_on``; default every assistant turn).
    """
    fmt = Format(fmt)
    examples, locations = load_examples(source, fmt, split=split)
    tokenized = [
        _tokenize_at(tokenizer, e, where, add_eos=add_eos, loss_on=loss_on)
        for e, where in zip(examples, locations)
    ]
    name = str(source) if isinstance(source, (str, os.PathLike)) else None
    items, stats = apply_length_policy(
        tokenized, max_len=max_len, policy=length_policy, locations=locations, source=name
    )
    return PreparedData(
        format=fmt,
        items=items,
        stats=stats,
        max_len=max_len,
        length_policy=LengthPolicy(length_policy),
    )


def describe_prompt_splits(train: PreparedData | None, held_out: PreparedData | None) -> str:
    """An online run's ``data:`` line (after ``"data: "``): the prompts kept in each split,
    then, always, how many were dropped and why, so that "none" is said and not left to guess.
    ``jaxrl-llm eval`` says its held-out prompts alone (``train`` None): ``"5 held-out
    prompts; none dropped (...)"``.

    A prompt is dropped only for its length: longer than ``data.max_length`` tokens under
    ``data.length_policy: drop`` (the model's context is not a second limit: ``data.max_length``
    + ``rollout.max_new_tokens`` is checked against it before anything compiles). Under
    ``truncate`` (the default) a longer prompt is kept with its beginning cut off, which the
    line counts too; under ``error`` it stops the run. A row that cannot be read stops the run
    with its file and line, so none is dropped for that.

    Args:
      train: the training split (:func:`prepare_dataset`), or None.
      held_out: the held-out split, or None (not both None).

    Returns:
      the line's text, e.g. (the main job; tests/data/test_pipeline.py)::

        2000 training prompts, 256 held-out; none dropped (every prompt within
        data.max_length=128 tokens)
        8 training prompts, 2 held-out; dropped 2 of 10 training and 1 of 3 held-out prompts:
        longer than data.max_length=8 tokens (data.length_policy: drop)
        10 training prompts; none dropped; 2 of 10 training prompts cut from the left to
        data.max_length=8 tokens (data.length_policy: truncate)
    """
    splits = [(n, d) for n, d in (("training", train), ("held-out", held_out)) if d is not None]
    if not splits:
        raise ValueError("describe_prompt_splits: no split to describe")
    kept = ", ".join(
        f"{d.stats['kept']} {n}" + (" prompts" if n == "training" or len(splits) == 1 else "")
        for n, d in splits
    )
    first = splits[0][1]
    limit = f"data.max_length={first.max_len} tokens" if first.max_len else "data.max_length"
    policy = (
        "" if first.length_policy is None else f" (data.length_policy: {first.length_policy.value})"
    )

    def counted(key: str) -> str:
        """``"2 of 10 training and 1 of 3 held-out prompts"``: the splits where ``key`` > 0."""
        parts = [f"{d.stats[key]} of {d.stats['total']} {n}" for n, d in splits if d.stats.get(key)]
        return " and ".join(parts) + " prompts"

    if any(d.stats.get("dropped") for _, d in splits):
        return f"{kept}; dropped {counted('dropped')}: longer than {limit}{policy}"
    if any(d.stats.get("truncated") for _, d in splits):
        return f"{kept}; none dropped; {counted('truncated')} cut from the left to {limit}{policy}"
    return f"{kept}; none dropped (every prompt within {limit})"


def collate_fn_for(
    fmt: Format | str,
    *,
    padding: Padding = Padding(),
    pack_rows: int | None = None,
    pack: bool = False,
    micro_batches: int = 1,
    row_multiple: int = 1,
) -> Callable[[list[Tokenized]], Any]:
    """The collate function for a format (a partial of the matching ``collate_*``).

    Args:
      fmt: the :class:`Format`.
      padding: :class:`~jaxrl_llm.data.collate.Padding`.
      pack_rows: pack each batch into this many rows of ``padding.max_len`` tokens — SFT
        examples (:func:`~jaxrl_llm.data.pack_sequences`) or preference pairs
        (:func:`~jaxrl_llm.data.pack_preferences`); None: one example per row.
      pack: pack with as many rows as each batch needs, rounded up to one of a few sizes
        (preference pairs; SFT packs into ``pack_rows``).
      micro_batches: the train step's micro-batches (packed pairs are packed per
        micro-batch so that pairs and rows split together).
      row_multiple: packed pairs' rows per micro-batch are a multiple of this (the mesh's
        batch shards).
    """
    fmt = Format(fmt)
    if pack_rows is not None or pack:
        if fmt not in (Format.SFT, Format.PREFERENCE):
            raise ConfigError(
                f"data.packing is supported for the sft and preference formats, not {fmt.value}"
            )
        if padding.max_len is None:
            raise ConfigError("data.packing needs data.max_length (the packed row length)")
        if fmt == Format.PREFERENCE:
            return functools.partial(
                pack_preferences,
                row_len=padding.max_len,
                num_rows=pack_rows,
                micro_batches=micro_batches,
                row_multiple=row_multiple,
                pad_id=padding.pad_id,
            )
        if pack_rows is None:
            raise ConfigError("SFT packing needs pack_rows (the packed rows per batch)")
        return functools.partial(
            pack_sequences, row_len=padding.max_len, num_rows=pack_rows, pad_id=padding.pad_id
        )
    collators: dict[Format, Callable[..., Any]] = {
        Format.SFT: collate_sequences,
        Format.PREFERENCE: collate_preferences,
        Format.KTO: collate_kto,
        Format.PAIRWISE_RANK: collate_ranks,
        Format.PROMPT: collate_prompts,
    }
    return functools.partial(collators[fmt], padding=padding)

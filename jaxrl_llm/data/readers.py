"""Readers: local JSONL, Parquet and Hugging Face ``datasets`` objects / saved directories.

Every reader returns a list of :class:`Record` (the raw field dict plus a human-readable
location such as ``data/x.jsonl line 12``), so later validation can name the file, the line
and the field of a bad example. Hugging Face data is a ``datasets.Dataset`` / ``DatasetDict``
already in memory, a directory written by ``save_to_disk``, or a hub dataset named
``hf:org/name`` (``hf:org/name:split``), read from its JSONL / Parquet files in the Hugging
Face cache (``$HF_HOME``; ``datasets.load_dataset`` fills the same cache), or downloaded when
it is not cached and the hub may be used (:func:`read_hub_dataset`). ``pyarrow`` and
``datasets`` are imported lazily, so the package works without them until such a source is
read.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from jaxrl_llm.errors import DataError


class Record(NamedTuple):
    """One raw example as read from a source.

    Attributes:
      fields: the example's field dict (JSON object / table row).
      location: where it came from, e.g. ``"train.jsonl line 3"`` or ``"x.parquet row 7"``.
    """

    fields: dict[str, Any]
    location: str


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    """Read a JSON-lines file: one JSON object per line; blank lines are skipped.

    Args:
      path: a local ``.jsonl`` file.

    Returns:
      one :class:`Record` per non-blank line; ``location`` is ``"<path> line <n>"`` (1-based).

    Raises:
      DataError: missing file, non-UTF-8 bytes, malformed JSON, a line that is not a JSON
        object, or no examples at all — each naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    records: list[Record] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path} line {lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{where}: not valid UTF-8 (byte {e.start}); re-encode the file as UTF-8"
                ) from None
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # tolerate a UTF-8 byte-order mark
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: malformed JSON at column {e.colno}: {e.msg}") from None
            except RecursionError:
                raise DataError(
                    f"{where}: JSON nested too deeply to read; flatten the example"
                ) from None
            except ValueError as e:  # an integer of more digits than Python converts
                detail = str(e).split(";")[0]
                raise DataError(f"{where}: a value cannot be read ({detail}); shorten it") from None
            if not isinstance(obj, dict):
                raise DataError(
                    f"{where}: expected a JSON object per line, got {type(obj).__name__}"
                )
            _check_text(obj, where)
            records.append(Record(obj, where))
    if not records:
        raise DataError(f"{path}: empty data set (no examples)")
    return records


def _check_text(obj: Any, where: str) -> None:
    """Every string in a JSON value must be encodable as UTF-8: JSON's ``"\\ud800"`` escape
    decodes to a lone surrogate, which no tokenizer can encode. Iterative (no recursion)."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DataError(
                    f"{where}: a string holds a lone surrogate (U+{ord(x[e.start]):04X}, from a "
                    f"\\u escape), which is not text; fix or drop the example"
                ) from None


def read_parquet(path: str | os.PathLike) -> list[Record]:
    """Read a Parquet file (via ``pyarrow``); ``location`` is ``"<path> row <n>"`` (1-based).

    Raises:
      DataError: missing/unreadable file, pyarrow not installed, or an empty table.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - depends on the environment
        raise DataError(f"{path}: reading Parquet needs pyarrow; pip install pyarrow") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several unrelated types for corrupt files
        raise DataError(
            f"{path}: not a readable Parquet file ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not rows:
        raise DataError(f"{path}: empty data set (no rows)")
    return [Record(row, f"{path} row {i}") for i, row in enumerate(rows, start=1)]


def read_hf(source: Any, *, split: str | None = None) -> list[Record]:
    """Read a Hugging Face ``datasets`` object or a directory saved with ``save_to_disk``.

    Args:
      source: a ``datasets.Dataset``, a ``datasets.DatasetDict`` (then ``split`` is required
        unless it has a single split), or the path of a ``save_to_disk`` directory
        (loaded with ``datasets.load_from_disk``; never downloads).
      split: which split of a ``DatasetDict``.

    Returns:
      one :class:`Record` per row; ``location`` is ``"<name> row <n>"`` (1-based).
    """
    name = str(source) if isinstance(source, (str, os.PathLike)) else "dataset"
    if isinstance(source, (str, os.PathLike)):
        if not Path(source).is_dir():
            raise DataError(f"{source}: no such dataset directory")
        try:
            import datasets
        except ImportError:  # pragma: no cover
            raise DataError(
                f"{source}: reading a saved dataset needs `datasets`; pip install datasets"
            ) from None
        try:
            source = datasets.load_from_disk(str(source))
        except Exception as e:
            raise DataError(
                f"{name}: not a dataset saved with save_to_disk ({type(e).__name__})"
            ) from None
    if isinstance(source, dict):  # a DatasetDict (a dict subclass) or a plain {split: rows}
        splits = list(source.keys())
        if split is None:
            if len(splits) != 1:
                raise DataError(f"{name}: has splits {splits}; choose one with split=")
            split = splits[0]
        if split not in splits:
            raise DataError(f"{name}: no split {split!r}; available: {splits}")
        source = source[split]
        name = f"{name}[{split}]"
    elif split is not None and name == "dataset":
        name = f"dataset[{split}]"
    rows = list(source)
    if not rows:
        raise DataError(f"{name}: empty data set (no rows)")
    out = []
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(
                f"{name} row {i}: expected a mapping of fields, got {type(row).__name__}"
            )
        out.append(Record(dict(row), f"{name} row {i}"))
    return out


_HUB_PREFIX = "hf:"
#: One part of a hub repository id (the hub's own rule; no path separators, no "..").
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _split_files(files: list[Path], root: Path, split: str | None) -> list[Path]:
    """The data files of one split: a path part or file name that is the split's name
    (``train.jsonl``, ``data/train-00000-of-00001.parquet``, ``train/0.parquet``)."""

    def names(p: Path) -> set[str]:
        rel = p.relative_to(root)
        stem = rel.name.split(".")[0]
        return {*rel.parts[:-1], stem, stem.split("-")[0], stem.split("_")[0]}

    if split is not None:
        return [p for p in files if split in names(p)]
    train = [p for p in files if "train" in names(p)]
    return train or files


def read_hub_dataset(name: str, *, split: str | None = None) -> list[Record]:
    """Read a hub dataset ``org/name`` (``org/name:split``) from the Hugging Face cache, or
    download it when it is not cached and the hub may be used
    (:func:`jaxrl_llm.interop.hub_snapshot`).

    Its ``*.jsonl`` and ``*.parquet`` files are read with :func:`read_jsonl` /
    :func:`read_parquet`; the split (``split=``, the name's ``:split``, else ``train`` when
    some files are named for it, else every file) picks the files named for it.

    Raises:
      DataError: one line: not cached and offline (or the download failed), no data files,
        or no file of the split.
    """
    from jaxrl_llm.errors import ModelLoadError
    from jaxrl_llm.interop.hub import hub_snapshot

    repo, _, named = name.partition(":")
    split = named or split
    parts = repo.split("/")
    if not 1 <= len(parts) <= 2 or any(
        not p or p in (".", "..") or not _HUB_NAME.fullmatch(p) for p in parts
    ):
        raise DataError(
            f"{_HUB_PREFIX}{name}: not a hub dataset name; expected hf:org/name (letters, "
            f"digits, '-', '_', '.'), optionally :split"
        )
    try:
        root = hub_snapshot(repo, repo_type="dataset")
    except ModelLoadError as e:
        raise DataError(f"{_HUB_PREFIX}{e}") from None
    files = sorted(p for p in root.rglob("*") if p.suffix in (".jsonl", ".parquet") and p.is_file())
    if not files:
        raise DataError(f"{_HUB_PREFIX}{name}: {root} holds no .jsonl or .parquet data files")
    chosen = _split_files(files, root, split)
    if not chosen:
        raise DataError(
            f"{_HUB_PREFIX}{name}: no data file of split {split!r} in {root} (files: "
            f"{[str(p.relative_to(root)) for p in files][:5]})"
        )
    out: list[Record] = []
    for p in chosen:
        out.extend(read_jsonl(p) if p.suffix == ".jsonl" else read_parquet(p))
    return out


def read_records(source: Any, *, split: str | None = None) -> list[Record]:
    """Read any supported source, chosen by type / file suffix.

    ``*.jsonl`` → :func:`read_jsonl`; ``*.parquet`` → :func:`read_parquet`; a directory or a
    ``datasets`` object → :func:`read_hf`; ``hf:org/name`` → :func:`read_hub_dataset`; a list
    of dicts (in-memory) → records located as ``"examples[i]"``.
    """
    if isinstance(source, str) and source.startswith(_HUB_PREFIX):
        return read_hub_dataset(source[len(_HUB_PREFIX) :], split=split)
    if isinstance(source, list):
        if not source:
            raise DataError("examples: empty data set (no examples)")
        out = []
        for i, row in enumerate(source):
            if not isinstance(row, dict):
                raise DataError(f"examples[{i}]: expected a dict, got {type(row).__name__}")
            out.append(Record(row, f"examples[{i}]"))
        return out
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        try:
            p.resolve(strict=p.is_symlink())
        except (RuntimeError, OSError) as e:  # a symlink loop, a dangling link
            raise DataError(
                f"{p}: cannot be resolved ({getattr(e, 'strerror', None) or e}); a symlink "
                f"loop or a link to nothing? point the data at the file itself"
            ) from None
        if p.is_dir():
            return read_hf(p, split=split)
        if p.suffix == ".jsonl":
            return read_jsonl(p)
        if p.suffix == ".parquet":
            return read_parquet(p)
        raise DataError(
            f"{p}: unsupported data source; allowed: a .jsonl file, a .parquet "
            f"file, a directory saved with datasets' save_to_disk or hf:org/name"
        )
    return read_hf(source, split=split)

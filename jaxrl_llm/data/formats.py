"""Example formats, validated per example: the dataset types TRL defines, standard (text) and
conversational (message lists).

A format is a :class:`Format` member (what a trainer consumes); :func:`parse_example` turns one
raw :class:`~jaxrl_llm.data.readers.Record` into a small frozen dataclass, or raises
:class:`~jaxrl_llm.errors.DataError` naming the record's location (file + line) and the field.

Prompts are either plain strings or *conversational*: a tuple of ``{"role", "content"}``
messages (roles ``system`` / ``user`` / ``assistant`` / ``tool``). Completions are always
the assistant's text (a string); a completion given as a list of messages must be exactly one
assistant message.

The row shapes are TRL's (https://huggingface.co/docs/trl/dataset_formats; one example of
each in ``docs/data.md``), read by these formats:

- ``SFT``: language modelling, standard ``{"text"}`` (every token trained, EOS appended) or
  conversational ``{"messages"}`` (at least one prompt message and a final assistant message;
  which turns are trained is ``data.loss_on``, see :class:`~jaxrl_llm.data.LossOn`); or
  prompt-completion ``{"prompt", "completion"}``. ShareGPT's ``{"conversations": [{"from",
  "value"}]}`` (not a TRL type) is read as ``messages`` (:func:`sharegpt_messages`).
- ``PREFERENCE`` (DPO family, ORPO, SimPO, reward models): ``{"prompt", "chosen",
  "rejected"}``, or with an implicit prompt ``{"chosen", "rejected"}``: the prompt is their
  common beginning (:func:`split_implicit_prompt`).
- ``KTO``: unpaired preference ``{"prompt", "completion", "label"}`` (bool: desirable or not).
- ``PAIRWISE_RANK``: ``prompt``, ``responses`` (list, ≥ 2), ``scores`` (list of numbers,
  same length); not a TRL type.
- ``PROMPT`` (online RL): prompt-only ``{"prompt"}`` and any other fields, kept in ``extras``
  for reward functions (e.g. ``answer``).
- ``STEPWISE``: stepwise supervision ``{"prompt", "completions", "labels"}`` (one bool per
  step), validated and read; no trainer here consumes it yet (TRL's PRMTrainer does).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeGuard

from jaxrl_llm.data.readers import Record
from jaxrl_llm.errors import DataError

Message = Mapping[str, str]
Prompt = str | tuple  # a string or a tuple of message dicts

_ROLES = ("system", "user", "assistant", "tool")


class Format(str, enum.Enum):
    """The kinds of training data the trainers consume."""

    SFT = "sft"
    PREFERENCE = "preference"
    KTO = "kto"
    PAIRWISE_RANK = "pairwise_rank"
    PROMPT = "prompt"
    STEPWISE = "stepwise"


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """Supervised fine-tuning pair: the loss covers ``completion`` (+ EOS) only, or, for a
    ``messages`` row with ``data.loss_on: assistant``, every assistant turn.

    Attributes:
      prompt: a string or a tuple of message dicts.
      completion: the assistant's text (the last assistant message of a ``messages`` row).
      messages: the whole conversation of a ``messages`` row (None for prompt-completion).
    """

    prompt: Prompt
    completion: str
    messages: tuple | None = None


@dataclasses.dataclass(frozen=True)
class TextExample:
    """Standard language modelling (``{"text": ...}``): every token is a target."""

    text: str


@dataclasses.dataclass(frozen=True)
class StepwiseExample:
    """Stepwise (process) supervision: a prompt, the completion's steps and one label per
    step (True = the step is correct)."""

    prompt: Prompt
    completions: tuple[str, ...]
    labels: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class PreferenceExample:
    """A prompt with a preferred (``chosen``) and a dispreferred (``rejected``) completion."""

    prompt: Prompt
    chosen: str
    rejected: str


@dataclasses.dataclass(frozen=True)
class KTOExample:
    """A prompt, one completion and a binary desirability ``label`` (KTO, arXiv:2402.01306)."""

    prompt: Prompt
    completion: str
    label: bool


@dataclasses.dataclass(frozen=True)
class RankExample:
    """A prompt with several ``responses`` and one real-valued ``score`` each (higher = better)."""

    prompt: Prompt
    responses: tuple[str, ...]
    scores: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class PromptExample:
    """An RL prompt; ``extras`` holds every other field (e.g. ``answer``) for reward functions."""

    prompt: Prompt
    extras: Mapping[str, Any]


Example = (
    SFTExample
    | TextExample
    | PreferenceExample
    | KTOExample
    | RankExample
    | PromptExample
    | StepwiseExample
)


def is_conversational(prompt: Prompt) -> TypeGuard[tuple[Message, ...]]:
    """True when ``prompt`` is a tuple of messages (render it with the chat template)."""
    return isinstance(prompt, tuple)


# ----- field checks --------------------------------------------------------------------------


def _fail(record: Record, field: str, what: str) -> NoReturn:
    raise DataError(f"{record.location}: field {field!r}: {what}")


class _MissingField(DataError):
    """A required field is absent; :func:`parse_example` adds which format the record
    looks like instead."""


# The fields that identify each format (most specific first), for the hint on a missing field.
_SIGNATURES = (
    (Format.PREFERENCE, ("prompt", "chosen", "rejected")),
    (Format.STEPWISE, ("prompt", "completions", "labels")),
    (Format.PAIRWISE_RANK, ("prompt", "responses", "scores")),
    (Format.KTO, ("prompt", "completion", "label")),
    (Format.SFT, ("prompt", "completion")),
    (Format.SFT, ("messages",)),
    (Format.SFT, ("conversations",)),
    (Format.SFT, ("text",)),
    (Format.PREFERENCE, ("chosen", "rejected")),
)


#: Common public datasets' columns for a field this package reads, and the shape's name: a
#: missing field with one of these present gets the rename in its message.
_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "prompt": (
        ("question", "GSM8K's"),
        ("problem", "MATH's"),
        ("instruction", "Alpaca's (prompt = instruction + input, completion = output)"),
        ("query", "a query/response"),
        ("input", "an input/output"),
    ),
    "completion": (
        ("output", "Alpaca's (prompt = instruction + input, completion = output)"),
        ("response", "a query/response"),
        ("answer", "a question/answer"),
        ("solution", "MATH's"),
    ),
}


def _rename_hint(field: str, present: list[str]) -> str:
    """``"; rename 'question' to 'prompt' (GSM8K's shape)"`` when a common dataset's column
    stands where ``field`` is missing, else ``""``; ShareGPT's ``conversations`` gets how it
    is read."""
    if field == "prompt" and "conversations" in present:
        return (
            "; ShareGPT's shape (conversations of {from, value}) is read as SFT messages; for "
            "prompts, give 'prompt' as a list of {role, content} messages"
        )
    for column, shape in _RENAMES.get(field, ()):
        if column in present:
            return f"; rename {column!r} to {field!r} ({shape} shape)"
    return ""


def _get(record: Record, field: str) -> Any:
    if field not in record.fields or record.fields[field] is None:
        present = sorted(k for k, v in record.fields.items() if v is not None)
        raise _MissingField(
            f"{record.location}: missing field {field!r} (fields present: {present})"
            f"{_rename_hint(field, present)}"
        )
    return record.fields[field]


def _format_hint(record: Record, fmt: Format) -> str:
    """``"; ... look like preference data (prompt, chosen, rejected), not kto data"`` when the
    record's fields are another format's, else ``""``."""
    present = {k for k, v in record.fields.items() if v is not None}
    for other, fields in _SIGNATURES:
        if set(fields) <= present:
            if other == fmt:
                return ""
            return (
                f"; these fields look like {other.value} data ({', '.join(fields)}), "
                f"not {fmt.value} data: choose an algorithm that reads {other.value} data "
                f"or convert the file"
            )
    return ""


def _text(record: Record, field: str, value: Any) -> str:
    if not isinstance(value, str):
        _fail(record, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        _fail(record, field, "empty text")
    return value


def _messages(record: Record, field: str, value: Any) -> tuple:
    if not value:
        _fail(record, field, "empty list of messages")
    out = []
    for i, m in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(m, Mapping):
            _fail(record, where, f"expected a {{role, content}} object, got {type(m).__name__}")
        if m.get("role") not in _ROLES:
            _fail(record, f"{where}.role", f"expected one of {list(_ROLES)}, got {m.get('role')!r}")
        content = m.get("content")
        if content is None:
            _fail(record, f"{where}.content", "missing")
        _text(record, f"{where}.content", content)
        out.append({"role": m["role"], "content": content})
    return tuple(out)


def _prompt(record: Record, field: str = "prompt") -> Prompt:
    value = _get(record, field)
    if isinstance(value, str):
        return _text(record, field, value)
    if isinstance(value, (list, tuple)):
        msgs = _messages(record, field, value)
        if msgs[-1]["role"] == "assistant":
            _fail(
                record,
                field,
                "a conversational prompt must not end with an assistant "
                "message (that is the completion)",
            )
        return msgs
    _fail(record, field, f"expected a string or a list of messages, got {type(value).__name__}")


def _completion(record: Record, field: str, value: Any = None) -> str:
    value = _get(record, field) if value is None else value
    if isinstance(value, str):
        return _text(record, field, value)
    if isinstance(value, (list, tuple)):
        msgs = _messages(record, field, value)
        if len(msgs) != 1 or msgs[0]["role"] != "assistant":
            _fail(
                record, field, "a conversational completion must be exactly one assistant message"
            )
        return msgs[0]["content"]
    _fail(
        record,
        field,
        f"expected a string or a list with one assistant message, got {type(value).__name__}",
    )


#: ShareGPT's speaker names (``from``) as chat roles.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}


def sharegpt_messages(value: Any) -> Any:
    """ShareGPT's ``conversations`` (``[{"from": "human", "value": ...}, {"from": "gpt",
    ...}]``) as ``{"role", "content"}`` messages (:data:`SHAREGPT_ROLES`); an entry that is not
    of that shape is passed through unchanged, for the message checks to name."""
    if not isinstance(value, (list, tuple)):
        return value
    out = []
    for m in value:
        if isinstance(m, Mapping) and "from" in m and "role" not in m:
            m = {"role": SHAREGPT_ROLES.get(str(m["from"]), m["from"]), "content": m.get("value")}
        out.append(m)
    return out


def _sft(record: Record) -> SFTExample | TextExample:
    fields = record.fields
    if "text" in fields and not {"prompt", "messages", "conversations"} & set(fields):
        return TextExample(_text(record, "text", fields["text"]))
    if "conversations" in fields and not {"prompt", "messages"} & set(fields):
        fields = {**fields, "messages": sharegpt_messages(fields["conversations"])}
        record = Record(fields, record.location)
    if "messages" in fields and "prompt" not in fields:
        value = fields["messages"]
        if not isinstance(value, (list, tuple)):
            _fail(record, "messages", f"expected a list of messages, got {type(value).__name__}")
        msgs = _messages(record, "messages", value)
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
            _fail(
                record,
                "messages",
                "needs at least one prompt message followed by a final "
                "assistant message (the completion)",
            )
        return SFTExample(prompt=msgs[:-1], completion=msgs[-1]["content"], messages=msgs)
    return SFTExample(prompt=_prompt(record), completion=_completion(record, "completion"))


def split_implicit_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any] | None:
    """``(prompt, chosen, rejected)`` of an implicit-prompt preference pair, or None when the
    two share no beginning.

    Conversational pairs (message lists) split at the first message that differs. Text pairs
    split at the last whitespace before their first differing character (so completions
    start with that whitespace and no word is cut), or at that character when the shared
    part has no whitespace: ``"The sky is blue."`` / ``"The sky is green."`` ->
    ``("The sky is", " blue.", " green.")``, as TRL's ``extract_prompt``.
    """
    if isinstance(chosen, (list, tuple)) and isinstance(rejected, (list, tuple)):
        k = 0
        while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
            k += 1
        return (list(chosen[:k]), list(chosen[k:]), list(rejected[k:])) if k else None
    if not (isinstance(chosen, str) and isinstance(rejected, str)):
        return None
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    if k == len(chosen) or k == len(rejected):  # one is a prefix of the other
        return None
    spaces = [j for j in range(k) if chosen[j].isspace()]
    cut = spaces[-1] if spaces else k
    if cut <= 0 or not chosen[:cut].strip():
        return None
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _preference(record: Record) -> PreferenceExample:
    f = record.fields
    if f.get("prompt") is None and f.get("chosen") is not None and f.get("rejected") is not None:
        split = split_implicit_prompt(f["chosen"], f["rejected"])
        if split is None:
            _fail(
                record,
                "chosen",
                "no 'prompt' field, and 'chosen' and 'rejected' share no beginning to take as "
                "the prompt (an implicit prompt); add a 'prompt' field",
            )
        prompt, chosen, rejected = split
        record = Record(
            {**f, "prompt": prompt, "chosen": chosen, "rejected": rejected}, record.location
        )
    return PreferenceExample(
        prompt=_prompt(record),
        chosen=_completion(record, "chosen"),
        rejected=_completion(record, "rejected"),
    )


def _kto(record: Record) -> KTOExample:
    label = _get(record, "label")
    if not isinstance(label, bool):
        _fail(record, "label", f"expected true or false, got {label!r}")
    return KTOExample(
        prompt=_prompt(record), completion=_completion(record, "completion"), label=label
    )


def _rank(record: Record) -> RankExample:
    prompt = _prompt(record)
    responses = _get(record, "responses")
    scores = _get(record, "scores")
    if not isinstance(responses, (list, tuple)):
        _fail(record, "responses", f"expected a list, got {type(responses).__name__}")
    if not isinstance(scores, (list, tuple)):
        _fail(record, "scores", f"expected a list of numbers, got {type(scores).__name__}")
    if len(responses) < 2:
        _fail(record, "responses", f"need at least 2 responses to rank, got {len(responses)}")
    if len(scores) != len(responses):
        _fail(
            record,
            "scores",
            f"has {len(scores)} entries but 'responses' has {len(responses)}; they must match",
        )
    texts = tuple(_completion(record, f"responses[{i}]", r) for i, r in enumerate(responses))
    vals = []
    for i, s in enumerate(scores):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            _fail(record, f"scores[{i}]", f"expected a finite number, got {s!r}")
        vals.append(float(s))
    return RankExample(prompt=prompt, responses=texts, scores=tuple(vals))


def _stepwise(record: Record) -> StepwiseExample:
    prompt = _prompt(record)
    steps = _get(record, "completions")
    labels = _get(record, "labels")
    if not isinstance(steps, (list, tuple)) or not steps:
        _fail(record, "completions", "expected a non-empty list of steps (strings)")
    if not isinstance(labels, (list, tuple)) or len(labels) != len(steps):
        n = len(labels) if isinstance(labels, (list, tuple)) else type(labels).__name__
        _fail(record, "labels", f"expected one true/false per step ({len(steps)}), got {n}")
    texts = tuple(_text(record, f"completions[{i}]", t) for i, t in enumerate(steps))
    for i, label in enumerate(labels):
        if not isinstance(label, bool):
            _fail(record, f"labels[{i}]", f"expected true or false, got {label!r}")
    return StepwiseExample(prompt=prompt, completions=texts, labels=tuple(labels))


def _prompt_only(record: Record) -> PromptExample:
    prompt = _prompt(record)
    extras = {k: v for k, v in record.fields.items() if k != "prompt"}
    return PromptExample(prompt=prompt, extras=extras)


_PARSERS: dict[Format, Callable[[Record], Example]] = {
    Format.SFT: _sft,
    Format.PREFERENCE: _preference,
    Format.KTO: _kto,
    Format.PAIRWISE_RANK: _rank,
    Format.PROMPT: _prompt_only,
    Format.STEPWISE: _stepwise,
}


#: The columns that make a row a supervised (SFT) example rather than a prompt row.
SFT_COLUMNS = ("messages", "conversations", "completion")


def as_prompt_row(record: Record) -> Record:
    """A supervised row as a prompt row, for evaluating on a held-out SFT file: the turns
    before the last assistant turn are the ``prompt`` and the last assistant turn's text is
    the ``answer`` (a row's own ``answer`` column is kept); the other columns stay. A row that
    already has a ``prompt`` and no completion (a prompt row, a preference row) is returned
    as it is.

    Raises:
      DataError: a row that is neither a prompt row nor a valid SFT row (its location named).
    """
    fields = record.fields
    if not set(SFT_COLUMNS) & set(fields):
        return record
    example = _sft(record)
    if isinstance(example, TextExample):
        _fail(record, "text", "a plain-text row has no prompt to evaluate on")
    assert isinstance(example, SFTExample)
    rest = {k: v for k, v in fields.items() if k not in (*SFT_COLUMNS, "prompt")}
    prompt = list(example.prompt) if is_conversational(example.prompt) else example.prompt
    out = {"prompt": prompt, **rest}
    out.setdefault("answer", example.completion)
    return Record(out, record.location)


def parse_example(record: Record, fmt: Format | str) -> Example:
    """Validate one raw record as ``fmt`` and return its typed example.

    Raises:
      DataError: ``"<file> line <n>: field '<name>': <problem>"`` for a missing field, a wrong
        type, empty text, a bad message list or mismatched list lengths.
    """
    fmt = Format(fmt)
    try:
        return _PARSERS[fmt](record)
    except _MissingField as e:
        raise DataError(f"{e}{_format_hint(record, fmt)}") from None

"""Tokenisation of typed examples into prompt / completion token ids, and the length policy.

Conversational prompts (tuples of messages) are rendered with the tokenizer's chat template,
``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``, and the text is
encoded with ``add_special_tokens=False`` (the template already writes its own special tokens,
e.g. SmolLM2's ``<|im_start|>``). Plain-string prompts are encoded with
``add_special_tokens=True``, i.e. with whatever the tokenizer itself adds (Llama-style
tokenizers prepend BOS; SmolLM2's adds nothing); a trailing EOS that a tokenizer might append
to the prompt is removed. Completions are always encoded with ``add_special_tokens=False`` and
followed by one EOS token (``tokenizer.eos_token_id``; for chat models this is the end-of-turn
token, e.g. ``<|im_end|>``), so the completion span = completion tokens + EOS, which is exactly
what the loss mask covers and what a sampler emits before it stops.

Prompt and completion are tokenised separately (as TRL does), so the token boundary between
them is the one the sampler sees at generation time.

Which tokens of an SFT row are targets is :class:`LossOn` (``data.loss_on``): ``assistant``
(default) trains every assistant turn of a ``messages`` row, as TRL's ``assistant_only_loss``
does (:func:`encode_conversation`), and the completion of a prompt-completion row;
``completion`` trains only the last assistant message / the completion; ``all`` trains every
token. A ``text`` row (standard language modelling) trains every token, EOS appended.

A tokenizer is anything with ``encode(text, add_special_tokens=...) -> list[int]``,
``eos_token_id``, ``pad_token_id`` and (for conversational data) ``apply_chat_template``:
a Hugging Face tokenizer, or :class:`CharTokenizer` for fast tests.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Sequence
from typing import Any

from jaxrl_llm.data.formats import (
    Example,
    KTOExample,
    PreferenceExample,
    Prompt,
    PromptExample,
    RankExample,
    SFTExample,
    StepwiseExample,
    TextExample,
    is_conversational,
)
from jaxrl_llm.errors import ConfigError, DataError

log = logging.getLogger(__name__)


class CharTokenizer:
    """A tiny byte-level tokenizer for tests and demos (no files, deterministic).

    Ids: 0 = pad, 1 = BOS, 2 = EOS, 3 + b for each UTF-8 byte b (vocab size 259). Plain text
    gets BOS when ``add_special_tokens=True``. Its chat template writes
    ``"<role>: <content>\\n"`` per message and ``"assistant: "`` as the generation prompt.
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    vocab_size = 259
    # What apply_chat_template renders, as a Jinja template (for code that checks for one).
    chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """``{"input_ids": encode(text)}``, as a transformers tokenizer is called."""
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Bytes of ``text`` shifted by 3, with BOS first when ``add_special_tokens``."""
        ids = [b + 3 for b in text.encode("utf-8")]
        return ([self.bos_token_id] + ids) if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Inverse of :meth:`encode` (special tokens are always dropped)."""
        return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = False, tokenize: bool = False, **_: Any
    ):
        """Render messages as text (``tokenize=False``) or ids."""
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return self.encode(text, add_special_tokens=False) if tokenize else text


class LengthPolicy(str, enum.Enum):
    """What to do with an example longer than ``max_len`` tokens.

    ERROR raises a DataError naming the example; TRUNCATE cuts the prompt from the left (keeping
    at least one prompt token), then the completion(s) from the right; DROP skips it.
    """

    ERROR = "error"
    TRUNCATE = "truncate"
    DROP = "drop"


class LossOn(str, enum.Enum):
    """Which tokens of an SFT row are targets (``data.loss_on``).

    ASSISTANT: every assistant turn of a ``messages`` row (TRL's ``assistant_only_loss``),
    the completion of a prompt-completion row. COMPLETION: the last assistant message, or the
    completion. ALL: every token (the prompt too). ``text`` rows train every token under all
    three.
    """

    ASSISTANT = "assistant"
    COMPLETION = "completion"
    ALL = "all"


@dataclasses.dataclass(frozen=True)
class TokenizedSequence:
    """Prompt + one completion as token ids (SFT, and KTO with ``label``).

    ``completion_mask`` (same length as ``completion_ids``, 1 = target) marks which
    completion tokens are trained when not all of them are: a multi-turn conversation's
    user and tool turns between assistant turns are 0. None = every completion token.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    label: bool | None = None
    completion_mask: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class TokenizedPreference:
    """Prompt + chosen + rejected completions as token ids."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TokenizedRank:
    """Prompt + a group of responses with their scores."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[tuple[int, ...], ...]
    scores: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class TokenizedPrompt:
    """An RL prompt's ids, its extra fields for reward functions, and the prompt as the data
    row gave it (text or messages; a multi-turn environment's ``reset`` reads it)."""

    prompt_ids: tuple[int, ...]
    extras: Any
    prompt: Any = None


Tokenized = Any  # one of the Tokenized* dataclasses above


def encode_prompt(tokenizer: Any, prompt: Prompt) -> tuple[int, ...]:
    """Prompt token ids (chat template with generation prompt, or plain text; see module doc)."""
    if is_conversational(prompt):
        text = tokenizer.apply_chat_template(
            [dict(m) for m in prompt], add_generation_prompt=True, tokenize=False
        )
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:
        ids = list(tokenizer.encode(prompt, add_special_tokens=True))
        eos = tokenizer.eos_token_id
        if ids and eos is not None and ids[-1] == eos and len(ids) > 1:
            ids = ids[:-1]
    return tuple(int(i) for i in ids)


def encode_completion(tokenizer: Any, completion: str, *, add_eos: bool = True) -> tuple[int, ...]:
    """Completion token ids (no special tokens) followed by EOS when ``add_eos``."""
    ids = [int(i) for i in tokenizer.encode(completion, add_special_tokens=False)]
    if add_eos:
        if tokenizer.eos_token_id is None:
            raise ConfigError("tokenizer has no eos_token_id; set one or pass add_eos=False")
        ids.append(int(tokenizer.eos_token_id))
    return tuple(ids)


def _eos_text(tokenizer: Any) -> str | None:
    """The text of the EOS token as a chat template writes it (None when it has none)."""
    eos = getattr(tokenizer, "eos_token", None)
    return eos if isinstance(eos, str) and eos else None


def _turn_end(delta: str, content: str, eos_text: str | None) -> tuple[int, int]:
    """``(a, b)`` in an assistant turn's rendered text ``delta``: the trained text is
    ``delta[:a]`` followed by EOS, the untrained text resumes at ``b``."""
    if eos_text and eos_text in delta:
        a = delta.rindex(eos_text)
        return a, a + len(eos_text)
    i = delta.find(content)
    end = i + len(content) if i >= 0 else len(delta)
    return end, end


def encode_conversation(
    tokenizer: Any, messages: Sequence[Any]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A whole conversation as ``(prompt_ids, completion_ids, completion_mask)``, every
    assistant turn a target (TRL's ``assistant_only_loss``).

    The chat template renders the conversation once; each assistant turn's span is found by
    rendering its prefix with and without the turn (``messages[:j]`` with the generation
    prompt, ``messages[:j+1]``), and each span is encoded apart, as a prompt and a completion
    are. A turn's targets are its text followed by EOS, exactly what a single-turn row's
    completion is; the tokens between turns (user and tool turns, the next turn's header) are
    context. The prompt is everything before the first assistant turn; nothing after the
    last assistant turn is kept.

    Raises:
      DataError: the template does not render the turns as prefixes of one another (it
        rewrites earlier turns, e.g. drops their reasoning), or the prompt is empty.
    """
    msgs = [dict(m) for m in messages]
    render = lambda ms, gen: tokenizer.apply_chat_template(  # noqa: E731
        ms, add_generation_prompt=gen, tokenize=False
    )
    full = render(msgs, False)
    enc = lambda text: [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]  # noqa: E731
    eos, eos_text = tokenizer.eos_token_id, _eos_text(tokenizer)
    if eos is None:
        raise ConfigError("tokenizer has no eos_token_id; set one to train on conversations")
    pieces: list[tuple[list[int], int]] = []
    pos = 0
    for j, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before, through = render(msgs[:j], True), render(msgs[: j + 1], False)
        if not (len(before) >= pos and full.startswith(before) and full.startswith(through)):
            raise DataError(
                f"the chat template does not render message {j} as a continuation of "
                f"the earlier ones (it rewrites earlier turns), so assistant turns cannot be "
                f"located; use data.loss_on: completion"
            )
        a, b = _turn_end(through[len(before) :], m["content"], eos_text)
        pieces.append((enc(full[pos : len(before)]), 0))
        pieces.append((enc(through[len(before) : len(before) + a]) + [int(eos)], 1))
        pos = len(before) + b
    prompt = tuple(pieces[0][0])
    if not prompt:
        raise DataError("the conversation renders no prompt before its first reply")
    completion = [t for ids, _ in pieces[1:] for t in ids]
    mask = [flag for ids, flag in pieces[1:] for _ in ids]
    return prompt, tuple(completion), tuple(mask)


def _nonempty_prompt(ids: tuple[int, ...]) -> tuple[int, ...]:
    """A prompt must give at least one token: its last one predicts the first target."""
    if not ids:
        raise DataError(
            "the prompt tokenises to no tokens (does the tokenizer belong to this model and "
            "this data?)"
        )
    return ids


def _all_targets(prompt: Sequence[int], completion: Sequence[int]) -> TokenizedSequence:
    """Every token a target: only the first has no predecessor to be predicted from."""
    ids = (*prompt, *completion)
    if len(ids) < 2:
        raise DataError(f"an example of {len(ids)} token(s) has nothing to train on")
    return TokenizedSequence(tuple(ids[:1]), tuple(ids[1:]))


def _tokenize_sft(
    tokenizer: Any, example: SFTExample | TextExample, *, add_eos: bool, loss_on: LossOn
) -> TokenizedSequence:
    if isinstance(example, TextExample):
        ids = list(tokenizer.encode(example.text, add_special_tokens=True))
        eos = tokenizer.eos_token_id
        if ids and eos is not None and ids[-1] == eos:
            ids = ids[:-1]
        return _all_targets(ids, encode_completion(tokenizer, "", add_eos=add_eos))
    msgs = example.messages
    multi = msgs is not None and sum(m["role"] == "assistant" for m in msgs) > 1
    if msgs is not None and multi and loss_on != LossOn.COMPLETION:
        p, c, mask = encode_conversation(tokenizer, msgs)
        if loss_on == LossOn.ALL:
            return _all_targets(p, c)
        return TokenizedSequence(p, c, completion_mask=mask)
    p = _nonempty_prompt(encode_prompt(tokenizer, example.prompt))
    c = encode_completion(tokenizer, example.completion, add_eos=add_eos)
    return _all_targets(p, c) if loss_on == LossOn.ALL else TokenizedSequence(p, c)


def tokenize_example(
    tokenizer: Any,
    example: Example,
    *,
    add_eos: bool = True,
    loss_on: LossOn | str = LossOn.ASSISTANT,
) -> Tokenized:
    """Tokenise one typed example into the matching ``Tokenized*`` dataclass.

    ``loss_on`` (:class:`LossOn`) decides an SFT row's targets; other formats ignore it.

    Raises:
      DataError: a conversation whose assistant turns cannot be located (see
        :func:`encode_conversation`). ConfigError: a stepwise-supervision example (no trainer
        consumes one yet).
    """
    loss_on = LossOn(loss_on)
    if isinstance(example, (SFTExample, TextExample)):
        return _tokenize_sft(tokenizer, example, add_eos=add_eos, loss_on=loss_on)
    if isinstance(example, StepwiseExample):
        raise ConfigError(
            "stepwise-supervision data is read and validated, but no algorithm here trains on "
            "it yet; online algorithms read its 'prompt' as prompt-only data"
        )
    p = _nonempty_prompt(encode_prompt(tokenizer, example.prompt))
    enc = lambda c: encode_completion(tokenizer, c, add_eos=add_eos)  # noqa: E731
    if isinstance(example, KTOExample):
        return TokenizedSequence(p, enc(example.completion), label=example.label)
    if isinstance(example, PreferenceExample):
        return TokenizedPreference(p, enc(example.chosen), enc(example.rejected))
    if isinstance(example, RankExample):
        return TokenizedRank(p, tuple(enc(r) for r in example.responses), example.scores)
    if isinstance(example, PromptExample):
        return TokenizedPrompt(p, dict(example.extras), example.prompt)
    raise TypeError(f"not an example: {type(example).__name__}")


def _completions(t: Tokenized) -> list[tuple[int, ...]]:
    if isinstance(t, TokenizedSequence):
        return [t.completion_ids]
    if isinstance(t, TokenizedPreference):
        return [t.chosen_ids, t.rejected_ids]
    if isinstance(t, TokenizedRank):
        return list(t.response_ids)
    return []


def _with_completions(t: Tokenized, prompt: tuple, comps: list[tuple]) -> Tokenized:
    if isinstance(t, TokenizedSequence):
        mask = None if t.completion_mask is None else t.completion_mask[: len(comps[0])]
        return dataclasses.replace(
            t, prompt_ids=prompt, completion_ids=comps[0], completion_mask=mask
        )
    if isinstance(t, TokenizedPreference):
        return dataclasses.replace(t, prompt_ids=prompt, chosen_ids=comps[0], rejected_ids=comps[1])
    if isinstance(t, TokenizedRank):
        return dataclasses.replace(t, prompt_ids=prompt, response_ids=tuple(comps))
    return dataclasses.replace(t, prompt_ids=prompt)


def sequence_length(t: Tokenized) -> int:
    """Longest row this example produces: prompt + its longest completion."""
    comps = _completions(t)
    return len(t.prompt_ids) + (max(len(c) for c in comps) if comps else 0)


def truncate(t: Tokenized, max_len: int) -> Tokenized:
    """Fit every row of ``t`` into ``max_len`` tokens.

    The prompt is cut from the left (its end, next to the completion, is kept) down to
    ``max(1, max_len − longest completion)`` tokens; then each completion is cut from the right
    to ``max_len − len(prompt)`` tokens (a cut completion loses its EOS).
    """
    if max_len < 2 and _completions(t):
        raise ConfigError(f"max_len={max_len} leaves no room for a prompt and a completion")
    comps = _completions(t)
    longest = max((len(c) for c in comps), default=0)
    keep_prompt = max(1, max_len - longest) if comps else max_len
    prompt = t.prompt_ids[-keep_prompt:] if len(t.prompt_ids) > keep_prompt else t.prompt_ids
    room = max_len - len(prompt)
    return _with_completions(t, prompt, [c[:room] for c in comps])


def apply_length_policy(
    items: Sequence[Tokenized],
    *,
    max_len: int,
    policy: LengthPolicy | str = LengthPolicy.ERROR,
    locations: Sequence[str] | None = None,
    source: str | None = None,
) -> tuple[list[Tokenized], dict[str, int]]:
    """Enforce ``max_len`` on tokenised examples and count what happened.

    Args:
      items: tokenised examples.
      max_len: the longest allowed row (prompt + completion) in tokens.
      policy: :class:`LengthPolicy` (``"error"``, ``"truncate"``, ``"drop"``).
      locations: per-item source locations for error messages.
      source: the data set's name (e.g. its file) for the error when every example is dropped.

    Returns:
      (kept items, stats) with stats ``{"total", "kept", "truncated", "dropped"}``; the stats
      are also logged as one line.

    Raises:
      DataError: under ``"error"``, naming the first over-long example and its length.
    """
    policy = LengthPolicy(policy)
    if max_len <= 0:
        raise ConfigError(f"max_len must be positive, got {max_len}")
    out, truncated, dropped, shortest = [], 0, 0, None
    for i, t in enumerate(items):
        n = sequence_length(t)
        shortest = n if shortest is None else min(shortest, n)
        if n <= max_len:
            out.append(t)
            continue
        if policy == LengthPolicy.ERROR:
            where = locations[i] if locations is not None else f"example {i}"
            raise DataError(
                f"{where}: {n} tokens exceed max_len={max_len}; raise max_len or "
                f"use length_policy 'truncate' or 'drop'"
            )
        if policy == LengthPolicy.DROP:
            dropped += 1
            continue
        out.append(truncate(t, max_len))
        truncated += 1
    stats = {"total": len(items), "kept": len(out), "truncated": truncated, "dropped": dropped}
    log.info("length policy %s (max_len=%d): %s", policy.value, max_len, stats)
    if not out:
        raise DataError(
            f"{source + ': ' if source else ''}every example was dropped by "
            f"max_len={max_len} (length_policy 'drop'; the shortest has "
            f"{shortest} tokens); raise max_len or use length_policy 'truncate'"
        )
    return out, stats

"""Chat messages ↔ token ids for episodes that continue from their KV cache.

The opening messages are rendered with the tokenizer's chat template (generation prompt
included) and encoded without special tokens, as :func:`jaxrl_llm.data.encode_prompt` does.
An environment's reply is appended as the *difference* of two renderings — the conversation
with the reply and a generation prompt, minus the conversation without them — so the tokens
already in the cache (the policy's own tokens, exactly as sampled) are never re-tokenised:
token in, token out. The policy's turn ends with its stop token (for chat models the end of
turn, e.g. ``<|im_end|>``); the rest of what the template writes after an assistant message
(e.g. the newline after ``<|im_end|>``) is prepended to the reply.

Templates that re-render earlier turns differently once a later message exists (some strip
reasoning from old assistant turns) are refused with an :class:`~jaxrl_llm.envs.EnvError`:
their history is not a prefix of the longer rendering.

Tool descriptions (``tools=``, the OpenAI / Hugging Face JSON form) are passed to the template,
as TRL and transformers do, when an episode has them; :attr:`ChatCodec.renders_tools` says
whether the template writes them at all (many, SmolLM2's among them, ignore ``tools``).
"""

from __future__ import annotations

import functools
from typing import Any

from jaxrl_llm.envs.base import EnvError

_MARK = "\u2063MARK\u2063"


class ChatCodec:
    """Renders and encodes an episode's messages with ``tokenizer`` (see the module doc).

    Args:
      tokenizer: ``encode(text, add_special_tokens=...)``, ``decode`` and
        ``apply_chat_template(messages, add_generation_prompt=..., tokenize=False)``.
      stop_ids: the token ids a policy turn may end with (the sampler's stop tokens).
    """

    def __init__(self, tokenizer: Any, stop_ids: list[int] | tuple[int, ...]):
        self.tok = tokenizer
        probe = self.render(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}],
            generation_prompt=False,
        )
        at = probe.rfind(_MARK)
        if at < 0:
            raise EnvError("the tokenizer's chat template drops the assistant's message")
        self.after_turn = probe[at + len(_MARK) :]  # what follows an assistant message
        self.stop_text = {int(i): self._token_text(int(i)) for i in stop_ids}

    def _token_text(self, token: int) -> str:
        try:
            return self.tok.decode([token], skip_special_tokens=False)
        except TypeError:
            return self.tok.decode([token])

    def render(
        self, messages: list[dict], *, generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        """The chat template's text of ``messages`` (with ``tools``, when given)."""
        if tools:
            return self.tok.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
            )
        return self.tok.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the chat template writes ``tools=`` descriptions (probed once: a tool with
        an unlikely name must appear in the rendering)."""
        name = "probe_tool_7f3a9c"
        tool = {
            "type": "function",
            "function": {
                "name": name,
                "description": "A probe.",
                "parameters": {"type": "object", "properties": {}, "required": []},
            },
        }
        try:
            text = self.render(
                [{"role": "user", "content": "x"}], generation_prompt=True, tools=[tool]
            )
        except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
            return False
        return name in text

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template writes its own special tokens)."""
        try:
            return list(self.tok.encode(text, add_special_tokens=False))
        except TypeError:
            return list(self.tok.encode(text))

    def decode(self, ids: list[int]) -> str:
        """A policy turn's text (special tokens dropped)."""
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def opening(self, messages: list[dict], *, tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of an episode's opening messages (with the generation prompt)."""
        return self.encode(self.render(messages, generation_prompt=True, tools=tools))

    def reply(
        self,
        history: list[dict],
        new: list[dict],
        *,
        last_token: int,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Ids to append after the policy's turn that ended with ``last_token`` (its stop
        token): the end of that turn the template writes, ``new`` messages, and the next
        generation prompt. ``history`` ends with the policy's turn as an assistant message;
        ``tools`` are the episode's (the same in both renderings)."""
        before = self.render(history, generation_prompt=False, tools=tools)
        after = self.render(history + new, generation_prompt=True, tools=tools)
        if not after.startswith(before):
            raise EnvError(
                "the chat template renders the earlier turns differently once a reply is "
                "added; multi-turn episodes need a template whose history is a prefix"
            )
        gap = self.after_turn
        said = self.stop_text.get(int(last_token), "")
        if said and gap.startswith(said):
            gap = gap[len(said) :]
        if not before.endswith(self.after_turn):
            gap = ""  # the template wrote the turn's end differently here: trust the diff
        return self.encode(gap + after[len(before) :])

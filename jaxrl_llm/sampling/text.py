"""Text in, text out: tokenise prompts (optionally through the chat template), generate,
decode completions. Host-side helpers around :func:`jaxrl_llm.sampling.generate`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.errors import DataError
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.static_generate import Rollout, generate


def encode_prompts(tokenizer: Any, texts: Sequence[str], *, chat: bool = False) -> list[list[int]]:
    """Token ids of each prompt.

    With ``chat=True`` each text becomes one user message rendered by the tokenizer's chat
    template with ``add_generation_prompt=True`` (the assistant turn is opened); otherwise the
    text is tokenised as is, with the tokenizer's default special tokens.

    Args:
      tokenizer: a transformers tokenizer.
      texts: prompt strings.
      chat: apply the chat template.

    Returns:
      one list of token ids per prompt.
    """
    out = []
    for i, text in enumerate(texts):
        if chat:
            if not getattr(tokenizer, "chat_template", None):
                raise DataError(
                    "--chat needs a tokenizer with a chat template; this model's "
                    "tokenizer has none (drop --chat)"
                )
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        if len(ids) == 0:
            raise DataError(
                f"prompt {i} ({text!r}) tokenises to no tokens; give a non-empty prompt"
            )
        out.append([int(t) for t in ids])
    return out


def decode_completions(
    tokenizer: Any, rollout: Rollout, *, skip_special_tokens: bool = True
) -> list[str]:
    """Completion text of every row (``rollout.tokens`` cut at ``rollout.lengths``).

    Args:
      tokenizer: a transformers tokenizer.
      rollout: from :func:`jaxrl_llm.sampling.generate`.
      skip_special_tokens: drop EOS and other special tokens from the text.

    Returns:
      N strings, prompt-major (sample g of prompt b at index b·G + g).
    """
    tokens = np.asarray(rollout.tokens)
    lengths = np.asarray(rollout.lengths)
    return [
        tokenizer.decode(tokens[i, : lengths[i]].tolist(), skip_special_tokens=skip_special_tokens)
        for i in range(tokens.shape[0])
    ]


def generate_text(
    params,
    config: ModelConfig,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    chat: bool = False,
    sampling: SamplingConfig = SamplingConfig(),
    num_samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 128,
    generate_fn: Callable[..., Rollout] = generate,
) -> tuple[list[str], Rollout]:
    """Generate ``num_samples`` completions for each prompt text.

    Args:
      params, config: the model.
      tokenizer: its transformers tokenizer.
      texts: B prompt strings.
      chat: render each prompt as a user turn through the chat template.
      sampling, num_samples, seed, max_new_tokens: as :func:`jaxrl_llm.sampling.generate`.
      generate_fn: the engine, :func:`jaxrl_llm.sampling.generate` (static, default) or
        :func:`jaxrl_llm.sampling.generate_paged` (continuous batching, paged KV cache).

    Returns:
      (N = B·G completion strings, prompt-major; the underlying :class:`Rollout`).
    """
    prompts = encode_prompts(tokenizer, texts, chat=chat)
    out = generate_fn(
        params,
        config,
        prompts,
        sampling=sampling,
        num_samples=num_samples,
        seed=seed,
        max_new_tokens=max_new_tokens,
    )
    return decode_completions(tokenizer, out), out

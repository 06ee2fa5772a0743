"""Scoring with a learned reward model (a decoder with a scalar head).

The score of a sequence is the scalar head at its last real token, as in InstructGPT's reward
model (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155) and the Bradley–Terry models
trained by :func:`jaxrl_llm.objectives.bradley_terry_loss`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, apply
from jaxrl_llm.objectives import last_token_index


@functools.partial(jax.jit, static_argnames=("config",))
def reward_model_scores(
    params: Any, tokens: jax.Array, attention_mask: jax.Array, *, config: ModelConfig
) -> jax.Array:
    """Sequence scores r_b = head(h_{b, t_b}) at the last real token t_b of each row (jitted).

    Args:
      params: reward-model parameters (``config.num_labels == 1``).
      tokens: ``[B, T]`` int32 prompt + completion ids, left or right padded.
      attention_mask: ``[B, T]`` (1 = real token).
      config: the model's :class:`~jaxrl_llm.models.ModelConfig` (static).

    Returns:
      ``[B]`` float32 scores (higher is better).
    """
    chex.assert_rank([tokens, attention_mask], 2)
    chex.assert_equal_shape([tokens, attention_mask])
    scalar = apply(params, tokens, config=config, attention_mask=attention_mask).scalar
    if scalar is None:  # config.num_labels == 0
        raise ConfigError(
            "reward_model_scores: the model has no scalar head (config.num_labels must be 1)"
        )
    last = jnp.maximum(last_token_index(attention_mask), 0)  # a row with none: index 0
    return jnp.take_along_axis(scalar, last[:, None], axis=1)[:, 0].astype(jnp.float32)


def _bucket(n: int, minimum: int = 16) -> int:
    """Next power of two ≥ n (bounded set of compiled shapes)."""
    b = minimum
    while b < n:
        b *= 2
    return b


def make_reward_model_reward(
    params: Any,
    config: ModelConfig,
    *,
    tokenizer: Callable[[str], Sequence[int]] | None = None,
    token_field: str = "reward_token_ids",
    max_length: int = 2048,
    batch_size: int = 16,
    pad_id: int = 0,
    truncate: str = "left",
) -> Callable[..., list[float]]:
    """A reward function that scores ``prompt + completion`` with a reward model.

    Token ids come from ``tokenizer(prompt + completion)`` or, without a tokenizer, from the
    data field ``token_field`` (one id list per completion). Rows are right-padded to a
    power-of-two length and scored in batches of ``batch_size`` (padded to full batches) by
    the jitted :func:`reward_model_scores`, so only a few shapes are ever compiled.

    Args:
      params: reward-model parameters (frozen; passed in, never closed over by the jit).
      config: its ModelConfig (``num_labels == 1``).
      tokenizer: callable text → ids (e.g. ``lambda s: tok(s)["input_ids"]``) or None.
      token_field: data field with pre-tokenised ids when ``tokenizer`` is None.
      max_length: longer sequences are truncated (``truncate='left'`` keeps the end, where
        the score is read).
      batch_size: rows per forward pass.
      pad_id: id used for padding (masked out).

    Returns:
      ``fn(prompts, completions, **fields) -> list[float]``.
    """
    if not config.num_labels:
        raise ConfigError("reward model reward: config.num_labels must be 1 (a scalar head)")
    if truncate not in ("left", "right"):
        raise ConfigError(
            f"reward model reward: truncate must be 'left' or 'right', got {truncate!r}"
        )

    def reward_model_reward(prompts, completions, **fields):
        """Reward-model score of each prompt + completion."""
        if tokenizer is not None:
            ids = [list(tokenizer(p + c)) for p, c in zip(prompts, completions, strict=True)]
        elif token_field in fields:
            ids = [list(x) for x in fields[token_field]]
        else:
            raise ConfigError(
                f"reward model reward: pass a tokenizer or a data field "
                f"{token_field!r} with token ids"
            )
        ids = [x[-max_length:] if truncate == "left" else x[:max_length] for x in ids]
        scores: list[float] = []
        for s in range(0, len(ids), batch_size):
            chunk = ids[s : s + batch_size]
            t = _bucket(max(1, max(len(x) for x in chunk)))
            toks = np.full((batch_size, t), pad_id, np.int32)
            mask = np.zeros((batch_size, t), np.int32)
            for i, x in enumerate(chunk):
                toks[i, : len(x)] = x
                mask[i, : len(x)] = 1
            out = np.asarray(
                reward_model_scores(params, jnp.asarray(toks), jnp.asarray(mask), config=config)
            )
            scores.extend(float(v) if len(x) else float("nan") for v, x in zip(out, chunk))
        return scores

    return reward_model_reward

"""Shared helpers of the loss layer: batch access, per-token log-probs, exact reductions.

The batch layout every loss in :mod:`jaxrl_llm.losses` consumes is documented in the package
docstring. Everything here is a pure function of ``(params, batch)``; the model enters only
through ``apply_fn(params, input_ids, attention_mask=..., positions=..., segment_ids=...)
-> models.ModelOutputs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.ops.logprobs import logprobs_and_entropy_from_hidden, token_logprobs_from_hidden
from jaxrl_llm.ops.masked import masked_count, masked_sum, safe_divide

Batch = Mapping[str, Any]
ApplyFn = Callable[..., Any]

LOSS_DENOMINATOR_KEY = "loss_denominator"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogprobSettings:
    """How a loss computes per-token log-probs: no paper's hyperparameter, so not in any loss
    config. Every loss takes ``logprobs=LogprobSettings(...)`` beside its ``config``.

    Attributes:
      temperature: τ the log-probs refer to (log π_τ = log softmax(z / τ)); an online run sets
        it to the sampling temperature the behaviour log-probs were recorded with.
      chunk_size: time chunk of the log-prob computation (memory vs. speed).
      window: compute log-probs only for the last ``window`` columns (None = every column);
        an online run sets it to the generation length (see :func:`forward_logps`).
      prompt_group_size: G > 1 when rows come in groups of G sharing the columns before the
        window (a group-RL rollout batch): each prompt is computed once per group.
    """

    temperature: float = 1.0
    chunk_size: int = 128
    window: int | None = None
    prompt_group_size: int = 1

    def __post_init__(self):
        if not self.temperature > 0:
            raise ConfigError(f"log-prob temperature={self.temperature!r} must be > 0")
        if self.chunk_size < 1:
            raise ConfigError(f"logprobs.chunk_size={self.chunk_size!r} must be >= 1")
        if self.prompt_group_size < 1:
            raise ConfigError(f"prompt_group_size={self.prompt_group_size!r} must be >= 1")
        if self.prompt_group_size > 1 and self.window is None:
            raise ConfigError(
                "prompt_group_size > 1 needs a log-prob window (the completion "
                "length): the shared prompt is every column before it"
            )

    def kwargs(self) -> dict[str, Any]:
        """The settings as :func:`forward_logps` / :func:`sequence_logps` keywords."""
        return {
            "temperature": self.temperature,
            "chunk_size": self.chunk_size,
            "window": self.window,
            "prompt_group_size": self.prompt_group_size,
        }


DEFAULT_LOGPROBS = LogprobSettings()


def require(batch: Batch, key: str, *, loss: str, hint: str = "") -> jax.Array:
    """``batch[key]``; raise :class:`DataError` naming the key and the loss when missing."""
    if key not in batch:
        extra = f"; {hint}" if hint else ""
        raise DataError(
            f"batch key {key!r} is required by the {loss!r} loss but missing "
            f"(present: {sorted(batch)}){extra}"
        )
    return batch[key]


def shift_right(x_bt: jax.Array) -> jax.Array:
    """``[B, T-1]`` values that refer to token t+1 -> ``[B, T]`` aligned to token t (0 at t=0)."""
    return jnp.pad(x_bt, ((0, 0), (1, 0)))


def _model_inputs(batch: Batch, prefix: str, loss: str):
    ids = require(batch, f"{prefix}input_ids", loss=loss)
    chex.assert_rank(ids, 2)
    attn = batch.get(f"{prefix}attention_mask")
    if attn is None:
        attn = jnp.ones(ids.shape, jnp.int32)
    lmask = require(batch, f"{prefix}loss_mask", loss=loss)
    chex.assert_equal_shape([ids, attn, lmask])
    seg = batch.get(f"{prefix}segment_ids")
    pos = batch.get(f"{prefix}positions")
    return ids, attn, lmask, seg, pos


def forward_logps(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    prefix: str = "",
    temperature: float = 1.0,
    chunk_size: int = 128,
    with_entropy: bool = False,
    loss: str = "sequence_logps",
    window: int | None = None,
    prompt_group_size: int = 1,
) -> tuple[jax.Array, jax.Array | None, Any]:
    """One forward pass; per-token log-probs (and entropies) aligned to ``input_ids``.

    ``logp[b, t] = log π(x_t | x_<t)`` for t ≥ 1 where ``loss_mask[b, t] = 1``, else 0
    (token t is predicted from the hidden state at t−1). ``entropy[b, t]`` is the entropy of
    that same predictive distribution, 0 where masked. Never builds ``[B, T, V]`` logits.

    Args:
      params: model parameters.
      batch: a sequence batch (keys ``{prefix}input_ids``, ``{prefix}attention_mask``,
        ``{prefix}loss_mask``; optional ``{prefix}segment_ids``, ``{prefix}positions``).
      apply_fn: ``apply_fn(params, ids, attention_mask=, positions=, segment_ids=)``.
      prefix: key prefix (``"chosen_"``, ``"rejected_"``, ``"kl_"``).
      temperature: τ; log π_τ = log softmax(z / τ), as the sampler records it.
      chunk_size: time-chunk of the chunked log-prob op.
      with_entropy: also return per-token entropies.
      loss: name used in error messages.
      window: compute log-probs only for the last ``window`` columns (static). In an online-RL
        batch (left-padded prompt + completion) every target sits in the last
        ``max_new_tokens`` columns, so the unembedding — about a fifth of a 135M model's FLOPs
        per token — runs on the completion only. Columns before the window come back as 0;
        ``loss_mask`` must be 0 there.
      prompt_group_size: G > 1 declares that rows come in groups of G consecutive rows whose
        columns before the window (the prompt) are identical — a group-RL rollout batch. The
        model then computes each prompt once per group (``apply_fn(..., shared_prefix=(T −
        window, G))``, see :func:`jaxrl_llm.models.trunk_shared_prefix`); same log-probs up
        to float rounding, fewer FLOPs. Needs ``window``.
    A batch with ``{prefix}unpack_index`` is a packed one (:func:`jaxrl_llm.data.pack_rl_batch`):
    its model inputs are packed rows ``[R, L]`` and the results come back in the layout of
    its ``loss_mask [N, W]`` (``window`` is then the packer's; ``prompt_group_size`` must be 1).

    Returns:
      ``(logp [B, T] float32, entropy [B, T] or None, ModelOutputs)``.
    """
    if f"{prefix}unpack_index" in batch:
        if prompt_group_size > 1:
            raise ValueError(
                "a packed batch (unpack_index) has no shared prompt per group; "
                "use prompt_group_size=1 (logprobs.shared_prompt: false)"
            )
        return _packed_logps(
            params,
            batch,
            apply_fn=apply_fn,
            prefix=prefix,
            temperature=temperature,
            chunk_size=chunk_size,
            with_entropy=with_entropy,
            loss=loss,
        )
    ids, attn, lmask, seg, pos = _model_inputs(batch, prefix, loss)
    t = ids.shape[1]
    w = t - 1 if window is None else min(int(window), t - 1)
    if prompt_group_size > 1:
        if window is None:
            raise ValueError(
                "prompt_group_size > 1 needs a log-prob window (the completion "
                "columns); the prompt is every column before it"
            )
        out = apply_fn(
            params,
            ids,
            attention_mask=attn,
            positions=pos,
            segment_ids=seg,
            shared_prefix=(t - w, int(prompt_group_size)),
        )
    else:
        out = apply_fn(params, ids, attention_mask=attn, positions=pos, segment_ids=seg)
    _require_unembed(out, loss)
    hidden = out.hidden[:, t - 1 - w : t - 1]  # predicts targets ids[:, t-w:]
    targets = ids[:, t - w :]
    m = lmask.astype(bool)

    def place(x_bw):  # [B, w] values of columns t-w.. -> [B, T]
        return jnp.where(m, jnp.pad(x_bw, ((0, 0), (t - w, 0))), 0.0)

    lp, ent = _target_logps(
        hidden,
        out,
        targets,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    return place(lp), None if ent is None else place(ent), out


def _require_unembed(out: Any, loss: str) -> None:
    """Raise :class:`DataError` when ``apply_fn`` returned no unembedding (no log-probs)."""
    if out.unembed is None:
        raise DataError(
            f"the {loss!r} loss needs token log-probs but apply_fn returned no "
            "unembedding (a scalar-head-only model); use a language model"
        )


def _target_logps(
    hidden: jax.Array,
    out: Any,
    targets: jax.Array,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs of ``targets`` (and entropies when asked) predicted from ``hidden`` through
    the model output's unembedding and logit soft-cap; entropy is None when not asked."""
    kwargs = dict(temperature=temperature, chunk_size=chunk_size, softcap=out.logit_softcap)
    if with_entropy:
        return logprobs_and_entropy_from_hidden(hidden, out.unembed, targets, **kwargs)
    return token_logprobs_from_hidden(hidden, out.unembed, targets, **kwargs), None


def _packed_logps(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    prefix: str,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    loss: str,
) -> tuple[jax.Array, jax.Array | None, Any]:
    """:func:`forward_logps` of a batch whose model inputs are packed
    (:func:`jaxrl_llm.data.pack_rl_batch`): one forward over the packed rows ``[R, L]``, the
    log-probs (and entropies) of every packed token, then gathered back to the per-sequence
    layout of ``loss_mask [N, W]`` through ``unpack_index [N, W]`` (flat indices into the
    packed rows; a packed token at flat index j is predicted from the hidden state at j − 1,
    inside its own segment). The unembedding runs on whichever is fewer: the packed tokens
    (long completions), or the N × W targets after gathering their hidden states (short
    completions after long prompts, where the padded layout's window is cheaper)."""
    ids = require(batch, f"{prefix}input_ids", loss=loss)
    seg = require(batch, f"{prefix}segment_ids", loss=loss)
    pos = require(batch, f"{prefix}positions", loss=loss)
    attn = require(batch, f"{prefix}attention_mask", loss=loss)
    index = batch[f"{prefix}unpack_index"]
    lmask = require(batch, f"{prefix}loss_mask", loss=loss)
    chex.assert_rank([ids, index], 2)
    chex.assert_equal_shape([ids, seg, pos, attn])
    chex.assert_equal_shape([index, lmask])
    out = apply_fn(params, ids, attention_mask=attn, positions=pos, segment_ids=seg)
    _require_unembed(out, loss)
    m = lmask.astype(bool)
    r, length = ids.shape
    if index.size < r * (length - 1):
        # fewer targets than packed tokens (short completions after long prompts): gather the
        # predicting hidden states [N, W, D] first, unembed only those
        hidden = out.hidden.reshape(r * length, -1)[jnp.maximum(index - 1, 0)]
        targets = ids.reshape(-1)[index]

        def unpack(x_nw):
            return jnp.where(m, x_nw, 0.0)
    else:  # long completions: unembed every packed token, gather the log-probs
        hidden, targets = out.hidden[:, :-1], ids[:, 1:]

        def unpack(x_rl):  # [R, L-1] of targets 1.. -> [N, W]
            flat = jnp.pad(x_rl, ((0, 0), (1, 0))).reshape(-1)
            return jnp.where(m, flat[index], 0.0)

    lp, ent = _target_logps(
        hidden,
        out,
        targets,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    return unpack(lp), None if ent is None else unpack(ent), out


def sequence_logps(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    prefix: str = "",
    temperature: float = 1.0,
    chunk_size: int = 128,
    window: int | None = None,
    prompt_group_size: int = 1,
) -> jax.Array:
    """Per-token log-probs ``[B, T]`` of ``{prefix}input_ids`` under ``params``.

    ``out[b, t] = log π(x_t | x_<t)`` where ``{prefix}loss_mask[b, t] = 1``, else 0. This is
    the function the trainer uses for the reference model's (``ref_logp``) and the old
    policy's (``old_logp``) log-probs, so they come from the same compiled code as the loss.

    Args:
      params: model parameters (policy, reference or old policy).
      batch: see the package docstring; ``{prefix}input_ids``/``attention_mask``/``loss_mask``
        ``[B, T]``, optional ``{prefix}segment_ids``/``positions``.
      apply_fn: e.g. ``functools.partial(jaxrl_llm.models.apply, config=model_config)``.
      prefix: key prefix, e.g. ``"chosen_"``.
      temperature: sampling temperature τ the log-probs refer to.
      chunk_size: time chunk of the log-prob computation.
      window: only the last ``window`` columns (see :func:`forward_logps`).
      prompt_group_size: rows share their prompt in groups of this many (see
        :func:`forward_logps`).

    Returns:
      ``[B, T]`` float32.
    """
    logp, _, _ = forward_logps(
        params,
        batch,
        apply_fn=apply_fn,
        prefix=prefix,
        temperature=temperature,
        chunk_size=chunk_size,
        window=window,
        prompt_group_size=prompt_group_size,
    )
    return logp


def summed_logps(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    prefix: str = "",
    temperature: float = 1.0,
    chunk_size: int = 128,
) -> jax.Array:
    """Log π(y | x) = Σ_t log π(y_t | x, y_<t) over completion tokens, per row ``[B]``.

    The quantity DPO/KTO reference log-probs (``ref_chosen_logps`` ...) hold.
    Packed rows (``segment_ids``) are summed over the whole row.
    """
    logp = sequence_logps(
        params,
        batch,
        apply_fn=apply_fn,
        prefix=prefix,
        temperature=temperature,
        chunk_size=chunk_size,
    )
    return jnp.sum(logp, axis=-1)


def row_valid(loss_mask: jax.Array) -> jax.Array:
    """``[B]`` bool: the row has at least one completion token (padding rows are False)."""
    return jnp.any(loss_mask.astype(bool), axis=-1)


def finish(num: jax.Array, local_den: jax.Array, batch: Batch) -> jax.Array:
    """The scalar loss ``num / den``; ``den = batch["loss_denominator"]`` when present.

    With the global denominator passed to every micro-batch, Σ_k finish(num_k, ·) equals the
    full-batch loss, and so do the gradients (the denominator is a constant).
    """
    den = batch.get(LOSS_DENOMINATOR_KEY)
    den = local_den if den is None else jnp.asarray(den, jnp.float32)
    chex.assert_rank(den, 0)
    return safe_divide(num.astype(jnp.float32), den)


def masked_rows_mean(x_b: jax.Array, valid_b: jax.Array) -> jax.Array:
    """Mean of ``x`` over valid rows (0 when none): padding rows do not change metrics."""
    return safe_divide(masked_sum(x_b, valid_b), masked_count(valid_b))


def stack_pair(batch: Batch, loss: str) -> dict[str, jax.Array]:
    """Concatenate the chosen and rejected rows into one ``[2B, T]`` sequence batch.

    One forward pass over both halves (same T) instead of two.
    """
    out = {}
    for key in ("input_ids", "attention_mask", "loss_mask", "segment_ids", "positions"):
        c, r = batch.get(f"chosen_{key}"), batch.get(f"rejected_{key}")
        if c is None and r is None:
            continue
        if key in ("input_ids", "loss_mask"):
            c = require(batch, f"chosen_{key}", loss=loss)
            r = require(batch, f"rejected_{key}", loss=loss)
        if c is None or r is None:
            raise DataError(
                f"batch has only one of 'chosen_{key}' / 'rejected_{key}' "
                f"for the {loss!r} loss; give both or neither"
            )
        if c.shape != r.shape:
            raise DataError(
                f"'chosen_{key}' {c.shape} and 'rejected_{key}' {r.shape} must have "
                "the same shape [B, T]; pad both to the same T"
            )
        out[key] = jnp.concatenate([c, r], axis=0)
    return out

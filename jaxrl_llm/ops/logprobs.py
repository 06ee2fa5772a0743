"""Per-token log-probabilities and entropies, from logits or from hidden states in chunks.

Convention: ``logits[b, t]`` predicts ``tokens[b, t]`` (callers shift inputs and targets).
A temperature τ divides the logits before the softmax: log π_τ(y) = log softmax(z / τ)[y].
The sampler records log-probs with the same convention, so they match the losses exactly.

The ``*_from_hidden`` variants take the final hidden states ``[B, T, D]`` and the unembedding
matrix ``[D, V]`` and scan over chunks of the time axis, so the ``[B, T, V]`` float32 logits
tensor is never built: peak extra memory is ``[B, chunk, V]``. Under ``jax.grad`` the chunk
body is rematerialised (``jax.checkpoint``) so the backward pass does not keep every chunk's
logits alive either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models.layout import layout_mesh, place


def token_logprobs(logits: jax.Array, tokens: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Log softmax(logits / τ)[tokens], computed in float32.

    Args:
      logits: ``[..., V]`` any float dtype.
      tokens: ``[...]`` int token ids (same leading shape).
      temperature: τ > 0.

    Returns:
      ``[...]`` float32 log-probabilities.
    """
    z = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse


def entropy_from_logits(logits: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """H = −Σ_v p_v log p_v of softmax(logits / τ), per position, in float32."""
    z = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def _chunked_over_time(fn, hidden: jax.Array, tokens: jax.Array | None, chunk_size: int):
    """Apply ``fn(h_bcd, tok_bc) -> [B, c, ...]`` over time chunks with a scan; [B, T, ...]."""
    b, t, d = hidden.shape
    c = max(1, min(chunk_size, t))
    n = -(-t // c)
    pad = n * c - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    tok = jnp.zeros((b, t), jnp.int32) if tokens is None else tokens.astype(jnp.int32)
    tok = jnp.pad(tok, ((0, 0), (0, pad)))
    h = jnp.moveaxis(h.reshape(b, n, c, d), 1, 0)  # [n, B, c, D]
    tok = jnp.moveaxis(tok.reshape(b, n, c), 1, 0)  # [n, B, c]
    body = jax.checkpoint(fn)

    def step(carry, xs):
        return carry, body(*xs)

    _, out = jax.lax.scan(step, None, (h, tok))  # [n, B, c, ...]
    out = jnp.moveaxis(out, 0, 1)  # [B, n, c, ...]
    return out.reshape((b, n * c) + out.shape[3:])[:, :t]


def _logits(h_bcd: jax.Array, unembed: jax.Array, softcap: float | None) -> jax.Array:
    """One chunk's logits, soft-capped ``cap · tanh(z / cap)`` when ``softcap`` is set (Gemma
    2's final-logit cap, https://arxiv.org/abs/2408.00118).

    Under an ambient mesh (``jaxrl_llm.parallel.under_mesh``: the train step and the policy's
    ``apply_fn`` bind it on a mesh of more than one device) the chunk's hidden states and its
    ``[B, c, V]`` logits are placed by rows over the batch axes
    (:mod:`jaxrl_llm.models.layout`), so each device computes its own rows' logits against
    the gathered unembedding; with no mesh bound nothing is placed."""
    mesh = layout_mesh()
    h_bcd = place(h_bcd, ("batch", None, "embed"), mesh)
    logits = jnp.einsum("bcd,dv->bcv", h_bcd, unembed.astype(h_bcd.dtype))
    logits = place(logits, ("batch", None, "vocab"), mesh)
    if softcap is None:
        return logits
    z = logits.astype(jnp.float32)
    return softcap * jnp.tanh(z / softcap)


def token_logprobs_from_hidden(
    hidden: jax.Array,
    unembed: jax.Array,
    tokens: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = 128,
    softcap: float | None = None,
) -> jax.Array:
    """Log π(tokens) from hidden states ``[B, T, D]`` and unembedding ``[D, V]``, chunked.

    Equal to ``token_logprobs(cap(hidden @ unembed), tokens)`` without building
    ``[B, T, V]``; ``softcap`` is a final-logit soft cap (Gemma 2) or None.
    """

    def fn(h_bcd, tok_bc):
        logits = _logits(h_bcd, unembed, softcap)
        return token_logprobs(logits, tok_bc, temperature=temperature)

    return _chunked_over_time(fn, hidden, tokens, chunk_size)


def entropy_from_hidden(
    hidden: jax.Array,
    unembed: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = 128,
    softcap: float | None = None,
) -> jax.Array:
    """Per-position entropy ``[B, T]`` from hidden states and unembedding, chunked."""

    def fn(h_bcd, _):
        logits = _logits(h_bcd, unembed, softcap)
        return entropy_from_logits(logits, temperature=temperature)

    return _chunked_over_time(fn, hidden, None, chunk_size)


def logprobs_and_entropy_from_hidden(
    hidden: jax.Array,
    unembed: jax.Array,
    tokens: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = 128,
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Both log π(tokens) and the entropy, ``[B, T]`` each, in one chunked pass."""

    def fn(h_bcd, tok_bc):
        logits = _logits(h_bcd, unembed, softcap)
        z = logits.astype(jnp.float32) / temperature
        logp_all = jax.nn.log_softmax(z, axis=-1)
        lp = jnp.take_along_axis(logp_all, tok_bc[..., None], axis=-1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        return jnp.stack([lp, ent], axis=-1)

    out = _chunked_over_time(fn, hidden, tokens, chunk_size)  # [B, T, 2]
    return out[..., 0], out[..., 1]

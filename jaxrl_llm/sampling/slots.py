"""Device side of the continuous-batching engine: the slots' state and its jitted programs.

:class:`SlotState` holds S decode slots over a paged KV cache
(:mod:`jaxrl_llm.models.paged_store`; the host's page tables are :mod:`.paged`);
:func:`decode_chunk` runs up to n decode steps of every slot in one ``lax.while_loop``
(state donated, no host round trip per token); :func:`admit_rows` starts rows in free slots;
:func:`store_prompts` / :func:`cow_copy` write a prefilled prompt into pages and copy a
group's partial last prompt page per row; :func:`extend_row` runs appended tokens of one
sequence through its pages. The host scheduler is :mod:`.engine`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import (
    NULL_PAGE,
    ModelConfig,
    PagedKVCache,
    copy_pages,
    logits_from_hidden,
    paged_hybrid_trunk,
    paged_trunk_with_routing,
    write_prompt_pages,
)
from jaxrl_llm.sampling.filters import row_keys, select_tokens

_TRACES: collections.Counter = collections.Counter()
POW2 = tuple(2**i for i in range(16))


def engine_trace_counts() -> dict[str, int]:
    """Traces (= compiles) of the engine's jitted functions in this process: 'chunk',
    'admit', 'write_prompts', 'copy_pages', 'extend' (prefill is the static engine's,
    counted by :func:`jaxrl_llm.sampling.trace_counts`)."""
    return dict(_TRACES)


class SlotState(NamedTuple):
    """Device state of the S decode slots (a pytree, donated between calls).

    Attributes:
      cache: the page pool. table: ``[S, W]`` int32 page table of each slot's row.
      cache_len: ``[S]`` int32 filled slots = position of the next token fed.
      logits: ``[S, V]`` float32 logits of each slot's next token.
      keys: ``[S, 2]`` uint32 row keys; key_offset: ``[S]`` int32 the row's steps before this
        turn (the key of step t is fold_in(key, key_offset + t)).
      gen: ``[S]`` int32 tokens generated in this turn; budget: ``[S]`` int32 its limit.
      active: ``[S]`` bool still decoding; finished: ``[S]`` bool emitted a stop token.
      tokens, logprobs: ``[S, M]`` this turn's tokens and log π_τ.
      routing: ``[S, M, L, k]`` the experts a mixture of experts routed this turn's tokens
        to (recorded for routing replay, R3), or None when not recorded.
      conv, state: a hybrid stack's (Qwen3.5) Gated DeltaNet conv windows ``[L', S, W−1, C]``
        and delta-rule states ``[L', S, H_v, d_k, d_v]`` of each slot's row; None otherwise.
    """

    cache: PagedKVCache
    table: jax.Array
    cache_len: jax.Array
    logits: jax.Array
    keys: jax.Array
    key_offset: jax.Array
    gen: jax.Array
    budget: jax.Array
    active: jax.Array
    finished: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    routing: jax.Array | None = None
    conv: jax.Array | None = None
    state: jax.Array | None = None


def _step_rows(s: SlotState, stop, params, *, config, sampling, pad_id, width) -> SlotState:
    """One decode step of every slot: draw, record, feed the token through the paged cache."""
    alive = s.active
    keys = jax.vmap(jax.random.fold_in)(s.keys, (s.key_offset + s.gen).astype(jnp.uint32))
    tok, logp = select_tokens(s.logits, keys, sampling)
    tok = jnp.where(alive, tok, pad_id)
    rows = jnp.arange(tok.shape[0])
    col = jnp.where(alive, s.gen, s.tokens.shape[1])  # out of range = dropped
    tokens = s.tokens.at[rows, col].set(tok, mode="drop")
    logprobs = s.logprobs.at[rows, col].set(logp, mode="drop")
    stopped = alive & jnp.any(tok[:, None] == stop[None, :], axis=-1)
    gen = s.gen + alive.astype(jnp.int32)
    table = jnp.where(alive[:, None], s.table[:, :width], NULL_PAGE)  # idle rows write nowhere
    conv, state = s.conv, s.state
    experts = None
    if conv is not None and state is not None:  # a hybrid stack (Qwen3.5)
        # idle rows leave their recurrent state as it is
        rec = (conv, state)
        hidden, cache, (conv, state), experts = paged_hybrid_trunk(
            params, tok[:, None], s.cache, table, s.cache_len, rec, alive[:, None], config=config
        )
    else:
        hidden, cache, experts = paged_trunk_with_routing(
            params, tok[:, None], s.cache, table, s.cache_len, config=config
        )
    logits = logits_from_hidden(params, hidden, config)[:, 0]  # the trainer's (soft-capped)
    routing = s.routing
    if routing is not None and experts is not None:  # this token's experts (R3)
        routing = routing.at[rows, col].set(experts[:, 0].astype(routing.dtype), mode="drop")
    return s._replace(
        routing=routing,
        cache=cache,
        conv=conv,
        state=state,
        cache_len=s.cache_len + alive.astype(jnp.int32),
        logits=jnp.where(alive[:, None], logits, s.logits),
        gen=gen,
        active=alive & ~stopped & (gen < s.budget),
        finished=s.finished | stopped,
        tokens=tokens,
        logprobs=logprobs,
    )


@functools.partial(
    jax.jit, static_argnames=("config", "sampling", "pad_id", "width"), donate_argnums=(1,)
)
def decode_chunk(params, state, stop, n_steps, *, config, sampling, pad_id, width):
    """Up to ``n_steps`` decode steps of every active slot (stops early when none is active);
    ``width`` (static) = pages of each table attention gathers; ``state`` is donated."""
    _TRACES["chunk"] += 1
    step = functools.partial(
        _step_rows, config=config, sampling=sampling, pad_id=pad_id, width=width
    )

    def cond(c):
        i, s = c
        return (i < n_steps) & jnp.any(s.active)

    def body(c):
        i, s = c
        return i + 1, step(s, stop, params)

    return jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state))[1]


@functools.partial(jax.jit, donate_argnums=(0,))
def admit_rows(
    state: SlotState,
    slots,
    src_logits,
    src,
    seed,
    ids,
    key_offset,
    cache_len,
    budget,
    src_rec=None,
):
    """Start rows in ``slots`` (index S = padding, dropped): logits ``src_logits[src]``, keys
    ``row_keys(seed, ids[:, 0], ids[:, 1])``; a hybrid stack's recurrent state from
    ``src_rec`` = (conv ``[L', A, ...]``, state ``[L', A, ...]``) at ``src``."""
    _TRACES["admit"] += 1
    put = lambda x, y: x.at[slots].set(y, mode="drop")
    zeros = jnp.zeros_like(slots)
    if state.conv is not None and state.state is not None:
        conv = state.conv.at[:, slots].set(src_rec[0][:, src].astype(state.conv.dtype), mode="drop")
        new = state.state.at[:, slots].set(src_rec[1][:, src], mode="drop")
        state = state._replace(conv=conv, state=new)
    return state._replace(
        cache_len=put(state.cache_len, cache_len),
        logits=put(state.logits, src_logits[src]),
        keys=put(state.keys, row_keys(seed, ids[:, 0], ids[:, 1])),
        key_offset=put(state.key_offset, key_offset),
        gen=put(state.gen, zeros),
        budget=put(state.budget, budget),
        active=put(state.active, budget > 0),
        finished=put(state.finished, zeros.astype(bool)),
        tokens=put(state.tokens, jnp.zeros((slots.shape[0], state.tokens.shape[1]), jnp.int32)),
        logprobs=put(state.logprobs, jnp.zeros((slots.shape[0], state.tokens.shape[1]))),
    )


@functools.partial(jax.jit, donate_argnums=(0,))
def store_prompts(cache, dense_k, dense_v, lens, pages):
    """Jitted :func:`write_prompt_pages` (pool donated)."""
    _TRACES["write_prompts"] += 1
    return write_prompt_pages(cache, dense_k, dense_v, lens, pages)


@functools.partial(jax.jit, donate_argnums=(0,))
def cow_copy(cache, src, dst):
    """Jitted :func:`copy_pages` (pool donated)."""
    _TRACES["copy_pages"] += 1
    return copy_pages(cache, src, dst)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnums=(1,))
def extend_row(params, cache, tokens, table, start, last, rec=None, *, config):
    """Feed ``tokens`` ``[R, T]`` from slot ``start`` through the pages (pool donated);
    returns (float32 logits ``[R, V]`` after token ``last[r]``, the pool, the tokens' experts
    ``[R, T, L, k]`` int32 for a mixture of experts (else None), and a hybrid stack's rows'
    recurrent state ``rec`` = (conv, state) updated by tokens ≤ ``last[r]`` (else None))."""
    _TRACES["extend"] += 1
    experts = None
    if config.is_hybrid:
        valid = jnp.arange(tokens.shape[1])[None, :] <= last[:, None]
        hidden, cache, rec, experts = paged_hybrid_trunk(
            params, tokens, cache, table, start, rec, valid, config=config
        )
    else:
        hidden, cache, experts = paged_trunk_with_routing(
            params, tokens, cache, table, start, config=config
        )
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
    return logits_from_hidden(params, h, config)[:, 0], cache, experts, rec


def cast_for_rollout(params, config: ModelConfig, dtype: str | None):
    """Params and config in the rollout dtype ('float32' | 'bfloat16'; None = unchanged):
    weights, activations and the KV cache in ``dtype``; logits, the sampling softmax and the
    log-probs stay float32 (``preferred_element_type`` and :func:`select_tokens`)."""
    if dtype is None:
        return params, config
    config = dataclasses.replace(config, param_dtype=dtype, compute_dtype=dtype)
    jdt = config.param_jnp_dtype
    cast = lambda x: x.astype(jdt) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(cast, params), config

"""Jitted prefill + ``lax.while_loop`` decode over a preallocated KV cache, with the prompt
prefilled once per group.

Data flow for B prompts and G samples per prompt (N = B·G rows, prompt-major: row
``b·G + g`` is sample g of prompt b, so groups are consecutive rows of ``G``):

1. :func:`prefill` (jitted) runs the B left-padded prompts ``[B, P]`` through the model once,
   writing their keys/values into a cache with ``P + M`` slots, and returns the logits of the
   last prompt position.
2. :func:`init_decode_state` (jitted) repeats that cache and those logits G times along the
   batch (no G-fold prefill compute) and derives the per-row PRNG keys.
3. :func:`decode` (jitted, state donated) is one ``lax.while_loop``: sample a token per row,
   record its log-prob, mark rows that emitted a stop token as done, feed the tokens back
   through the model (one cache slot per step). It stops after ``max_new_tokens`` steps or
   as soon as every row is done; no host synchronisation happens inside the loop.

Prompt length P and generation length M are bucketed (:func:`bucket_length`), so the number
of compiled programs stays small; :func:`trace_counts` exposes how often each jitted function
was traced (one trace = one compile). The host side (:func:`rollout`, :func:`generate`, the
:class:`Rollout` record) is :mod:`.static_generate`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import (
    KVCache,
    ModelConfig,
    default_positions,
    init_cache,
    layered_cache_supported,
    softcap_logits,
    trunk_with_routing,
    unembedding,
)
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.filters import row_keys, select_tokens
from jaxrl_llm.sampling.rows import constrain_rows, per_row

_TRACES: collections.Counter = collections.Counter()


def trace_counts() -> dict[str, int]:
    """How many times each jitted sampling function has been traced (= compiled) in this
    process: keys 'prefill', 'init_decode_state', 'decode'."""
    return dict(_TRACES)


class DecodeState(NamedTuple):
    """Loop state of the decode ``while_loop`` (a pytree, donated between calls).

    Attributes:
      logits: ``[N, V]`` float32 logits for the next token of each row.
      tokens: ``[N, M]`` int32 generated tokens (pad after a row is done).
      logprobs: ``[N, M]`` float32 log π_τ of each generated token (0 after done).
      positions: ``[N]`` int32 RoPE position of the next token of each row.
      cache: the :class:`jaxrl_llm.models.KVCache` with ``P + M`` slots (layered, one
        buffer per layer, for a uniform stack: read in place, not sliced out of a stack).
      done: ``[N]`` bool, the row has emitted a stop token.
      lengths: ``[N]`` int32 generated tokens per row so far (incl. the stop token).
      keys: ``[N, 2]`` uint32 per-row PRNG keys (step t uses fold_in(key, t)).
      step: ``[]`` int32 decode steps taken.
      max_new_tokens: ``[]`` int32 step limit (≤ M; dynamic, so it does not recompile).
      routing: ``[N, M, L, k]`` (:func:`routing_dtype`) the experts a mixture of experts
        routed each fed token to, recorded for routing replay (R3); None = not recorded.
    """

    logits: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    positions: jax.Array
    cache: KVCache
    done: jax.Array
    lengths: jax.Array
    keys: jax.Array
    step: jax.Array
    max_new_tokens: jax.Array
    routing: jax.Array | None = None


def routing_dtype(config: ModelConfig):
    """The dtype recorded expert ids are kept in: int16 (up to 32767 experts), else int32."""
    return jnp.int16 if config.num_experts <= jnp.iinfo(jnp.int16).max else jnp.int32


# ----- prefill --------------------------------------------------------------------------------


def use_layered_cache(config: ModelConfig) -> bool:
    """Whether the static engine keeps one KV buffer per layer (unrolled layers) rather than
    one stacked buffer (scanned layers): on TPU and GPU, where a scanned decode step copies each
    layer's KV slice (issue 54), for every stack :func:`~jaxrl_llm.models.
    layered_cache_supported` admits. Not on CPU: there the unrolled layers only cost compile
    time (18% more on tests/sampling/test_gemma4_decode.py, 2-core host) and the tokens are the
    same (tests/sampling/test_decode.py runs both)."""
    return layered_cache_supported(config) and jax.default_backend() != "cpu"


@functools.partial(jax.jit, static_argnames=("config", "cache_len", "record_routing"))
def _prefill(
    params,
    prompt_tokens,
    prompt_mask,
    *,
    config: ModelConfig,
    cache_len: int,
    record_routing: bool = False,
):
    _TRACES["prefill"] += 1
    b, p = prompt_tokens.shape
    prompt_tokens, mask = constrain_rows(prompt_tokens), constrain_rows(prompt_mask.astype(bool))
    positions = default_positions(mask)
    hidden, cache, routing = trunk_with_routing(
        params,
        prompt_tokens,
        config=config,
        positions=positions,
        attention_mask=mask,
        cache=_cache_rows(init_cache(config, b, cache_len, layered=use_layered_cache(config))),
    )
    assert cache is not None  # a cache in, a cache out
    cache = _cache_rows(cache)
    if record_routing and routing is not None:
        routing = constrain_rows(routing.astype(routing_dtype(config)))
    else:
        routing = None
    w = unembedding(params, config).astype(hidden.dtype)
    last_logits = jnp.einsum("bd,dv->bv", hidden[:, -1], w, preferred_element_type=jnp.float32)
    last_logits = constrain_rows(last_logits, tensor=1)  # split as the weight is (decode)
    last_logits = softcap_logits(last_logits, config)  # Gemma 2's final cap; else identity
    next_positions = jnp.sum(mask, axis=-1).astype(jnp.int32)
    return constrain_rows(last_logits), cache, next_positions, routing


def _cache_rows(cache: KVCache) -> KVCache:
    """The cache with its rows over the ambient mesh's batch axes (:mod:`.rows`)."""
    return KVCache(
        # KV heads over tensor, as the layers' k/v projections leave them (no gather)
        k=jax.tree.map(lambda x: constrain_rows(x, axis=1, tensor=3), cache.k),
        v=jax.tree.map(lambda x: constrain_rows(x, axis=1, tensor=3), cache.v),
        mask=constrain_rows(cache.mask),
        positions=constrain_rows(cache.positions),
        index=cache.index,
        conv=None if cache.conv is None else constrain_rows(cache.conv, axis=1),
        state=None if cache.state is None else constrain_rows(cache.state, axis=1),
    )


def _state_rows(s: DecodeState) -> DecodeState:
    """The decode state with every row-major array over the ambient mesh's batch axes."""
    return s._replace(
        logits=constrain_rows(s.logits, tensor=1),  # vocabulary-split, as computed
        tokens=constrain_rows(s.tokens),
        logprobs=constrain_rows(s.logprobs),
        positions=constrain_rows(s.positions),
        cache=_cache_rows(s.cache),
        done=constrain_rows(s.done),
        lengths=constrain_rows(s.lengths),
        keys=constrain_rows(s.keys),
        routing=None if s.routing is None else constrain_rows(s.routing),
    )


def prefill(
    params, prompt_tokens: jax.Array, prompt_mask: jax.Array, *, config: ModelConfig, cache_len: int
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Run left-padded prompts through the model once and fill a fresh KV cache.

    Args:
      params: model parameters.
      prompt_tokens: ``[B, P]`` int32 left-padded prompts (the last column is a real token of
        every row).
      prompt_mask: ``[B, P]`` 1 on real tokens.
      config: the model config (static).
      cache_len: S ≥ P, cache slots to allocate (P + generation length).

    Returns:
      (last-position logits ``[B, V]`` float32, the cache with P slots filled and
      ``index = P``, next RoPE positions ``[B]`` = prompt lengths).
    """
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    if cache_len < prompt_tokens.shape[1]:
        raise ConfigError(
            f"cache_len={cache_len} is shorter than the prompt length {prompt_tokens.shape[1]}"
        )
    out = _prefill(params, prompt_tokens, prompt_mask, config=config, cache_len=int(cache_len))
    return out[:3]


def prefill_with_routing(
    params,
    prompt_tokens: jax.Array | np.ndarray,
    prompt_mask: jax.Array | np.ndarray,
    *,
    config: ModelConfig,
    cache_len: int,
) -> tuple[jax.Array, KVCache, jax.Array, jax.Array]:
    """:func:`prefill` that also returns the experts a mixture of experts routed each prompt
    token to, ``[B, P, L, k]`` (:func:`routing_dtype`), for routing replay (R3, Ma et al.
    2025, https://arxiv.org/abs/2510.11370).

    Raises:
      ConfigError: a dense model (no routing to record), or a short ``cache_len``.
    """
    if not config.is_moe:
        raise ConfigError("routing is recorded for mixture-of-experts models only")
    if cache_len < prompt_tokens.shape[1]:
        raise ConfigError(
            f"cache_len={cache_len} is shorter than the prompt length {prompt_tokens.shape[1]}"
        )
    return _prefill(
        params,
        prompt_tokens,
        prompt_mask,
        config=config,
        cache_len=int(cache_len),
        record_routing=True,
    )


# ----- group expansion ------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_samples", "gen_len", "routing_shape"))
def _init_decode_state(
    last_logits,
    cache,
    next_positions,
    prompt_ids,
    seed,
    max_new_tokens,
    *,
    num_samples: int,
    gen_len: int,
    routing_shape: tuple[int, int, str] | None = None,
):
    _TRACES["init_decode_state"] += 1
    g = num_samples
    rep = lambda x, axis: jnp.repeat(x, g, axis=axis, total_repeat_length=x.shape[axis] * g)
    cache = KVCache(
        k=jax.tree.map(lambda x: rep(x, 1), cache.k),  # stacked or layered (a tuple)
        v=jax.tree.map(lambda x: rep(x, 1), cache.v),
        mask=rep(cache.mask, 0),
        positions=rep(cache.positions, 0),
        index=cache.index,
        conv=None if cache.conv is None else rep(cache.conv, 1),  # hybrid stacks (Qwen3.5)
        state=None if cache.state is None else rep(cache.state, 1),
    )
    n = last_logits.shape[0] * g
    row_prompt = rep(prompt_ids.astype(jnp.int32), 0)
    row_sample = jnp.tile(jnp.arange(g, dtype=jnp.int32), last_logits.shape[0])
    state = DecodeState(
        logits=rep(last_logits, 0),
        tokens=jnp.zeros((n, gen_len), jnp.int32),
        logprobs=jnp.zeros((n, gen_len), jnp.float32),
        positions=rep(next_positions, 0),
        cache=cache,
        done=jnp.zeros((n,), bool),
        lengths=jnp.zeros((n,), jnp.int32),
        keys=row_keys(seed, row_prompt, row_sample),
        step=jnp.zeros((), jnp.int32),
        max_new_tokens=jnp.asarray(max_new_tokens, jnp.int32),
        routing=None
        if routing_shape is None
        else jnp.zeros((n, gen_len, *routing_shape[:2]), routing_shape[2]),
    )
    return _state_rows(state)


def init_decode_state(
    last_logits: jax.Array,
    cache: KVCache,
    next_positions: jax.Array,
    prompt_ids: jax.Array,
    *,
    seed: int,
    num_samples: int,
    gen_len: int,
    max_new_tokens: int,
    routing_config: ModelConfig | None = None,
) -> DecodeState:
    """Share each prefilled prompt with its G samples: repeat cache rows G times (prompt-major).

    Args:
      last_logits: ``[B, V]`` from :func:`prefill`.
      cache: the prefilled cache (B rows, ``P + gen_len`` slots).
      next_positions: ``[B]`` from :func:`prefill`.
      prompt_ids: ``[B]`` int ids that seed each prompt's PRNG keys.
      seed: int seed.
      num_samples: G ≥ 1 (static).
      gen_len: M, the (bucketed) width of the output buffers (static).
      max_new_tokens: the step limit, 1 ≤ max_new_tokens ≤ M (dynamic).
      routing_config: a mixture of experts' config: the state records each fed token's
        experts (:attr:`DecodeState.routing`); None = no record.

    Returns:
      the initial :class:`DecodeState` with N = B·G rows.
    """
    chex.assert_rank([last_logits, next_positions, prompt_ids], [2, 1, 1])
    if not 1 <= max_new_tokens <= gen_len:
        raise ConfigError(f"max_new_tokens must be in [1, {gen_len}], got {max_new_tokens}")
    if cache.max_len < gen_len:
        raise ConfigError(
            f"the cache has {cache.max_len} slots, fewer than gen_len={gen_len}; "
            "prefill with cache_len = prompt length + gen_len"
        )
    return _init_decode_state(
        last_logits,
        cache,
        next_positions,
        prompt_ids,
        jnp.asarray(seed, jnp.uint32),
        max_new_tokens,
        num_samples=int(num_samples),
        gen_len=int(gen_len),
        routing_shape=None
        if routing_config is None
        else (
            routing_config.num_layers,
            routing_config.num_experts_per_tok,
            jnp.dtype(routing_dtype(routing_config)).name,
        ),
    )


# ----- decode loop ----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("config", "sampling", "pad_id"), donate_argnums=(1,))
def _decode(
    params, state: DecodeState, stop, *, config: ModelConfig, sampling: SamplingConfig, pad_id: int
) -> DecodeState:
    _TRACES["decode"] += 1

    def cond(s: DecodeState):
        return (s.step < s.max_new_tokens) & ~jnp.all(s.done)

    def body(s: DecodeState):
        keys = jax.vmap(jax.random.fold_in, (0, None))(s.keys, s.step.astype(jnp.uint32))
        tok, logp = per_row(functools.partial(select_tokens, sampling=sampling), s.logits, keys)
        alive = ~s.done
        tok = jnp.where(alive, tok, pad_id)
        logp = jnp.where(alive, logp, 0.0)
        tokens = jax.lax.dynamic_update_slice_in_dim(s.tokens, tok[:, None], s.step, 1)
        logprobs = jax.lax.dynamic_update_slice_in_dim(s.logprobs, logp[:, None], s.step, 1)
        is_stop = jnp.any(tok[:, None] == stop[None, :], axis=-1)
        done = s.done | (alive & is_stop)
        lengths = s.lengths + alive.astype(jnp.int32)
        hidden, cache, experts = trunk_with_routing(
            params,
            tok[:, None],
            config=config,
            positions=s.positions[:, None],
            attention_mask=jnp.ones_like(tok, bool)[:, None],
            cache=s.cache,
        )
        assert cache is not None  # a cache in, a cache out
        routing = s.routing
        if routing is not None and experts is not None:  # token `step`'s experts (R3)
            routing = jax.lax.dynamic_update_slice_in_dim(
                routing, experts.astype(routing.dtype), s.step, 1
            )
        w = unembedding(params, config).astype(hidden.dtype)
        logits = jnp.einsum("bd,dv->bv", hidden[:, 0], w, preferred_element_type=jnp.float32)
        # computed split over the vocabulary as the weight is (tensor parallel): the step then
        # gathers [rows, V] logits for the token choice, never the [D, V] weight
        logits = softcap_logits(constrain_rows(logits, tensor=1), config)
        new = DecodeState(
            logits=logits,
            tokens=tokens,
            logprobs=logprobs,
            positions=s.positions + 1,
            cache=cache,
            done=done,
            lengths=lengths,
            keys=s.keys,
            step=s.step + 1,
            max_new_tokens=s.max_new_tokens,
            routing=routing,
        )
        return _state_rows(new)

    return jax.lax.while_loop(cond, body, _state_rows(state))


def decode(
    params,
    state: DecodeState,
    *,
    config: ModelConfig,
    sampling: SamplingConfig,
    stop_ids: tuple[int, ...],
    pad_id: int = 0,
) -> DecodeState:
    """Run the decode ``while_loop`` to ``max_new_tokens`` steps or until every row is done.

    The input ``state`` is donated (its buffers are reused for the output); do not use it
    after the call.

    Args:
      params: model parameters.
      state: from :func:`init_decode_state`.
      config: model config (static).
      sampling: :class:`SamplingConfig` (static).
      stop_ids: token ids that end a row (EOS and extra stop tokens; not static: changing
        them does not recompile). ``sampling.stop_token_ids`` is ignored here; use
        :func:`stop_token_ids` to combine it with the model's EOS ids.
      pad_id: token written after a row is done (static).

    Returns:
      the final :class:`DecodeState`.
    """
    chex.assert_rank([state.logits, state.tokens], 2)
    # Stop ids travel as a (dynamic) array padded to a multiple of 8 with −1, so changing them
    # does not recompile; they are removed from the static sampling config for the same reason.
    ids = sorted(set(int(t) for t in stop_ids))
    width = max(8, -(-len(ids) // 8) * 8)
    stop = np.full((width,), -1, np.int32)
    stop[: len(ids)] = ids
    static_sampling = dataclasses.replace(sampling, stop_token_ids=(), use_model_eos=False)
    return _decode(
        params,
        state,
        jnp.asarray(stop),
        config=config,
        sampling=static_sampling,
        pad_id=int(pad_id),
    )

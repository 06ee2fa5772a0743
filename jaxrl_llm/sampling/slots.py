"""Device side of the continuous-batching engine: the slots' state and its jitted programs.

:class:`SlotState` holds S decode slots over a paged KV cache
(:mod:`jaxrl_llm.models.paged_store`; the host's page tables are :mod:`.paged`);
:func:`decode_chunk` runs up to n decode steps of every slot in one ``lax.while_loop``
(state donated, no host round trip per token); :func:`prefill_prompts` prefills admitted
groups' prompts; :func:`admit_rows` starts rows in free slots; :func:`store_prompts` /
:func:`cow_copy` write a prefilled prompt into pages and copy a group's partial last prompt
page per row; :func:`extend_row` runs appended tokens of one sequence through its pages. The
host scheduler is :mod:`.engine`.

Replicas: every per-replica argument and result carries a leading replica dimension R (the
engine's data-parallel replicas, one per position on the sampler mesh's batch axes,
:func:`jaxrl_llm.sampling.rows.replica_axes`), split over those axes; the weights are shared,
laid out on the mesh as they are. Each program is ONE jitted program over the whole mesh: a
``jax.shard_map`` manual over the batch axes only (``tensor`` and the other axes stay
automatic, so weights split over ``tensor`` stay split), each shard running the one-replica
body on its own slice (:func:`over_replicas`). Page ids are replica-local: no shard reads
another's pages. So a mesh of R replicas compiles each program once, not R times. Without a
mesh R = 1 and the programs run the body on the single slice.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

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
from jaxrl_llm.sampling.decode import prefill, prefill_with_routing
from jaxrl_llm.sampling.filters import row_keys, select_tokens
from jaxrl_llm.sampling.rows import replica_axes

_TRACES: collections.Counter = collections.Counter()
POW2 = tuple(2**i for i in range(16))


def engine_trace_counts() -> dict[str, int]:
    """Traces (= compiles) of the engine's jitted functions in this process: 'chunk',
    'prefill', 'admit', 'write_prompts', 'copy_pages', 'extend' (each one program over all
    replicas; 'prefill' runs the static engine's prefill inside, which
    :func:`jaxrl_llm.sampling.trace_counts` counts too)."""
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


def over_replicas(fn: Callable[..., Any], mesh: Mesh | None, shared: tuple[int, ...] = ()):
    """``fn``, one replica's body, run on every replica's slice of its arguments.

    Arguments at the positions in ``shared`` (the weights, a seed, a step count) are passed
    whole; every other argument and every result carries a leading replica dimension R. On a
    mesh whose batch axes have R > 1 positions this is a ``jax.shard_map`` manual over those
    axes only (:func:`jaxrl_llm.sampling.rows.replica_axes`; the other axes, ``tensor``
    among them, stay automatic), each shard calling ``fn`` on its own ``[1, ...]`` slice with
    the leading dimension dropped; otherwise (R = 1) ``fn`` on the one slice.
    """

    def local(*args):
        args = tuple(
            a if i in shared else jax.tree.map(lambda x: x[0], a) for i, a in enumerate(args)
        )
        return jax.tree.map(lambda x: x[None], fn(*args))

    axes = replica_axes(mesh)
    if mesh is None or not axes:
        return local
    rep = PartitionSpec(axes)

    def run(*args):
        specs = tuple(PartitionSpec() if i in shared else rep for i in range(len(args)))
        # no collective crosses the replica axes (each shard is a whole replica), so the
        # body need not type its values as varying over them (the model's fresh caches)
        return jax.shard_map(
            local, mesh=mesh, in_specs=specs, out_specs=rep, axis_names=set(axes), check_vma=False
        )(*args)

    return run


def replica_shardings(tree: Any, mesh: Mesh) -> Any:
    """Shardings of per-replica arrays (``tree`` of arrays or shapes, replica dimension
    first): that dimension over the mesh's batch axes, the rest whole, except a page pool's
    KV heads (:class:`PagedKVCache` ``[R, L, P, Z, K, E]``), over ``tensor`` where it
    divides them (as the layers' k/v projections leave them)."""
    axes = replica_axes(mesh)
    first = axes if axes else None
    t = int(dict(mesh.shape).get("tensor", 1))

    def one(x, kv: int | None = None):
        spec: list[Any] = [first] + [None] * (len(x.shape) - 1)
        if kv is not None and t > 1 and x.shape[kv] % t == 0:
            spec[kv] = "tensor"
        return NamedSharding(mesh, PartitionSpec(*spec))

    def leaf(x):
        if isinstance(x, PagedKVCache):
            return PagedKVCache(k=one(x.k, 4), v=one(x.v, 4))
        return one(x)

    return jax.tree.map(leaf, tree, is_leaf=lambda x: isinstance(x, PagedKVCache))


def _pin(tree: Any, mesh: Mesh | None) -> Any:
    """Per-replica results in their :func:`replica_shardings` (the same layout every call,
    so the next call's inputs match the last's and nothing recompiles)."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, replica_shardings(tree, mesh))


@functools.partial(
    jax.jit,
    static_argnames=("config", "sampling", "pad_id", "width", "mesh"),
    donate_argnums=(1,),
)
def decode_chunk(params, state, stop, n_steps, *, config, sampling, pad_id, width, mesh=None):
    """Up to ``n_steps`` decode steps of every active slot of every replica (each replica
    stops early when none of its slots is active); ``state`` ``[R, ...]`` per leaf, donated;
    ``width`` (static) = pages of each table attention gathers."""
    _TRACES["chunk"] += 1
    step = functools.partial(
        _step_rows, config=config, sampling=sampling, pad_id=pad_id, width=width
    )

    def chunk(params, state, stop, n_steps):
        def cond(c):
            i, s = c
            return (i < n_steps) & jnp.any(s.active)

        def body(c):
            i, s = c
            return i + 1, step(s, stop, params)

        return jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state))[1]

    out = over_replicas(chunk, mesh, shared=(0, 2, 3))(params, state, stop, n_steps)
    return _pin(out, mesh)


@functools.partial(jax.jit, static_argnames=("config", "cache_len", "record_routing", "mesh"))
def prefill_prompts(params, tokens, mask, *, config, cache_len, record_routing, mesh=None):
    """Each replica's admitted prompts ``tokens`` / ``mask`` ``[R, A, P]`` (left-padded)
    prefilled (:func:`jaxrl_llm.sampling.prefill`): (float32 last logits ``[R, A, V]``, the
    dense keys and values ``[R, L, A, P, K, E]``, a hybrid stack's recurrent state
    (conv, state) ``[R, L', A, ...]`` or None, the prompt tokens' experts ``[R, A, P, L, k]``
    with ``record_routing`` or None)."""
    _TRACES["prefill"] += 1

    def one(params, tokens, mask):
        routing = None
        if record_routing:
            logits, dense, _, routing = prefill_with_routing(
                params, tokens, mask, config=config, cache_len=cache_len
            )
        else:
            logits, dense, _ = prefill(params, tokens, mask, config=config, cache_len=cache_len)
        rec = (dense.conv, dense.state) if config.is_hybrid else None
        return logits, *dense.stacked_kv(), rec, routing  # stacked once for the page writes

    return _pin(over_replicas(one, mesh, shared=(0,))(params, tokens, mask), mesh)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnums=(0,))
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
    *,
    mesh=None,
):
    """Start rows in ``slots`` ``[R, S]`` (index S = padding, dropped): logits
    ``src_logits[src]``, keys ``row_keys(seed, ids[..., 0], ids[..., 1])``; a hybrid stack's
    recurrent state from ``src_rec`` = (conv ``[R, L', A, ...]``, state ``[R, L', A, ...]``)
    at ``src``. Every argument but ``seed`` is per replica; ``state`` is donated."""
    _TRACES["admit"] += 1

    def one(state, slots, src_logits, src, seed, ids, key_offset, cache_len, budget, src_rec):
        put = lambda x, y: x.at[slots].set(y, mode="drop")
        zeros = jnp.zeros_like(slots)
        if state.conv is not None and state.state is not None:
            conv = state.conv.at[:, slots].set(
                src_rec[0][:, src].astype(state.conv.dtype), mode="drop"
            )
            new = state.state.at[:, slots].set(src_rec[1][:, src], mode="drop")
            state = state._replace(conv=conv, state=new)
        m = state.tokens.shape[1]
        return state._replace(
            cache_len=put(state.cache_len, cache_len),
            logits=put(state.logits, src_logits[src]),
            keys=put(state.keys, row_keys(seed, ids[:, 0], ids[:, 1])),
            key_offset=put(state.key_offset, key_offset),
            gen=put(state.gen, zeros),
            budget=put(state.budget, budget),
            active=put(state.active, budget > 0),
            finished=put(state.finished, zeros.astype(bool)),
            tokens=put(state.tokens, jnp.zeros((slots.shape[0], m), jnp.int32)),
            logprobs=put(state.logprobs, jnp.zeros((slots.shape[0], m))),
        )

    args = (state, slots, src_logits, src, seed, ids, key_offset, cache_len, budget, src_rec)
    return _pin(over_replicas(one, mesh, shared=(4,))(*args), mesh)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnums=(0,))
def store_prompts(cache, dense_k, dense_v, lens, pages, *, mesh=None):
    """Jitted :func:`write_prompt_pages` of every replica (pool donated)."""
    _TRACES["write_prompts"] += 1
    out = over_replicas(write_prompt_pages, mesh)(cache, dense_k, dense_v, lens, pages)
    return _pin(out, mesh)


@functools.partial(jax.jit, static_argnames=("mesh",), donate_argnums=(0,))
def cow_copy(cache, src, dst, *, mesh=None):
    """Jitted :func:`copy_pages` of every replica (pool donated)."""
    _TRACES["copy_pages"] += 1
    return _pin(over_replicas(copy_pages, mesh)(cache, src, dst), mesh)


@functools.partial(jax.jit, static_argnames=("config", "mesh"), donate_argnums=(1,))
def extend_row(params, cache, tokens, table, start, last, rec=None, *, config, mesh=None):
    """Feed each replica's ``tokens`` ``[R, B, T]`` from slot ``start`` ``[R, B]`` through the
    pages ``table`` ``[R, B, W]`` (pool donated); returns (float32 logits ``[R, B, V]`` after
    token ``last[r, b]``, the pool, the tokens' experts ``[R, B, T, L, k]`` int32 for a
    mixture of experts (else None), and a hybrid stack's rows' recurrent state ``rec`` =
    (conv, state) ``[R, L', B, ...]`` updated by tokens ≤ ``last`` (else None))."""
    _TRACES["extend"] += 1

    def one(params, cache, tokens, table, start, last, rec):
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

    out = over_replicas(one, mesh, shared=(0,))(params, cache, tokens, table, start, last, rec)
    return _pin(out, mesh)


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

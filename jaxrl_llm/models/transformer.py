"""A pure-function Llama- and Gemma-family decoder with an explicit KV cache: the trunks and the
training-time forward.

Parameters are a plain nested dict (:mod:`jaxrl_llm.models.params`: their shapes, logical axes
and initialisation); per-layer weights are stacked along a leading ``layers`` axis and the
layers run under ``lax.scan`` (one compiled layer body, fast compiles, a natural place for
rematerialisation). The layer itself is :func:`jaxrl_llm.models.layer.decoder_layer`, over a
store of earlier keys/values, and :func:`jaxrl_llm.models.layer_stack.stack` runs it over the
L layers; the trunks here build its stores: no cache (training) or a dense :class:`KVCache`
(:func:`trunk`), a group's shared prompt (:func:`trunk_shared_prefix`); the paged engine's
trunk (:func:`jaxrl_llm.models.paged_trunk`) builds pages.

Shapes use dimension letters: B batch, T new tokens, S cache slots, D model width, H query
heads, K key/value heads, G = H // K query heads per KV head, E head dim, F MLP width, V vocab,
L layers.

The KV cache (:class:`KVCache`) is an explicit pytree passed in and returned; slot ``s`` of the
cache holds the token written at step ``s`` for every row, ``mask[b, s]`` says whether that
slot holds a real token of row ``b``. RoPE positions are per row and passed explicitly, so left
padding and per-row prompt lengths are handled by (positions, mask), never by shifting data.

Per-layer attention types (Gemma 2 / 3: local sliding-window layers with their own RoPE base
interleaved with global layers, ``config.attn.layer_types``) ride in the one layer scan: the scan
also carries the layer index, and the two places that differ by type look their layer's
values up in small constant tables built from the static config (:func:`layer_windows`,
:func:`layer_rope_inv_freq`, in :mod:`jaxrl_llm.models.positions`). A global layer's "window" is
:data:`~jaxrl_llm.models.positions.NO_WINDOW`, larger than any
position, so every layer runs the same traced program (one compiled layer body, as before)
and the KV cache stays dense: a local layer keeps all slots and masks out the old ones.

Mixture of experts (Qwen3-MoE, Mixtral; ``config.moe.num_experts > 0``): every layer's MLP is the
sparse block of :mod:`jaxrl_llm.models.moe` (router ``[L, D, X]``, experts ``[L, X, D, F_e]``
with the logical axis ``experts``). The layer scan also returns each block's routing
statistics, and :func:`apply` pools them into the load-balancing loss
(:attr:`ModelOutputs.router_aux_loss`). A MoE layer's parameters differ from a dense one's,
so a config is all-sparse or all-dense.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models import attention as attn_lib
from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.gated_deltanet import (
    FreshState,
    GroupPromptState,
    RecurrentState,
    SharedPromptState,
    init_recurrent_state,
)
from jaxrl_llm.models.kv_stores import (
    DenseCache,
    GroupPrompt,
    KVShared,
    NoCache,
    SharedPrompt,
    empty_held_kv,
    unshare_kv,
)
from jaxrl_llm.models.layer import BTD, apply_norm
from jaxrl_llm.models.layer_stack import LayerStores, NewTokens, Stores, stack
from jaxrl_llm.models.layout import layout_mesh, place
from jaxrl_llm.models.options import LayerType
from jaxrl_llm.models.params import Params


class KVCache(NamedTuple):
    """Explicit key/value cache (and, for a hybrid stack, the LINEAR layers' recurrent state).

    Attributes:
      k, v: ``[L, B, S, K, E]`` keys (after RoPE) and values; in a hybrid stack L counts the
        softmax-attention layers only.
      mask: ``[B, S]`` bool, slot holds a real token of that row.
      positions: ``[B, S]`` int32 RoPE position of the token in each slot (for sliding windows).
      index: ``[]`` int32, the next slot to write.
      conv, state: a hybrid stack's (``config.is_hybrid``) Gated DeltaNet conv windows
        ``[L', B, W−1, C]`` and delta-rule states ``[L', B, H_v, d_k, d_v]`` float32
        (:class:`~jaxrl_llm.models.gated_deltanet.RecurrentState`); None otherwise.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    positions: jax.Array
    index: jax.Array  # type: ignore[assignment]  # shadows tuple.index; fine at run time
    conv: jax.Array | None = None
    state: jax.Array | None = None

    @property
    def max_len(self) -> int:
        """Number of slots S."""
        return self.k.shape[2]


class ModelOutputs(NamedTuple):
    """What the loss layer needs from a forward pass, without materialising logits.

    Attributes:
      hidden: ``[B, T, D]`` final-normed hidden states.
      unembed: ``[D, V]`` output projection (the embedding's transpose when tied), or None
        for a scalar-head model that has no language-model head.
      scalar: ``[B, T]`` scalar-head output (value / reward) or None.
      logit_softcap: the final-logit soft cap (Gemma 2) that logits computed from ``hidden``
        and ``unembed`` must go through (``cap · tanh(z / cap)``), or None.
      router_aux_loss: ``[]`` float32, a mixture of experts' load-balancing loss over this
        forward's real tokens (:func:`jaxrl_llm.models.moe.load_balancing_loss`, before any
        coefficient), or None for a dense model.
      routing_mismatch: ``[]`` float32, with a recorded routing (``apply(routing=...)``):
        the fraction of this forward's routing decisions (real token × layer × slot) whose
        expert is not among the recorded ones (0 under replay); None otherwise.
      routing_own_mismatch: ``[]`` float32, the same fraction for the forward's own top-k
        (what it would have routed to without replay); None without a recorded routing.
    """

    hidden: jax.Array
    unembed: jax.Array | None
    scalar: jax.Array | None
    logit_softcap: float | None = None
    router_aux_loss: jax.Array | None = None
    routing_mismatch: jax.Array | None = None
    routing_own_mismatch: jax.Array | None = None


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache with ``max_len`` slots for ``batch_size`` rows."""
    dtype = config.compute_jnp_dtype if dtype is None else dtype
    n = config.num_kv_layers  # not the KV-shared layers (Gemma 4): they read their source's
    shape = (n, batch_size, max_len, config.store_kv_heads, config.store_head_dim)
    conv, state = (
        init_recurrent_state(config, batch_size, dtype) if config.is_hybrid else (None, None)
    )
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        mask=jnp.zeros((batch_size, max_len), bool),
        positions=jnp.zeros((batch_size, max_len), jnp.int32),
        index=jnp.zeros((), jnp.int32),
        conv=conv,
        state=state,
    )


# ----- the trunks: one layer scan over a store ----------------------------------------------


def default_positions(attention_mask: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """RoPE positions from a ``[B, T]`` mask: cumsum(mask) − 1 (0 on left padding);
    with segment ids, positions restart at 0 in every segment (packing)."""
    m = attention_mask.astype(jnp.int32)
    if segment_ids is None:
        return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)
    idx = jnp.arange(m.shape[1])[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return (idx - start_idx).astype(jnp.int32)


def _self_attention_mask(config: ModelConfig, attention_mask, positions, segment_ids=None):
    """Compact mask of causal self-attention: causal, real keys, same segment, inside the
    sliding window; a query always sees itself (so a padded query's ignorable output stays
    finite). ``attention_mask`` None = every key real."""
    window = config.uses_window
    return attn_lib.causal_self_mask(
        attention_mask, positions if window else None, segment_ids, num_tokens=positions.shape[1]
    )


def trunk(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    remat: str = "none",
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Embeddings → L decoder layers → final RMSNorm.

    Args:
      params: parameter tree from :func:`~jaxrl_llm.models.params.init_params` or an importer.
      tokens: ``[B, T]`` int token ids.
      positions: ``[B, T]`` RoPE positions (default :func:`default_positions`).
      attention_mask: ``[B, T]`` 1 for real tokens (default all ones). Without a cache,
        attention is causal among real tokens; padded queries produce ignorable output.
      segment_ids: ``[B, T]`` ints for packed sequences; tokens attend only within their
        segment (no cache allowed).
      cache: a :class:`KVCache`; new keys/values are written at ``cache.index`` and the
        queries attend over every filled slot.
      remat: rematerialisation of each layer under autodiff: 'none', 'full' or 'dots'.
      mesh: the mesh a mixture of experts runs expert-parallel over (default the ambient
        ``jax.set_mesh`` one; :func:`jaxrl_llm.models.moe.sparse_moe`); unused by dense models.
    Attention runs through ``config.attn.impl`` (:mod:`jaxrl_llm.models.attention`): naive for
    short sequences and the decode step, blockwise (O(T) memory) or a fused kernel otherwise;
    the mask goes in as per-row vectors (only the naive path builds a ``[B, T, S]`` mask).

    Returns:
      (hidden ``[B, T, D]`` in the compute dtype, the new cache or None).
    """
    hidden, new_cache, _ = _trunk(
        params,
        tokens,
        config=config,
        positions=positions,
        attention_mask=attention_mask,
        segment_ids=segment_ids,
        cache=cache,
        remat=remat,
        mesh=mesh,
    )
    return hidden, new_cache


def _trunk(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None,
    attention_mask: jax.Array | None,
    segment_ids: jax.Array | None,
    cache: KVCache | None,
    remat: str,
    mesh: jax.sharding.Mesh | None,
    routing: moe_lib.RecordedRouting | None = None,
):
    """:func:`trunk` -> (hidden, new cache, per-layer MoE statistics ``[L, ...]`` or None):
    :func:`~jaxrl_llm.models.layer_stack.stack` over a
    :class:`~jaxrl_llm.models.kv_stores.NoCache` (and a hybrid stack's
    :class:`~jaxrl_llm.models.gated_deltanet.FreshState`), closed over, or a
    :class:`~jaxrl_llm.models.kv_stores.DenseCache` (and
    :class:`~jaxrl_llm.models.gated_deltanet.RecurrentState`), carried."""
    c = config
    chex.assert_rank(tokens, 2)
    b, t = tokens.shape
    key_mask = None if attention_mask is None else attention_mask.astype(bool)
    attention_mask = jnp.ones((b, t), bool) if key_mask is None else key_mask
    chex.assert_shape(attention_mask, (b, t))
    if positions is None:
        positions = default_positions(attention_mask, segment_ids)
    chex.assert_shape(positions, (b, t))
    new = NewTokens(tokens, positions, attention_mask.astype(jnp.float32), routing)
    if c.is_hybrid and segment_ids is not None:
        raise ValueError(
            "segment_ids (packing) is not supported by linear-attention (hybrid) stacks: the "
            "recurrent state would carry across segments"
        )

    if cache is None:
        # The stores never change (unless KV sharing carries the held keys): closed over, not
        # carried (under autodiff a carried mask would be saved once per layer).
        no_cache = NoCache(_self_attention_mask(c, key_mask, positions, segment_ids))
        fresh = FreshState(attention_mask) if c.is_hybrid else None
        stores = LayerStores(no_cache, fresh, carried=False)
        (x,), _, stats = stack(c, params, [new], stores, remat=remat, mesh=mesh)
        x = place(apply_norm(c, x, params["final_norm"]), BTD, layout_mesh(mesh))
        return x, None, stats

    if segment_ids is not None:
        raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
    rec = None
    if c.is_hybrid:
        if cache.conv is None or cache.state is None:
            raise ValueError("a hybrid stack's cache needs conv and state (init_cache builds them)")
        rec = RecurrentState(conv=cache.conv, state=cache.state, valid=attention_mask)
    dense, new_mask, new_pos = _dense_cache_store(c, cache, attention_mask, positions)
    (x,), held, stats = stack(c, params, [new], LayerStores(dense, rec), remat=remat, mesh=mesh)
    dense, rec = LayerStores.finish(held)
    assert isinstance(dense, DenseCache)
    new_cache = KVCache(
        k=dense.k,
        v=dense.v,
        mask=new_mask,
        positions=new_pos,
        index=cache.index + t,
        conv=None if rec is None else rec.conv,
        state=None if rec is None else rec.state,
    )
    return apply_norm(c, x, params["final_norm"]), new_cache, stats


def _dense_cache_store(c: ModelConfig, cache: KVCache, attention_mask, positions):
    """(the :class:`DenseCache` store of a cached call, its new mask and positions)."""
    t = attention_mask.shape[1]
    write = cache.index
    new_mask = jax.lax.dynamic_update_slice_in_dim(cache.mask, attention_mask, write, 1)
    new_pos = jax.lax.dynamic_update_slice_in_dim(
        cache.positions, positions.astype(jnp.int32), write, 1
    )
    window = c.uses_window
    mask = attn_lib.AttentionMask(
        q_index=(write + jnp.arange(t)).astype(jnp.int32),
        k_valid=new_mask,
        q_positions=positions.astype(jnp.int32) if window else None,
        k_positions=new_pos if window else None,
    )
    return DenseCache(k=cache.k, v=cache.v, index=write, mask=mask), new_mask, new_pos


def trunk_shared_prefix(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    prefix_len: int,
    group_size: int,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    remat: str = "none",
    mesh: jax.sharding.Mesh | None = None,
) -> jax.Array:
    """:func:`trunk` for groups of rows that share a prompt: the prompt is computed once per group.

    In group RL (GRPO and its relatives) a batch holds G completions of each prompt, laid out
    group by group: rows ``g·G .. g·G+G−1`` have the same first ``prefix_len`` columns. A plain
    forward runs every prompt token G times; here each layer runs the prompt once per group and
    lets the G completions attend to its keys/values, repeated G times. The result equals
    ``trunk(params, tokens, ...)[0]`` up to float rounding — hidden states and, under autodiff,
    gradients (the repeat's transpose sums the G completions' contributions to the prompt).
    For a 48-token prompt, 16 completion tokens and G = 4 it runs 28 instead of 64 token
    positions per row. The caller guarantees the layout; nothing here can check it at run time.

    Args:
      params, config, remat, mesh: as in :func:`trunk`.
      tokens: ``[B, T]`` ints, B a multiple of ``group_size``; columns ``< prefix_len`` (the
        left-padded prompt) identical within each group.
      prefix_len: static prompt width (columns shared by a group), 0 < prefix_len < T.
      group_size: static G ≥ 1.
      positions: ``[B, T]`` (default :func:`default_positions` of the whole row).
      attention_mask: ``[B, T]`` 1 for real tokens (default all ones).

    Returns:
      hidden ``[B, T, D]`` (prompt columns repeated from the shared computation).
    """
    return _trunk_shared_prefix(
        params,
        tokens,
        config=config,
        prefix_len=prefix_len,
        group_size=group_size,
        positions=positions,
        attention_mask=attention_mask,
        remat=remat,
        mesh=mesh,
    )[0]


def _trunk_shared_prefix(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    prefix_len: int,
    group_size: int,
    positions: jax.Array | None,
    attention_mask: jax.Array | None,
    remat: str,
    mesh: jax.sharding.Mesh | None,
    routing: moe_lib.RecordedRouting | None = None,
):
    """:func:`trunk_shared_prefix` -> (hidden, per-layer MoE statistics or None); a shared
    prompt token counts G times in the statistics, as in the plain forward. Each scanned step
    runs :func:`~jaxrl_llm.models.layer.decoder_layer` on the prompt rows with a
    :class:`~jaxrl_llm.models.kv_stores.GroupPrompt` store, then on the completions with a
    :class:`~jaxrl_llm.models.kv_stores.SharedPrompt` of the keys/values it kept
    (:class:`_SharedPromptStores` around :func:`~jaxrl_llm.models.layer_stack.stack`)."""
    c = config
    chex.assert_rank(tokens, 2)
    b, t = tokens.shape
    g, tp = int(group_size), int(prefix_len)
    if g < 1 or b % g:
        raise ValueError(f"batch of {b} rows is not a whole number of groups of {g}")
    if not 0 < tp < t:
        raise ValueError(f"prefix_len={tp} must be inside (0, {t})")
    key_mask = None if attention_mask is None else attention_mask.astype(bool)
    attention_mask = jnp.ones((b, t), bool) if key_mask is None else key_mask
    if positions is None:
        positions = default_positions(attention_mask)
    chex.assert_shape([attention_mask, positions], (b, t))
    pos_p, pos_c = positions[::g, :tp], positions[:, tp:]
    window = c.uses_window
    # Prompt queries over prompt keys (one row per group): causal self-attention.
    prompt = GroupPrompt(
        _self_attention_mask(c, None if key_mask is None else key_mask[::g, :tp], pos_p)
    )
    # Completion queries (slots tp..T−1) over every key of their row.
    mask_c = attn_lib.AttentionMask(
        q_index=jnp.arange(tp, t, dtype=jnp.int32),
        k_valid=key_mask,
        q_positions=pos_c if window else None,
        k_positions=positions if window else None,
    )
    rec_p = rec_c = None
    if routing is not None:  # a group's prompt routing is its first row's
        rec_p = dataclasses.replace(routing, experts=routing.experts[::g, :tp])
        rec_c = dataclasses.replace(routing, experts=routing.experts[:, tp:])
    weights_p = attention_mask[::g, :tp].astype(jnp.float32) * g
    new_p = NewTokens(tokens[::g, :tp], pos_p, weights_p, rec_p)
    new_c = NewTokens(tokens[:, tp:], pos_c, attention_mask[:, tp:].astype(jnp.float32), rec_c)
    stores = _SharedPromptStores(
        prompt, GroupPromptState(attention_mask[::g, :tp]), mask_c, attention_mask[:, tp:], g
    )
    (x_p, x_c), _, stats = stack(c, params, [new_p, new_c], stores, remat=remat, mesh=mesh)
    x = jnp.concatenate([jnp.repeat(x_p, g, axis=0), x_c], axis=1)
    return apply_norm(c, x, params["final_norm"]), stats


@dataclasses.dataclass(frozen=True)
class _SharedPromptStores(Stores):
    """The shared-prompt forward's two passes per layer: the prompt rows (one per group) over
    a :class:`~jaxrl_llm.models.kv_stores.GroupPrompt` (a LINEAR layer: a
    :class:`~jaxrl_llm.models.gated_deltanet.GroupPromptState`), then the completions over a
    :class:`~jaxrl_llm.models.kv_stores.SharedPrompt` of the keys/values the prompt pass kept
    (a :class:`~jaxrl_llm.models.gated_deltanet.SharedPromptState` of its final state). With
    KV sharing (Gemma 4) the held keys of both passes, ``(k_p, v_p, k_c, v_c)``, are carried.
    """

    prompt: GroupPrompt
    prompt_state: GroupPromptState
    mask_c: attn_lib.AttentionMask
    valid_c: jax.Array
    group_size: int

    def start(self, config: ModelConfig, xs):
        (x_p, x_c) = xs
        held_p = empty_held_kv(config, x_p.shape[0], x_p.shape[1], x_p.dtype)
        held_c = empty_held_kv(config, x_c.shape[0], x_c.shape[1], x_c.dtype)
        return None if held_p is None or held_c is None else (*held_p, *held_c)

    def store(self, held, kind, i, prev):
        g = self.group_size
        if kind == LayerType.LINEAR:
            if i == 0:
                return self.prompt_state
            assert isinstance(prev, GroupPromptState)
            assert prev.conv is not None and prev.state is not None
            return SharedPromptState(prev.conv, prev.state, self.valid_c, g)
        if i == 0:
            return self.prompt if held is None else KVShared(self.prompt, held[0], held[1])
        kept = unshare_kv(prev)
        assert isinstance(kept, GroupPrompt) and kept.k is not None and kept.v is not None
        shared = SharedPrompt(k=kept.k, v=kept.v, mask=self.mask_c, group_size=g)
        return shared if held is None else KVShared(shared, held[2], held[3])

    def keep(self, held, kind, i, store):
        if held is None or kind == LayerType.LINEAR:
            return held
        assert isinstance(store, KVShared)
        return (store.k, store.v, *held[2:]) if i == 0 else (*held[:2], store.k, store.v)

    def pool(self, stats):
        stats_p, stats_c = stats
        if stats_p is None or stats_c is None:
            return None
        return _pool_shared(stats_p, stats_c, self.group_size)


def _pool_shared(stats_p: moe_lib.MoeStats, stats_c: moe_lib.MoeStats, g: int):
    """One layer's :class:`~jaxrl_llm.models.moe.MoeStats` of the shared-prompt trunk: the
    prompt rows' sums plus the completions'; the experts of every row, ``[B, T, k]`` (a
    group's prompt routing repeated over its G rows)."""
    experts = None
    if stats_p.experts is not None and stats_c.experts is not None:
        experts = jnp.concatenate([jnp.repeat(stats_p.experts, g, axis=0), stats_c.experts], 1)
    sums = jax.tree.map(jnp.add, stats_p._replace(experts=None), stats_c._replace(experts=None))
    return sums._replace(experts=experts)


def trunk_with_routing(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    cache: KVCache | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[jax.Array, KVCache | None, jax.Array | None]:
    """:func:`trunk` that also returns the experts a mixture of experts routed each new token
    to: ``[B, T, L, k]`` int32 (None for a dense model). What the samplers record for routing
    replay (R3, Ma et al. 2025, https://arxiv.org/abs/2510.11370)."""
    hidden, new_cache, stats = _trunk(
        params,
        tokens,
        config=config,
        positions=positions,
        attention_mask=attention_mask,
        segment_ids=None,
        cache=cache,
        remat="none",
        mesh=mesh,
    )
    experts = None if stats is None else jnp.moveaxis(stats.experts, 0, 2)
    return hidden, new_cache, experts


def routing_mismatch(stats: moe_lib.MoeStats, k: int) -> tuple[jax.Array, jax.Array] | None:
    """(fraction of routing decisions that differ from the recorded ones, the same for the
    own top-k) over every layer's real tokens, from per-layer stacked
    :class:`~jaxrl_llm.models.moe.MoeStats`; None without a recorded routing."""
    if stats.mismatch is None or stats.own_mismatch is None:
        return None
    decisions = k * jnp.sum(stats.tokens)
    safe = jnp.where(decisions > 0, decisions, 1.0)
    return jnp.sum(stats.mismatch) / safe, jnp.sum(stats.own_mismatch) / safe


def unembedding(params: Params, config: ModelConfig) -> jax.Array:
    """The output projection ``[D, V]`` (embedding transposed when tied)."""
    if config.tie_embeddings:
        return params["embed"]["embedding"].T
    return params["lm_head"]["kernel"]


def logits_from_hidden(params: Params, hidden: jax.Array, config: ModelConfig) -> jax.Array:
    """``[B, T, V]`` logits in float32 (materialises the full vocabulary; prefer the chunked
    log-prob ops in training), soft-capped ``cap · tanh(z / cap)`` when
    ``config.tokens.final_logit_softcap`` is set (Gemma 2, https://arxiv.org/abs/2408.00118)."""
    w = unembedding(params, config).astype(hidden.dtype)
    logits = jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)
    return softcap_logits(logits, config)


def softcap_logits(logits: jax.Array, config: ModelConfig) -> jax.Array:
    """``cap · tanh(logits / cap)`` with ``config.tokens.final_logit_softcap`` (identity when None).

    Code that computes logits from :attr:`ModelOutputs.hidden` and ``unembed`` itself must
    apply this to match :func:`forward` on a Gemma 2 config."""
    cap = config.tokens.final_logit_softcap
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def scalar_head(params: Params, hidden: jax.Array) -> jax.Array:
    """Scalar head output ``[B, T]`` (value model / reward model), float32."""
    w = params["score_head"]["kernel"].astype(hidden.dtype)
    return jnp.einsum("btd,dl->btl", hidden, w, preferred_element_type=jnp.float32)[..., 0]


def forward(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    remat: str = "none",
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Full forward to float32 logits ``[B, T, V]``; returns (logits, new cache)."""
    hidden, cache = trunk(
        params,
        tokens,
        config=config,
        positions=positions,
        attention_mask=attention_mask,
        segment_ids=segment_ids,
        cache=cache,
        remat=remat,
        mesh=mesh,
    )
    return logits_from_hidden(params, hidden, config), cache


def apply(
    params: Params,
    tokens: jax.Array,
    *,
    config: ModelConfig,
    attention_mask: jax.Array | None = None,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    remat: str = "none",
    shared_prefix: tuple[int, int] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    routing: moe_lib.RecordedRouting | None = None,
) -> ModelOutputs:
    """Training-time forward: hidden states, the unembedding and the scalar head if any.

    This is the ``apply_fn`` the loss layer calls (bind ``config`` with functools.partial).
    ``shared_prefix=(prefix_len, group_size)`` computes each group's common prompt once
    (:func:`trunk_shared_prefix`); the outputs keep the plain forward's layout. For a
    mixture of experts, ``router_aux_loss`` is the load-balancing loss over the real tokens
    (``attention_mask``) of every layer, and ``mesh`` the mesh the experts are split over
    (:func:`jaxrl_llm.models.moe.sparse_moe`). ``routing``: a sampler's recorded experts of
    these tokens (``[B, T, L, k]``, :class:`~jaxrl_llm.models.moe.RecordedRouting`), replayed
    in every MoE block when ``routing.replay`` (R3, Ma et al. 2025,
    https://arxiv.org/abs/2510.11370) and compared against in ``routing_mismatch`` /
    ``routing_own_mismatch``.
    """
    if routing is not None:
        chex.assert_rank(routing.experts, 4)
        chex.assert_equal_shape_prefix([routing.experts, tokens], 2)
    if shared_prefix is not None and shared_prefix[1] > 1:
        if segment_ids is not None:
            raise ValueError("shared_prefix cannot be combined with segment_ids (packing)")
        hidden, stats = _trunk_shared_prefix(
            params,
            tokens,
            config=config,
            prefix_len=shared_prefix[0],
            group_size=shared_prefix[1],
            positions=positions,
            attention_mask=attention_mask,
            remat=remat,
            mesh=mesh,
            routing=routing,
        )
    else:
        hidden, _, stats = _trunk(
            params,
            tokens,
            config=config,
            positions=positions,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            cache=None,
            remat=remat,
            mesh=mesh,
            routing=routing,
        )
    aux = None if stats is None else moe_lib.load_balancing_loss(stats, config.moe.num_experts)
    fracs = None if stats is None else routing_mismatch(stats, config.moe.num_experts_per_tok)
    scalar = scalar_head(params, hidden) if config.num_labels else None
    unembed = (
        None
        if config.num_labels and "lm_head" not in params and not config.tie_embeddings
        else unembedding(params, config)
    )
    return ModelOutputs(
        hidden=hidden,
        unembed=unembed,
        scalar=scalar,
        logit_softcap=config.tokens.final_logit_softcap,
        router_aux_loss=aux,
        routing_mismatch=None if fracs is None else fracs[0],
        routing_own_mismatch=None if fracs is None else fracs[1],
    )

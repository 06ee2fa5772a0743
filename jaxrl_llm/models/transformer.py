"""A pure-function Llama- and Gemma-family decoder with an explicit KV cache: the trunks and the
training-time forward.

Parameters are a plain nested dict (:mod:`jaxrl_llm.models.params`: their shapes, logical axes
and initialisation); per-layer weights are stacked along a leading ``layers`` axis and the
layers run under ``lax.scan`` (one compiled layer body, fast compiles, a natural place for
rematerialisation). The layer itself is :func:`jaxrl_llm.models.layer.decoder_layer`, over a
store of earlier keys/values, and :func:`jaxrl_llm.models.layer_stack.stack` runs it over the
L layers; the trunks here build its stores: no cache (training) or a dense :class:`KVCache`
(:func:`trunk`). A group's shared prompt has its own trunk
(:mod:`jaxrl_llm.models.shared_prefix`), and the paged engine's trunk
(:func:`jaxrl_llm.models.paged_trunk`) builds pages.

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

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models import attention as attn_lib
from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.gated_deltanet import (
    FreshState,
    RecurrentState,
)
from jaxrl_llm.models.kv_cache import KVCache
from jaxrl_llm.models.kv_stores import (
    DenseCache,
    NoCache,
)
from jaxrl_llm.models.layer import BTD, apply_norm
from jaxrl_llm.models.layer_stack import LayerStores, NewTokens, stack
from jaxrl_llm.models.layout import layout_mesh, place
from jaxrl_llm.models.params import Params
from jaxrl_llm.models.positions import default_positions, self_attention_mask
from jaxrl_llm.models.shared_prefix import trunk_shared_prefix_with_stats


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


# ----- the trunks: one layer scan over a store ----------------------------------------------


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
    embeds: jax.Array | None = None,
    blocks: jax.Array | None = None,
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
      embeds: ``[B, T, D]`` input embeddings used instead of the tokens' (a multimodal
        prompt's, e.g. :func:`jaxrl_llm.models.families.gemma.vision.embed_with_images`).
      blocks: ``[B, T]`` int bidirectional block ids: tokens of one block ``≥ 0`` attend to
        each other both ways (Gemma 3's image tokens), −1 elsewhere; None = causal only.
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
        embeds=embeds,
        blocks=blocks,
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
    embeds: jax.Array | None = None,
    blocks: jax.Array | None = None,
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
    new = NewTokens(tokens, positions, attention_mask.astype(jnp.float32), routing, embeds)
    if embeds is not None:
        chex.assert_shape(embeds, (b, t, c.hidden_size))
    if c.is_hybrid and segment_ids is not None:
        raise ValueError(
            "segment_ids (packing) is not supported by linear-attention (hybrid) stacks: the "
            "recurrent state would carry across segments"
        )

    if cache is None:
        # The stores never change (unless KV sharing carries the held keys): closed over, not
        # carried (under autodiff a carried mask would be saved once per layer).
        no_cache = NoCache(self_attention_mask(c, key_mask, positions, segment_ids, blocks))
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
    dense, new_mask, new_pos = _dense_cache_store(c, cache, attention_mask, positions, blocks)
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


def _dense_cache_store(c: ModelConfig, cache: KVCache, attention_mask, positions, blocks=None):
    """(the :class:`DenseCache` store of a cached call, its new mask and positions); the new
    tokens' bidirectional ``blocks`` hold for this call only (the cache keeps none)."""
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
        q_blocks=blocks,
        k_blocks=None
        if blocks is None
        else jax.lax.dynamic_update_slice_in_dim(
            jnp.full_like(cache.mask, -1, jnp.int32), blocks.astype(jnp.int32), write, 1
        ),
    )
    return DenseCache(k=cache.k, v=cache.v, index=write, mask=mask), new_mask, new_pos


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
    embeds: jax.Array | None = None,
    blocks: jax.Array | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Full forward to float32 logits ``[B, T, V]``; returns (logits, new cache). ``embeds``
    and ``blocks`` as in :func:`trunk` (a multimodal prompt)."""
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
        embeds=embeds,
        blocks=blocks,
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
    embeds: jax.Array | None = None,
    blocks: jax.Array | None = None,
) -> ModelOutputs:
    """Training-time forward: hidden states, the unembedding and the scalar head if any.

    This is the ``apply_fn`` the loss layer calls (bind ``config`` with functools.partial).
    ``shared_prefix=(prefix_len, group_size)`` computes each group's common prompt once
    (:func:`~jaxrl_llm.models.shared_prefix.trunk_shared_prefix`); the outputs keep the plain
    forward's layout. For a mixture of experts, ``router_aux_loss`` is the load-balancing loss
    over the real tokens (``attention_mask``) of every layer, and ``mesh`` the mesh the experts
    are split over (:func:`jaxrl_llm.models.moe.sparse_moe`). ``routing``: a sampler's recorded
    experts of these tokens (``[B, T, L, k]``, :class:`~jaxrl_llm.models.moe.RecordedRouting`),
    replayed in every MoE block when ``routing.replay`` (R3, Ma et al. 2025,
    https://arxiv.org/abs/2510.11370) and compared against in ``routing_mismatch`` /
    ``routing_own_mismatch``. ``embeds`` / ``blocks``: a multimodal batch's input embeddings
    and bidirectional blocks, as in :func:`trunk` (not with ``shared_prefix``).
    """
    if routing is not None:
        chex.assert_rank(routing.experts, 4)
        chex.assert_equal_shape_prefix([routing.experts, tokens], 2)
    if shared_prefix is not None and shared_prefix[1] > 1:
        if segment_ids is not None or embeds is not None:
            raise ValueError("shared_prefix cannot be combined with segment_ids or embeds")
        hidden, stats = trunk_shared_prefix_with_stats(
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
            embeds=embeds,
            blocks=blocks,
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

"""One decoder layer, written once, over a store of what earlier tokens left behind.

Every trunk and both engines run this layer (:func:`decoder_layer`)::

    h = norm(x);   y, store = store.mix(h);   x = x + post_norm(y)
    h = norm(x);   z = MLP(h) or MoE(h);      x = x + post_norm(z)

(the post-norms only with ``config.norms.post_norms``, Gemma 2 / 3). The *store* is what the layer's
token mixer remembers of earlier tokens, and how the new tokens mix with it. It is data: a
pytree passed in and returned (``(x, store) -> (y, new store)``), never hidden state, holding
every layer's memory and indexed by the traced layer index. Attention layers mix the same way
whatever their store (:func:`attention_block`: q/k/v projections, q/k norm, RoPE, the query
scale, attention, the output projection); their stores (:class:`KVStore`) differ only in
:meth:`KVStore.attend`, where the new keys/values go and which keys a query reads:

- ``NoCache``: the new tokens' own keys (causal, packing); the training forward.
- ``DenseCache``: a :class:`~jaxrl_llm.models.KVCache` ``[L, B, S, K, E]`` written at one slot
  index for every row; prefill and the static engine's decode step.
- ``GroupPrompt`` then ``SharedPrompt``: a group's prompt run once (one row per group), its G
  completions reading its keys repeated G times; :func:`jaxrl_llm.models.trunk_shared_prefix`.
- ``Pages``: the page pool, each row's pages gathered; the paged engine.

The stores live in :mod:`.kv_stores` and :mod:`.paged_store`. :func:`~.layer_scan.scan_layers` is the one
layer scan and :func:`jaxrl_llm.models.stack` the one caller of :func:`decoder_layer`: the
trunk (:func:`jaxrl_llm.models.trunk`), the shared-prompt trunk and the paged trunk
(:func:`jaxrl_llm.models.paged_trunk`) only build the stores it runs the layers over. A layer feature (a norm, a gate, an activation, an MLP
variant) therefore goes here, once: in :func:`decoder_layer`, :func:`attention_block` or
:func:`~.mlp.mlp_block` (the feed-forward blocks live in :mod:`.mlp`; the norm, the LoRA adapter
and :class:`~.layer_base.TokenInfo` they share in :mod:`.layer_base`, below both).

**A per-row recurrent state is one more store.** The Gated DeltaNet layers of Qwen3.5-class
hybrids (LINEAR entries of ``config.attn.layer_types``) keep, per row, a causal-conv window (the last
W − 1 projected inputs, ``[B, W−1, C]``) and the delta rule's matrix ``[B, H, K, V]``. Their
stores live in :mod:`.gated_deltanet`: ``FreshState`` (zeros; the training forward) and
``RecurrentState(conv [L', B, W−1, C], state [L', B, H, K, V])``, whose ``mix`` reads its
layer's window and matrix (``dynamic_index`` at the layer, as :class:`DenseCache` reads its
keys), runs the layer's input projections, the conv over [window; new tokens], the delta rule
over the T new tokens (:mod:`.delta_rule`: one update per token when T = 1, the chunked
parallel form when T > 1), the gated RMSNorm and the output projection, and writes the last
W − 1 inputs and the new matrix back: ``(y [B, T, D], new store)``, what
:func:`attention_block` returns. :func:`decoder_layer` does not change; it calls
``store.mix`` between its norms and residuals. A hybrid stack scans the periods of its layer
pattern (:func:`~.layer_scan.scan_periods`; e.g. three linear layers then one full-attention layer) with
both stores in the carry, each layer indexing its store by its rank among the layers of its
kind. The paged engine keeps each slot's row's window and matrix beside the pages
(:func:`jaxrl_llm.models.paged_hybrid_trunk`; a group's prompt state copied to its G rows when
they are admitted); the shared-prompt trunk repeats the prompt's final window and matrix G
times (``GroupPromptState`` then ``SharedPromptState``) where :class:`SharedPrompt` repeats
the prompt's keys.

Shapes: B rows, T new tokens, D model width, H query heads, K key/value heads, E head dim,
F MLP width, L layers.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Protocol

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models import attention as attn_lib
from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models import quant
from jaxrl_llm.models.config import Activation, ModelConfig
from jaxrl_llm.models.layer_base import BTD, Params, TokenInfo, apply_norm, with_adapter
from jaxrl_llm.models.layout import layout_mesh, place
from jaxrl_llm.models.mlp import dense_and_moe_block, mlp_block
from jaxrl_llm.models.positions import (
    apply_rope,
    check_layer_index,
    layer_head_tables,
    layer_rope_inv_freq,
    layer_values_are_keys,
    layer_windows,
)


class Store(Protocol):
    """What a layer's token mixer remembers of earlier tokens, for every layer (a pytree).

    The one method, :meth:`mix`, mixes the new tokens with that memory and writes them in.
    """

    def mix(
        self, config: ModelConfig, lp: Params, h_btd: jax.Array, tokens: TokenInfo, layer
    ) -> tuple[jax.Array, Store]:
        """The token mixer of layer ``layer`` over this store.

        Args:
          config: the model config.
          lp: the layer's parameters (one slice of the stacked ``params["layers"]``).
          h_btd: ``[B, T, D]`` the normed new tokens.
          tokens: :class:`TokenInfo` of the new tokens.
          layer: ``[]`` int32 traced layer index.

        Returns:
          (``[B, T, D]`` the mixer's output, before the residual add; the updated store).
        """
        ...


class KVStore(abc.ABC):
    """Base of the attention layers' stores: they mix through :func:`attention_block` and
    differ only in :meth:`attend`."""

    @abc.abstractmethod
    def attend(
        self,
        config: ModelConfig,
        q_btne: jax.Array,
        k_btke: jax.Array,
        v_btke: jax.Array,
        layer,
        sinks: jax.Array | None = None,
    ) -> tuple[jax.Array, KVStore]:
        """Write layer ``layer``'s new keys/values and attend the new queries over the keys
        this store lets them see.

        Args:
          config: the model config (attention implementation, window, soft cap).
          q_btne: ``[B, T, H, E]`` queries (RoPE applied, scaled).
          k_btke, v_btke: ``[B, T, K, E]`` the new tokens' keys (RoPE applied) and values.
          layer: ``[]`` int32 traced layer index.
          sinks: ``[H]`` the layer's attention-sink logits (``config.attn.sinks``) or None.

        Returns:
          (``[B, T, H, E]``, the updated store).
        """

    def mix(
        self, config: ModelConfig, lp: Params, h_btd: jax.Array, tokens: TokenInfo, layer
    ) -> tuple[jax.Array, KVStore]:
        """:meth:`Store.mix` of an attention layer: :func:`attention_block` over this store."""
        return attention_block(config, lp, h_btd, tokens, layer, self)


# ----- building blocks ------------------------------------------------------------------------


def embed_tokens(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    """Token embeddings ``[B, T, D]`` in the compute dtype, times √D in that dtype when
    ``config.tokens.scale_embeddings`` (Gemma)."""
    chex.assert_rank(tokens, 2)
    dtype = config.compute_jnp_dtype
    x = params["embed"]["embedding"].astype(dtype)[tokens]
    if config.tokens.scale_embeddings:
        x = x * jnp.asarray(math.sqrt(config.hidden_size), dtype)
    return x


def per_layer_inputs(
    config: ModelConfig, params: Params, tokens: jax.Array, x_btd: jax.Array
) -> jax.Array | None:
    """Gemma 4's per-layer inputs (PLE) of the new tokens, ``[B, T, L, P]`` in ``x_btd``'s
    dtype, or None when ``config.tokens.per_layer_input_size`` is 0: ``(norm(x W_ple · D^-1/2) +
    E_ple[token] · √P) / √2``, with ``x_btd`` the scaled input embedding, ``W_ple``
    ``params["per_layer_projection"]`` ``[D, L, P]``, ``E_ple`` ``params["embed_per_layer"]``
    ``[V_ple, L, P]`` and the norm ``params["per_layer_norm"]`` (transformers'
    ``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs``)."""
    c = config
    if not c.tokens.per_layer_input_size:
        return None
    chex.assert_rank([tokens, x_btd], [2, 3])
    dtype = x_btd.dtype
    tok = params["embed_per_layer"]["embedding"].astype(dtype)[tokens]
    tok = tok * jnp.asarray(math.sqrt(c.tokens.per_layer_input_size), dtype)
    w = params["per_layer_projection"]["kernel"].astype(dtype)
    proj = jnp.einsum("btd,dlp->btlp", x_btd, w) * jnp.asarray(c.hidden_size**-0.5, dtype)
    proj = apply_norm(c, proj, params["per_layer_norm"])
    return (proj + tok) * jnp.asarray(2.0**-0.5, dtype)


def _per_layer_input_block(config: ModelConfig, lp: Params, x_btd, tokens: TokenInfo, layer):
    """Gemma 4's per-layer input into the residual stream after the MLP:
    ``x + norm(down(act(x W_g) ⊙ p_l))`` with p_l the layer's slice of ``tokens.per_layer``."""
    c = config
    assert tokens.per_layer is not None, "a config with per-layer inputs needs TokenInfo.per_layer"
    dtype = x_btd.dtype
    p = jax.lax.dynamic_index_in_dim(tokens.per_layer, layer, axis=2, keepdims=False)
    g = jnp.einsum("btd,dp->btp", x_btd, lp["per_layer_gate"]["kernel"].astype(dtype))
    gelu = c.mlp.activation == Activation.GELU_TANH
    act = jax.nn.gelu(g, approximate=True) if gelu else jax.nn.silu(g)
    y = jnp.einsum(
        "btp,pd->btd", act * p.astype(dtype), lp["per_layer_proj"]["kernel"].astype(dtype)
    )
    return x_btd + apply_norm(c, y, lp["per_layer_post_norm"])


def _linear_heads(x_btd, p, dtype):
    y = with_adapter(jnp.einsum("btd,dne->btne", x_btd, p["kernel"].astype(dtype)), x_btd, p, 1)
    if "bias" in p:
        y = y + p["bias"].astype(dtype)
    return y


def project_qkv(config: ModelConfig, lp: Params, h_btd: jax.Array, tokens: TokenInfo, layer=None):
    """Queries, keys and values of the normed new tokens: q/k/v projections (with bias and
    LoRA adapters when present), optional per-head q/k RMSNorm (Qwen3, Gemma 3 / 4), optional
    scale-free value RMSNorm (Gemma 4), RoPE (times YaRN's attention factor,
    ``config.rope_attention_scaling``, on q and k).

    With per-layer types (``config.attn.layer_types``) the RoPE frequencies come from
    :func:`layer_rope_inv_freq` at ``layer`` (the traced layer index, required then) instead
    of ``tokens.inv_freq``. With ``config.attn.query_pre_attn_scalar`` (Gemma) q comes back
    multiplied by √(E / query_pre_attn_scalar), so attention's 1/√E scaling gives scores
    q·k / √query_pre_attn_scalar. Gemma 4: a GLOBAL layer with ``global_k_eq_v`` takes its
    values from its key projection; a layer whose heads are stored padded
    (``config.has_padded_heads``) fills the K* stored KV slots from its own heads and norms
    each head over its own dims (:mod:`jaxrl_llm.models.padded_heads`).

    Returns:
      (q ``[B, T, H, E]``, k ``[B, T, K, E]``, v ``[B, T, K, E]``) in ``h_btd``'s dtype (the
      stored K*, E* with padded heads).
    """
    chex.assert_rank(h_btd, 3)
    c = config
    check_layer_index(c, layer)
    dtype = h_btd.dtype
    inv_freq = tokens.inv_freq
    per_layer = layer_rope_inv_freq(c)
    if per_layer is not None:
        inv_freq = per_layer[layer]
    q = _linear_heads(h_btd, lp["q_proj"], dtype)
    k = _linear_heads(h_btd, lp["k_proj"], dtype)
    v = _linear_heads(h_btd, lp["v_proj"], dtype)
    values_are_keys = layer_values_are_keys(c)
    if values_are_keys is not None:
        v = jnp.where(jnp.asarray(values_are_keys)[layer], k, v)
    width = None
    tables = layer_head_tables(c)
    if tables is not None:
        dims, slots = (jnp.asarray(t)[layer] for t in tables)
        width = dims.astype(jnp.float32)
        k, v = jnp.take(k, slots, axis=2), jnp.take(v, slots, axis=2)
    if c.attn.qk_norm:
        q = apply_norm(c, q, lp["q_norm"], width)
        k = apply_norm(c, k, lp["k_norm"], width)
    if c.attn.value_norm:
        v = apply_norm(c, v, None, width)
    q = apply_rope(q, tokens.positions, inv_freq)
    k = apply_rope(k, tokens.positions, inv_freq)
    scaling = c.rope_attention_scaling  # YaRN's: transformers scales cos and sin by it
    if scaling != 1.0:
        q, k = q * jnp.asarray(scaling, dtype), k * jnp.asarray(scaling, dtype)
    e = q.shape[-1]
    if c.attn.query_pre_attn_scalar is not None and c.attn.query_pre_attn_scalar != e:
        q = q * jnp.asarray(math.sqrt(e / c.attn.query_pre_attn_scalar), dtype)
    return q, k, v


def attend(
    config: ModelConfig,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: attn_lib.AttentionMask,
    layer=None,
    *,
    one_query: bool = False,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Attention of one layer through the configured implementation (``config.attn.impl``),
    with the config's attention-logit soft cap and the layer's attention sinks ``[H]`` (None:
    none).

    The window is ``config.attn.sliding_window``, or, with per-layer types, :func:`layer_windows`
    at ``layer`` (the traced layer index, required then; the mask must carry positions).
    ``one_query`` (the paged decode step, T = 1): :func:`attention.one_query_attention`.

    Args:
      q: ``[B, T, H, E]``; k, v: ``[B, S, K, E]``; mask: the :class:`AttentionMask`.

    Returns:
      ``[B, T, H, E]``.
    """
    check_layer_index(config, layer)
    window: int | jax.Array | None = config.attn.sliding_window
    if config.attn.layer_types:
        windows = layer_windows(config)
        window = None if windows is None else jnp.asarray(windows)[layer]
    if one_query and q.shape[1] == 1:
        return attn_lib.one_query_attention(
            q, k, v, mask, window=window, softcap=config.attn.logit_softcap, sinks=sinks
        )
    return attn_lib.dot_product_attention(
        q,
        k,
        v,
        mask,
        window=window,
        softcap=config.attn.logit_softcap,
        impl=config.attn.impl,
        sinks=sinks,
    )


def attention_block(
    config: ModelConfig, lp: Params, h_btd: jax.Array, tokens: TokenInfo, layer, store: KVStore
) -> tuple[jax.Array, KVStore]:
    """The attention layers' token mixer over a :class:`KVStore`: :func:`project_qkv`, the
    store's :meth:`~KVStore.attend` (with the layer's sink logits ``lp["sinks"]["logit"]``
    ``[H]`` when ``config.attn.sinks``, gpt-oss), with ``config.attn.output_gate``
    (Qwen3.5) each head's output times σ(h W_gate) (``lp["attn_gate"]`` ``[D, H, E]``), the
    output projection (with its LoRA adapter, and its bias with ``config.attn.out_bias``).

    Returns:
      (``[B, T, D]`` before the residual add, the updated store).
    """
    dtype = h_btd.dtype
    q, k, v = project_qkv(config, lp, h_btd, tokens, layer)
    sinks = lp["sinks"]["logit"] if config.attn.sinks else None
    attn, store = store.attend(config, q, k, v, layer, sinks)
    if config.attn.output_gate:
        attn = attn * jax.nn.sigmoid(_linear_heads(h_btd, lp["attn_gate"], dtype))
    o = jnp.einsum("btne,ned->btd", attn, lp["o_proj"]["kernel"].astype(dtype))
    if config.attn.out_bias:
        o = o + lp["o_proj"]["bias"].astype(dtype)
    return with_adapter(o, attn, lp["o_proj"], 2), store


def decoder_layer(
    config: ModelConfig,
    lp: Params,
    x_btd: jax.Array,
    store: Store,
    tokens: TokenInfo,
    layer,
    *,
    mesh: jax.sharding.Mesh | None = None,
    stack_index=None,
) -> tuple[jax.Array, Any, moe_lib.MoeStats | None]:
    """One pre-norm decoder layer over ``store``: the token mixer (``store.mix``) and the MLP,
    each with its RMSNorm before and residual add after; with ``config.norms.post_norms`` (Gemma 2 /
    3 / 4) their outputs are RMS-normed before each add; Gemma 4's per-layer input
    (``config.tokens.per_layer_input_size``) is gated into the residual stream after the MLP, and with
    ``config.norms.layer_scalars`` the result is multiplied by the layer's stored scalar (a
    constant: no gradient). A quantised frozen base's projections (QLoRA,
    :mod:`jaxrl_llm.models.quant`) are dequantised here, this layer's only, to ``x_btd``'s
    dtype (under remat 'dots' / 'full' the backward dequantises them again).

    Args:
      config: the model config.
      lp: this layer's parameters (one slice of ``params["layers"]``).
      x_btd: ``[B, T, D]`` the residual stream of the new tokens.
      store: the :class:`Store` (an attention layer's :class:`KVStore`).
      tokens: :class:`TokenInfo` of the new tokens.
      layer: ``[]`` int32 traced layer index (in a hybrid stack, the index among the layers of
        its kind: what its store reads).
      stack_index: ``[]`` int32, the layer's index in the whole stack, where the per-stack
        inputs are read: a mixture of experts' slice of ``tokens.routing``, Gemma 4's
        ``tokens.per_layer`` (None: ``layer``; a hybrid stack passes it).
      mesh: the expert-parallel mesh of a mixture of experts, and the mesh the activations
        are placed over (the residual stream ``[B, T, D]`` and the MLP's ``[B, T, F]`` by
        rows, :mod:`jaxrl_llm.models.layout`); None: the ambient mesh, and with none bound
        nothing is placed.

    Returns:
      (``[B, T, D]`` the new residual stream, the updated store, the MoE block's
      :class:`~jaxrl_llm.models.moe.MoeStats` or None).
    """
    chex.assert_rank(x_btd, 3)
    chex.assert_shape(tokens.positions, x_btd.shape[:2])
    c = config
    lp = quant.dequantize_layer(lp, x_btd.dtype)
    lay = layout_mesh(mesh)
    x_btd = place(x_btd, BTD, lay)
    h = apply_norm(c, x_btd, lp["attn_norm"])
    y, store = store.mix(c, lp, h, tokens, layer)
    if c.norms.post_norms:
        y = apply_norm(c, y, lp["post_attn_norm"])
    x = x_btd + y
    at = layer if stack_index is None else stack_index  # per-stack tables: routing, inputs
    stats: moe_lib.MoeStats | None
    if c.moe.beside_mlp:
        z, stats = dense_and_moe_block(c, lp, x, tokens, mesh, at)
    else:
        z, stats = mlp_block(c, lp, apply_norm(c, x, lp["mlp_norm"]), tokens, mesh, at)
    if c.norms.post_norms:
        z = apply_norm(c, z, lp["post_mlp_norm"])
    x = x + z
    if c.tokens.per_layer_input_size:
        x = _per_layer_input_block(c, lp, x, tokens, at)
    if c.norms.layer_scalars:
        x = x * jax.lax.stop_gradient(lp["layer_scalar"]["value"]).astype(x.dtype)
    return place(x, BTD, lay), store, stats

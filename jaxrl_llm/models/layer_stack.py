"""The stack: L decoder layers over a trunk's stores, written once.

:func:`stack` is the only caller of :func:`~jaxrl_llm.models.layer.decoder_layer`. It owns
what every trunk used to rebuild for itself:

- the new tokens' :class:`~jaxrl_llm.models.layer.TokenInfo` (embeddings, RoPE frequencies,
  routing weights, a recorded routing, Gemma 4's per-layer inputs), from :class:`NewTokens`;
- the layer scan: :func:`~jaxrl_llm.models.layer_scan.scan_layers` for a uniform stack,
  :func:`~jaxrl_llm.models.layer_scan.scan_periods` for a hybrid one (the layer kinds: a LINEAR
  layer reads its recurrent-state store, the others their attention store);
- KV sharing (Gemma 4): the attention store wrapped in
  :class:`~jaxrl_llm.models.kv_stores.KVShared` and carried from layer to layer.

A trunk is then a constructor of :class:`Stores` around it: the training forward
(:class:`LayerStores` of a ``NoCache`` and a ``FreshState``, closed over), prefill and the
static engine's decode step (a ``DenseCache`` and a ``RecurrentState``, carried), the paged
engine (``Pages``), and the shared-prompt forward (two passes per layer, a group's prompt
then its completions: ``jaxrl_llm.models.shared_prefix``).

Shapes: B rows, T new tokens, D model width, L layers.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.kv_stores import DenseCache, share_kv, unshare_kv
from jaxrl_llm.models.layer import (
    KVStore,
    Params,
    Store,
    TokenInfo,
    decoder_layer,
    embed_tokens,
    per_layer_inputs,
)
from jaxrl_llm.models.layer_scan import scan_layers, scan_periods
from jaxrl_llm.models.options import LayerType
from jaxrl_llm.models.positions import rope_inv_freq


class NewTokens(NamedTuple):
    """One pass of new tokens through the stack (what :func:`stack` builds a
    :class:`~jaxrl_llm.models.layer.TokenInfo` from).

    Attributes:
      ids: ``[B, T]`` int token ids.
      positions: ``[B, T]`` int32 RoPE positions.
      weights: ``[B, T]`` float32 weight of each token in a mixture of experts' statistics
        (None: 1 each).
      routing: a recorded routing of these tokens (``[B, T, L, k]``) or None.
      embeds: ``[B, T, D]`` input embeddings that stand for the ids' (a multimodal prompt's,
        image features inserted), or None: the ids' own.
    """

    ids: jax.Array
    positions: jax.Array
    weights: jax.Array | None = None
    routing: moe_lib.RecordedRouting | None = None
    embeds: jax.Array | None = None


class Stores(abc.ABC):
    """The stores a trunk's layers read and write: which store a layer of each kind mixes over
    in each pass, and what is carried from layer to layer (``held``, a pytree in the scan's
    carry; stores that never change are closed over instead, so autodiff saves them once)."""

    @abc.abstractmethod
    def start(self, config: ModelConfig, xs: Sequence[jax.Array]) -> Any:
        """What the first layer holds (the carried stores), given each pass's embeddings."""

    @abc.abstractmethod
    def store(self, held: Any, kind: LayerType, i: int, prev: Store | None) -> Store:
        """The store of pass ``i`` at a layer of ``kind``; ``prev`` is the store pass
        ``i − 1`` returned at this layer (None for the first pass)."""

    @abc.abstractmethod
    def keep(self, held: Any, kind: LayerType, i: int, store: Store) -> Any:
        """What is held after pass ``i`` of a layer of ``kind`` returned ``store``."""

    def pool(self, stats: Sequence[moe_lib.MoeStats | None]) -> Any:
        """A layer's per-layer output from its passes' MoE statistics (default: the first)."""
        return stats[0]

    @property
    def unrolled(self) -> bool:
        """The layers must run unrolled with static indices (a layered KV cache)."""
        return False


@dataclasses.dataclass(frozen=True)
class LayerStores(Stores):
    """One pass over an attention store and (in a hybrid stack) a recurrent-state store.

    Attributes:
      attention: the attention layers' :class:`~jaxrl_llm.models.layer.KVStore`.
      linear: the LINEAR layers' store (a hybrid stack), or None.
      carried: the stores change from layer to layer (a cache, the pages) and ride in the
        scan's carry; False: they are closed over (the training forward), unless KV sharing
        makes the attention store change.
      experts_only: each layer's output is only the experts its MoE block used (the engines'
        recorded routing), not the whole :class:`~jaxrl_llm.models.moe.MoeStats`.
    """

    attention: KVStore
    linear: Store | None = None
    carried: bool = True
    experts_only: bool = False

    def start(self, config: ModelConfig, xs: Sequence[jax.Array]) -> Any:
        """``(attention, linear)``, the attention store wrapped for KV sharing, when carried;
        ``()`` when neither changes."""
        b, t = xs[0].shape[:2]
        attention = share_kv(config, self.attention, b, t, xs[0].dtype)
        if attention is self.attention and not self.carried:
            return ()
        return attention, self.linear

    def store(self, held: Any, kind: LayerType, i: int, prev: Store | None) -> Store:
        """The held (or closed-over) store of the layer's kind."""
        attention, linear = held if held else (self.attention, self.linear)
        if kind == LayerType.LINEAR:
            assert linear is not None, "a LINEAR layer needs a recurrent-state store"
            return linear
        return attention

    def keep(self, held: Any, kind: LayerType, i: int, store: Store) -> Any:
        """The held pair with the layer's kind's store replaced."""
        if not held:
            return held
        return (held[0], store) if kind == LayerType.LINEAR else (store, held[1])

    @property
    def unrolled(self) -> bool:
        """The attention store is a layered :class:`~jaxrl_llm.models.kv_stores.DenseCache`
        (one buffer per layer), which the layers index statically."""
        return isinstance(self.attention, DenseCache) and self.attention.layered

    def pool(self, stats: Sequence[moe_lib.MoeStats | None]) -> Any:
        """The layer's MoE statistics, or with ``experts_only`` its experts (None if dense)."""
        s = stats[0]
        return s.experts if s is not None and self.experts_only else s

    @staticmethod
    def finish(held: Any) -> tuple[Any, Any]:
        """(the attention store without its KV-sharing wrapper, the linear store) that the
        last layer left; (None, None) when nothing was carried."""
        if not held:
            return None, None
        return unshare_kv(held[0]), held[1]


def stack(
    config: ModelConfig,
    params: Params,
    tokens: Sequence[NewTokens],
    stores: Stores,
    *,
    remat: str = "none",
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[tuple[jax.Array, ...], Any, Any]:
    """Embeddings → the L layers of :func:`~jaxrl_llm.models.layer.decoder_layer` over
    ``stores``, every pass of ``tokens`` in turn at each layer (before the final norm).

    Args:
      config: the model config (``is_hybrid``: the periods of its layer pattern are scanned).
      params: the model parameters.
      tokens: the passes of new tokens, e.g. ``[NewTokens(...)]``; with two, the second
        pass's store at each layer is built from the first's (a group's prompt, then its
        completions).
      stores: the :class:`Stores` the layers mix over.
      remat: rematerialisation of each layer (a hybrid stack: each period) under autodiff:
        'none', 'full' or 'dots'.
      mesh: the expert-parallel / activation mesh (:func:`decoder_layer`'s).

    Returns:
      (each pass's ``[B, T, D]`` residual stream after the last layer, what the last layer
      held (:meth:`Stores.start`'s structure), the per-layer outputs of :meth:`Stores.pool`
      stacked ``[L, ...]`` or None).
    """
    c = config
    inv_freq = rope_inv_freq(c)
    xs, infos = [], []
    for new in tokens:
        x = embed_tokens(c, params, new.ids) if new.embeds is None else new.embeds
        x = x.astype(c.compute_jnp_dtype)
        ple = per_layer_inputs(c, params, new.ids, x)
        xs.append(x)
        infos.append(TokenInfo(new.positions, inv_freq, new.weights, new.routing, ple))

    def step(carry, lp, kind, layer, index):
        xs, held = carry
        out, stats, prev = [], [], None
        for i, (x, info) in enumerate(zip(xs, infos, strict=True)):
            store = stores.store(held, kind, i, prev)
            x, prev, s = decoder_layer(c, lp, x, store, info, layer, mesh=mesh, stack_index=index)
            held = stores.keep(held, kind, i, prev)
            out.append(x)
            stats.append(s)
        return (tuple(out), held), stores.pool(stats)

    carry = (tuple(xs), stores.start(c, xs))
    if c.is_hybrid:
        (xs_out, held), outs = scan_periods(c, params["layers"], carry, step, remat=remat)
    else:
        (xs_out, held), outs = scan_layers(
            c,
            params["layers"],
            carry,
            lambda carry, lp, layer: step(carry, lp, LayerType.GLOBAL, layer, None),
            remat=remat,
            unroll=stores.unrolled,
        )
    return xs_out, held, outs

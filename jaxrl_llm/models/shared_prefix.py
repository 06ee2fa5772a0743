"""The trunk for groups of rows that share a prompt (group RL): each group's prompt runs once.

:func:`trunk_shared_prefix` is :func:`jaxrl_llm.models.transformer.trunk` for a batch laid out
group by group, G completions of each prompt: every layer runs the prompt rows once per group
(a :class:`~jaxrl_llm.models.kv_stores.GroupPrompt` store) and lets the G completions attend to
the keys/values it kept (a :class:`~jaxrl_llm.models.kv_stores.SharedPrompt`), both through the
one stack of layers (:func:`jaxrl_llm.models.layer_stack.stack`).

Shapes use the dimension letters of :mod:`jaxrl_llm.models.transformer`.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models import attention as attn_lib
from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.gated_deltanet import GroupPromptState, SharedPromptState
from jaxrl_llm.models.kv_stores import (
    GroupPrompt,
    KVShared,
    SharedPrompt,
    empty_held_kv,
    unshare_kv,
)
from jaxrl_llm.models.layer import apply_norm
from jaxrl_llm.models.layer_stack import NewTokens, Stores, stack
from jaxrl_llm.models.options import LayerType
from jaxrl_llm.models.params import Params
from jaxrl_llm.models.positions import default_positions, self_attention_mask


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
    return trunk_shared_prefix_with_stats(
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


def trunk_shared_prefix_with_stats(
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
        self_attention_mask(c, None if key_mask is None else key_mask[::g, :tp], pos_p)
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

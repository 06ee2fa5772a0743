"""Tests of jaxrl_llm/models/layer.py and its stores (kv_stores.py, paged_store.py): one decoder
layer over different stores computes the same thing on the same tokens, and a store that is
not attention at all (a per-row recurrent state) runs through the unchanged layer and scan."""

import ast
import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm
from jaxrl_llm import models as M

FAMILIES = ["llama", "gemma3_text", "qwen3_moe"]
LAYER = 1  # a layer index > 0, so a store that ignored the index would write the wrong layer


def _setup(family, seed=0):
    c = M.ModelConfig.tiny(family)
    params = M.init_params(c, jax.random.PRNGKey(seed))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, params)
    lp = jax.tree.map(lambda x: x[LAYER], params["layers"])
    return c, params, lp


def _normal(rng, shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_layer_over_pages_equals_it_over_a_dense_cache_with_ragged_rows(family):
    """The same new token of each row, after the same earlier keys held densely (one row at a
    time, its own write index) and in pages (all rows at once, ragged starts): same output,
    same keys/values written into the layer's slot."""
    c, _, lp = _setup(family)
    rng = np.random.default_rng(0)
    L, K, E, D = c.num_layers, c.num_kv_heads, c.head_dim, c.hidden_size
    start = np.array([6, 11, 2], np.int32)  # earlier tokens of each row
    z, n = 4, 3  # page size, pages per row
    table = np.array([[3, 1, 7], [2, 5, 6], [4, 0, 0]], np.int32)  # row 2: null-page padding
    pool_k = _normal(rng, (L, 8, z, K, E))
    pool_v = _normal(rng, (L, 8, z, K, E))
    x = _normal(rng, (3, 1, D))
    positions = jnp.asarray(start[:, None])
    info = M.TokenInfo(positions, M.rope_inv_freq(c))
    layer = jnp.asarray(LAYER, jnp.int32)

    pages = M.pages_store(M.PagedKVCache(pool_k, pool_v), jnp.asarray(table), jnp.asarray(start), 1)
    y_paged, pages, _ = M.decoder_layer(c, lp, x, pages, info, layer)

    for r in range(3):
        # row r's slots in order, as a dense cache of n·z slots for one row
        dense_k = jnp.concatenate([pool_k[:, p] for p in table[r]], axis=1)[:, None]
        dense_v = jnp.concatenate([pool_v[:, p] for p in table[r]], axis=1)[:, None]
        slots = n * z
        valid = jnp.arange(slots)[None] <= start[r]
        mask = M.AttentionMask(
            q_index=jnp.asarray([start[r]], jnp.int32),
            k_valid=valid,
            q_positions=positions[r : r + 1] if c.uses_window else None,
            k_positions=jnp.arange(slots, dtype=jnp.int32)[None] if c.uses_window else None,
        )
        store = M.DenseCache(k=dense_k, v=dense_v, index=jnp.asarray(start[r]), mask=mask)
        info_r = M.TokenInfo(positions[r : r + 1], info.inv_freq)
        y_dense, store, _ = M.decoder_layer(c, lp, x[r : r + 1], store, info_r, layer)
        np.testing.assert_allclose(y_paged[r], y_dense[0], atol=1e-5, rtol=0)
        page, off = table[r, start[r] // z], start[r] % z
        for got, want in ((pages.k, store.k), (pages.v, store.v)):
            np.testing.assert_allclose(got[LAYER, page, off], want[LAYER, 0, start[r]], atol=1e-5)
            assert not np.allclose(got[0, page, off], want[LAYER, 0, start[r]], atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prompt_store_equals_no_cache_on_the_concatenated_rows(family):
    """A group's prompt run once (GroupPrompt) and its completions over the kept keys
    (SharedPrompt) give the plain layer's output (NoCache over [prompt; completion] rows), and
    a MoE block's statistics, the prompt weighted G times, add up to the plain ones."""
    c, _, lp = _setup(family, seed=1)
    rng = np.random.default_rng(1)
    g, tp, tc, D = 2, 5, 4, c.hidden_size
    x_p = _normal(rng, (2, tp, D))  # one prompt per group
    x = jnp.concatenate([jnp.repeat(x_p, g, axis=0), _normal(rng, (4, tc, D))], axis=1)
    mask = np.ones((4, tp + tc), bool)
    mask[2:, :2] = False  # the second group's prompt is left-padded
    mask = jnp.asarray(mask)
    positions = M.default_positions(mask)
    window = c.uses_window
    inv = M.rope_inv_freq(c)
    layer = jnp.asarray(LAYER, jnp.int32)

    full = M.NoCache(M.causal_self_mask(mask, positions if window else None))
    info = M.TokenInfo(positions, inv, mask.astype(jnp.float32))
    y_full, _, stats_full = M.decoder_layer(c, lp, x, full, info, layer)

    pos_p, pos_c = positions[::g, :tp], positions[:, tp:]
    prompt = M.GroupPrompt(M.causal_self_mask(mask[::g, :tp], pos_p if window else None))
    info_p = M.TokenInfo(pos_p, inv, mask[::g, :tp].astype(jnp.float32) * g)
    y_p, kept, stats_p = M.decoder_layer(c, lp, x_p, prompt, info_p, layer)
    assert kept.k.shape == (2, tp, c.num_kv_heads, c.head_dim)
    mask_c = M.AttentionMask(
        q_index=jnp.arange(tp, tp + tc, dtype=jnp.int32),
        k_valid=mask,
        q_positions=pos_c if window else None,
        k_positions=positions if window else None,
    )
    shared = M.SharedPrompt(k=kept.k, v=kept.v, mask=mask_c, group_size=g)
    info_c = M.TokenInfo(pos_c, inv, mask[:, tp:].astype(jnp.float32))
    y_c, _, stats_c = M.decoder_layer(c, lp, x[:, tp:], shared, info_c, layer)

    real = np.asarray(mask)
    y_shared = np.concatenate([np.repeat(np.asarray(y_p), g, axis=0), np.asarray(y_c)], axis=1)
    np.testing.assert_allclose(y_shared[real], np.asarray(y_full)[real], atol=1e-5, rtol=0)
    if c.is_moe:
        # the routing sums add up; the routed experts are per token (prompt, then completion)
        summed = jax.tree.map(
            jnp.add, stats_p._replace(experts=None), stats_c._replace(experts=None)
        )
        for a, b in zip(summed, stats_full._replace(experts=None)):
            if b is not None:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        if stats_full.experts is not None:
            experts = np.concatenate(
                [np.repeat(np.asarray(stats_p.experts), g, axis=0), np.asarray(stats_c.experts)], 1
            )
            np.testing.assert_array_equal(experts[real], np.asarray(stats_full.experts)[real])
    else:
        assert stats_full is None and stats_p is None


@functools.partial(jax.tree_util.register_dataclass, data_fields=["state"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class _DecayingSum:
    """A per-row recurrent state (the shape of a linear-attention layer's store, not its
    arithmetic): ``s_t = ½ s_{t−1} + h_t W``, output ``s_t``; state ``[L, B, D]``, read and
    written once per call at the layer index."""

    state: jax.Array

    def mix(self, config, lp, h_btd, tokens, layer):
        d = config.hidden_size
        w = lp["o_proj"]["kernel"].reshape(d, d)  # any [D, D] weight of the layer will do
        u = jnp.einsum("btd,de->bte", h_btd, w)
        s0 = jax.lax.dynamic_index_in_dim(self.state, layer, 0, keepdims=False)

        def update(s, u_t):
            s = 0.5 * s + u_t
            return s, s

        s_last, ys = jax.lax.scan(update, s0, jnp.swapaxes(u, 0, 1))
        state = jax.lax.dynamic_update_index_in_dim(self.state, s_last, layer, 0)
        return jnp.swapaxes(ys, 0, 1), _DecayingSum(state)


def _stack(c, params, x, store, positions):
    info = M.TokenInfo(positions, M.rope_inv_freq(c), None)

    def step(carry, lp, layer):
        x, store = carry
        x, store, _ = M.decoder_layer(c, lp, x, store, info, layer)
        return (x, store), None

    (x, store), _ = M.scan_layers(c, params["layers"], (x, store), step)
    return x, store


def test_a_recurrent_state_store_runs_through_the_unchanged_layer_and_scan():
    """The interface takes a store that is not attention: T tokens in one call equal T calls
    of one token carrying the state through every layer, and the state matters."""
    c, params, _ = _setup("llama", seed=2)
    assert c.num_heads * c.head_dim == c.hidden_size  # the toy mixer reuses o_proj as [D, D]
    rng = np.random.default_rng(2)
    b, t, D = 3, 5, c.hidden_size
    x = _normal(rng, (b, t, D)) * 0.1
    zero = _DecayingSum(jnp.zeros((c.num_layers, b, D)))
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    y_all, final = jax.jit(lambda x, s: _stack(c, params, x, s, pos))(x, zero)

    one = jax.jit(lambda x, s, p: _stack(c, params, x, s, p))
    store, ys = zero, []
    for i in range(t):
        y, store = one(x[:, i : i + 1], store, pos[:, i : i + 1])
        ys.append(y)
    np.testing.assert_allclose(jnp.concatenate(ys, axis=1), y_all, atol=1e-5, rtol=0)
    np.testing.assert_allclose(store.state, final.state, atol=1e-5, rtol=0)
    # every layer wrote its own state, and the last token's output depends on it
    assert all(float(jnp.abs(final.state[i]).max()) > 0 for i in range(c.num_layers))
    fresh, _ = one(x[:, -1:], zero, pos[:, -1:])
    assert float(jnp.abs(fresh - y_all[:, -1:]).max()) > 1e-3


def test_no_module_imports_a_private_name_of_models():
    """models/ helpers another module needs are public (the paged store once used five private
    helpers of the transformer)."""
    root = pathlib.Path(jaxrl_llm.__file__).parent
    found = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "jaxrl_llm.models"
            ):
                found += [(f.name, a.name) for a in node.names if a.name.startswith("_")]
    assert found == []

"""Gated DeltaNet: the linear-attention token mixer of Qwen3.5's LINEAR layers, and its stores.

Per layer, on the normed new tokens h ``[B, T, D]`` (Yang, Kautz & Hatamizadeh 2024, "Gated
Delta Networks: Improving Mamba2 with Delta Rule", https://arxiv.org/abs/2412.06464 §3.3–3.4,
as Qwen3.5 arranges it)::

    [q; k; v] = SiLU(causal_conv_W(h W_qkv))          (depthwise, width W, over time)
    q, k      = L2norm(q) / √d_k, L2norm(k)           (per head; q/k heads repeated to H_v)
    β         = σ(h W_b),   g = −exp(A_log) · softplus(h W_a + dt_bias)
    o         = gated_delta_rule(q, k, v, g, β)        (:mod:`jaxrl_llm.models.delta_rule`)
    y         = (RMSNorm_w(o) ⊙ SiLU(h W_z)) W_out      (per value head)

The layer's memory of earlier tokens is the conv's last W − 1 inputs (``[B, W−1, C]``, C = the
q, k, v channels) and the delta rule's state (``[B, H_v, d_k, d_v]``). Its stores
(:class:`~jaxrl_llm.models.layer.Store`):

- :class:`FreshState`: no earlier tokens (zero window and state); the training forward.
- :class:`RecurrentState`: every LINEAR layer's window and state ``[L', ...]`` for every row,
  read and written by the traced index of the layer among the LINEAR layers; prefill, the
  static engine's decode step and (per slot) the paged engine.
- :class:`GroupPromptState` then :class:`SharedPromptState`: a group's prompt run once (one
  row per group), its G completions continuing its final state repeated G times
  (:func:`jaxrl_llm.models.trunk_shared_prefix`).

Padding: a token whose ``valid`` entry is False has its input zeroed, is skipped by the new
conv window, and has g = 0, β = 0 (so it leaves the state unchanged); its output is
ignorable. Padding before a row's real tokens (left-padded prompts) or after them (a bucketed
extension) leaves the window and state those real tokens alone would.

Shapes: B rows, T new tokens, D model width, C conv channels, W conv width, H_k query/key heads,
H_v value heads, d_k / d_v their dims, L' LINEAR layers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.delta_rule import gated_delta_rule
from jaxrl_llm.models.layer import TokenInfo

Params = dict[str, Any]


def causal_conv(
    x_btc: jax.Array, window: jax.Array, kernel_wc: jax.Array, valid_bt: jax.Array | None = None
):
    """Depthwise causal conv over time, each output reading the W − 1 inputs before it.

    ``out[t, c] = Σ_w kernel[w, c] · [window; x][t + w, c]`` (the window holds the W − 1 inputs
    before x).

    Args:
      x_btc: ``[B, T, C]`` new inputs; window: ``[B, W−1, C]`` the earlier ones (zeros at the
        start of a sequence); kernel_wc: ``[W, C]``.
      valid_bt: ``[B, T]`` bool, real inputs; None = all. The new window skips the others, so
        padding before or after a row's real tokens leaves it as the real tokens alone would.

    Returns:
      (``[B, T, C]`` outputs, the new window ``[B, W−1, C]``: the last W − 1 real inputs of
      [window; x]).
    """
    w = kernel_wc.shape[0]
    t = x_btc.shape[1]
    full = jnp.concatenate([window.astype(x_btc.dtype), x_btc], axis=1)
    kernel = kernel_wc.astype(x_btc.dtype)
    out = sum(full[:, i : i + t] * kernel[i] for i in range(w))
    if valid_bt is None:
        return out, full[:, t:]
    real = jnp.concatenate([jnp.ones(window.shape[:2], bool), valid_bt.astype(bool)], axis=1)
    rank = jnp.cumsum(real, axis=1)  # 1-based rank of each real input; the window's count
    total = rank[:, -1:]
    picks = [jnp.argmax(real & (rank == total - (w - 1) + 1 + j), axis=1) for j in range(w - 1)]
    at = jnp.stack(picks, axis=1)  # [B, W−1] positions in [window; x]
    return out, jnp.take_along_axis(full, at[:, :, None], axis=1)


def _l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_rms_norm(o: jax.Array, z: jax.Array, weight: jax.Array, eps: float, dtype) -> jax.Array:
    """``w · RMSNorm(o) ⊙ SiLU(z)`` over the last dim: normalised in float32, cast to ``dtype``
    before the weight, gated in float32 and cast back (Qwen3.5's gated output norm)."""
    o32 = o.astype(jnp.float32)
    o32 = o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, axis=-1, keepdims=True) + eps)
    normed = weight.astype(dtype) * o32.astype(dtype)
    return (normed.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(dtype)


def gated_deltanet_block(
    config: ModelConfig,
    lp: Params,
    h_btd: jax.Array,
    valid_bt: jax.Array,
    window: jax.Array | None,
    state: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One LINEAR layer's token mixer (the module docstring's equations) from a conv window and
    a delta-rule state.

    Args:
      config: the model config (the ``linear_*`` fields, ``rms_norm_eps``,
        ``delta_chunk_size``).
      lp: the layer's parameters (its :data:`~jaxrl_llm.models.layer.LINEAR_MODULE_NAMES` sub-trees and the norms).
      h_btd: ``[B, T, D]`` the normed new tokens.
      valid_bt: ``[B, T]`` bool, real tokens (padding leaves window and state unchanged).
      window: ``[B, W−1, C]`` the conv's earlier inputs; None = zeros.
      state: ``[B, H_v, d_k, d_v]`` float32 the delta rule's state; None = zeros.

    Returns:
      (``[B, T, D]`` the mixer's output, the new window, the new state).
    """
    c = config
    chex.assert_rank(h_btd, 3)
    b, t, _ = h_btd.shape
    chex.assert_shape(valid_bt, (b, t))
    dtype = h_btd.dtype
    hk, hv = c.linear.num_key_heads, c.linear.num_value_heads
    dk, dv = c.linear.key_head_dim, c.linear.value_head_dim
    channels, width = c.linear_conv_channels, c.linear.conv_kernel
    valid = valid_bt.astype(bool)
    h = jnp.where(valid[..., None], h_btd, jnp.zeros((), dtype))
    if window is None:
        window = jnp.zeros((b, width - 1, channels), dtype)
    qkv = jnp.einsum("btd,dc->btc", h, lp["in_proj_qkv"]["kernel"].astype(dtype))
    conv, new_window = causal_conv(qkv, window, lp["conv"]["kernel"], valid)
    conv = jax.nn.silu(conv)
    q = conv[..., : hk * dk].reshape(b, t, hk, dk).astype(jnp.float32)
    k = conv[..., hk * dk : 2 * hk * dk].reshape(b, t, hk, dk).astype(jnp.float32)
    v = conv[..., 2 * hk * dk :].reshape(b, t, hv, dv)
    q = _l2norm(q) * (dk**-0.5)
    k = _l2norm(k)
    q, k = jnp.repeat(q, hv // hk, axis=2), jnp.repeat(k, hv // hk, axis=2)
    beta = jax.nn.sigmoid(
        jnp.einsum("btd,dn->btn", h, lp["in_proj_b"]["kernel"].astype(dtype)).astype(jnp.float32)
    )
    a = jnp.einsum("btd,dn->btn", h, lp["in_proj_a"]["kernel"].astype(dtype)).astype(jnp.float32)
    delta = lp["delta"]
    g = -jnp.exp(delta["a_log"].astype(jnp.float32)) * jax.nn.softplus(
        a + delta["dt_bias"].astype(jnp.float32)
    )
    beta = jnp.where(valid[..., None], beta, 0.0)
    g = jnp.where(valid[..., None], g, 0.0)
    o, new_state = gated_delta_rule(q, k, v, g, beta, state, chunk_size=c.linear.chunk_size)
    z = jnp.einsum("btd,dne->btne", h, lp["in_proj_z"]["kernel"].astype(dtype))
    o = gated_rms_norm(o.astype(dtype), z, lp["linear_norm"]["scale"], c.norms.eps, dtype)
    y = jnp.einsum("btne,ned->btd", o, lp["out_proj"]["kernel"].astype(dtype))
    return y, new_window.astype(dtype), new_state


@functools.partial(jax.tree_util.register_dataclass, data_fields=["valid"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class FreshState:
    """No earlier tokens: every LINEAR layer starts from a zero window and state (the training
    forward). The store never changes.

    Attributes:
      valid: ``[B, T]`` bool, real tokens.
    """

    valid: jax.Array

    def mix(self, config: ModelConfig, lp: Params, h_btd, tokens: TokenInfo, layer):
        """:func:`gated_deltanet_block` from zeros; the store is unchanged."""
        del tokens, layer
        y, _, _ = gated_deltanet_block(config, lp, h_btd, self.valid, None, None)
        return y, self


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["conv", "state", "valid"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class RecurrentState:
    """Every LINEAR layer's conv window and delta-rule state for every row.

    Attributes:
      conv: ``[L', B, W−1, C]`` the conv's last W − 1 inputs, compute dtype.
      state: ``[L', B, H_v, d_k, d_v]`` float32 the delta rule's state.
      valid: ``[B, T]`` bool, which new tokens are real.
    """

    conv: jax.Array
    state: jax.Array
    valid: jax.Array

    def mix(self, config: ModelConfig, lp: Params, h_btd, tokens: TokenInfo, layer):
        """:func:`gated_deltanet_block` from layer ``layer``'s window and state (``layer``: the
        traced index among the LINEAR layers), written back in place."""
        del tokens
        window = jax.lax.dynamic_index_in_dim(self.conv, layer, 0, keepdims=False)
        state = jax.lax.dynamic_index_in_dim(self.state, layer, 0, keepdims=False)
        y, window, state = gated_deltanet_block(config, lp, h_btd, self.valid, window, state)
        conv = jax.lax.dynamic_update_index_in_dim(
            self.conv, window.astype(self.conv.dtype), layer, 0
        )
        new = jax.lax.dynamic_update_index_in_dim(self.state, state, layer, 0)
        return y, dataclasses.replace(self, conv=conv, state=new)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["valid", "conv", "state"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class GroupPromptState:
    """A group's prompt, one row per group, from zeros: the store comes back holding the last
    mixed layer's final window and state for the group's completions
    (:class:`SharedPromptState`), as :class:`~jaxrl_llm.models.GroupPrompt` keeps keys.

    Attributes:
      valid: ``[B/G, T_p]`` bool, real prompt tokens.
      conv, state: ``[B/G, W−1, C]`` and ``[B/G, H_v, d_k, d_v]`` after the prompt (None before).
    """

    valid: jax.Array
    conv: jax.Array | None = None
    state: jax.Array | None = None

    def mix(self, config: ModelConfig, lp: Params, h_btd, tokens: TokenInfo, layer):
        """:func:`gated_deltanet_block` of the prompt rows from zeros; keeps the final state."""
        del tokens, layer
        y, conv, state = gated_deltanet_block(config, lp, h_btd, self.valid, None, None)
        return y, dataclasses.replace(self, conv=conv, state=state)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["conv", "state", "valid"],
    meta_fields=["group_size"],
)
@dataclasses.dataclass(frozen=True)
class SharedPromptState:
    """The completions of groups of G rows that share a prompt: row ``g·G + i`` continues its
    group's prompt state (repeated G times; under autodiff the repeat's transpose sums the G
    completions' gradients into the prompt). The store does not change.

    Attributes:
      conv, state: this layer's prompt window and state (:class:`GroupPromptState`).
      valid: ``[B, T_c]`` bool, real completion tokens. group_size: static G.
    """

    conv: jax.Array
    state: jax.Array
    valid: jax.Array
    group_size: int

    def mix(self, config: ModelConfig, lp: Params, h_btd, tokens: TokenInfo, layer):
        """:func:`gated_deltanet_block` of the completions from their prompt's state."""
        del tokens, layer
        g = self.group_size
        conv, state = jnp.repeat(self.conv, g, axis=0), jnp.repeat(self.state, g, axis=0)
        y, _, _ = gated_deltanet_block(config, lp, h_btd, self.valid, conv, state)
        return y, self


def init_recurrent_state(
    config: ModelConfig, batch_size: int, dtype=None
) -> tuple[jax.Array, jax.Array]:
    """Zero (conv window ``[L', B, W−1, C]`` in ``dtype``, default the compute dtype; state
    ``[L', B, H_v, d_k, d_v]`` float32) for ``batch_size`` rows."""
    c = config
    dtype = c.compute_jnp_dtype if dtype is None else dtype
    n = c.num_linear_layers
    conv = jnp.zeros((n, batch_size, c.linear.conv_kernel - 1, c.linear_conv_channels), dtype)
    state = jnp.zeros(
        (n, batch_size, c.linear.num_value_heads, c.linear.key_head_dim, c.linear.value_head_dim),
        jnp.float32,
    )
    return conv, state

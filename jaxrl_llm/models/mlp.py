"""The decoder layer's feed-forward blocks (:func:`~.layer.decoder_layer` calls them): the gated
MLP (SwiGLU, GeGLU), the sparse mixture of experts with Qwen3.5-MoE's shared expert, and Gemma 4's
dense MLP beside its experts. Shapes as in :mod:`.layer`: B rows, T new tokens, D model width,
F MLP width."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models import moe as moe_lib
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layer_base import BTF, Params, TokenInfo, apply_norm, with_adapter
from jaxrl_llm.models.layout import layout_mesh, place


def _dense_mlp(config: ModelConfig, h_btd, lp, mesh=None):
    """The gated MLP ``down(act(h W_g) ⊙ h W_u)``: SwiGLU, or GeGLU with tanh-GELU (Gemma).
    ``mesh`` (resolved, :func:`~jaxrl_llm.models.layout.layout_mesh`): the ``[B, T, F]``
    activations are placed by rows over it (None: not placed)."""
    dtype = h_btd.dtype
    h = h_btd
    gate = with_adapter(
        jnp.einsum("btd,df->btf", h, lp["gate_proj"]["kernel"].astype(dtype)), h, lp["gate_proj"], 1
    )
    up = with_adapter(
        jnp.einsum("btd,df->btf", h, lp["up_proj"]["kernel"].astype(dtype)), h, lp["up_proj"], 1
    )
    gate, up = place(gate, BTF, mesh), place(up, BTF, mesh)
    act = place(moe_lib.gated_activation(config)(gate, up), BTF, mesh)
    down = jnp.einsum("btf,fd->btd", act, lp["down_proj"]["kernel"].astype(dtype))
    return with_adapter(down, act, lp["down_proj"], 1)


def mlp_block(
    config: ModelConfig,
    lp: Params,
    h_btd: jax.Array,
    tokens: TokenInfo,
    mesh: jax.sharding.Mesh | None = None,
    layer=None,
) -> tuple[jax.Array, moe_lib.MoeStats | None]:
    """The layer's MLP on the normed ``h_btd``: the gated MLP (SwiGLU, or GeGLU with tanh-GELU
    for Gemma), or with ``config.moe.num_experts`` the sparse MoE block
    (:func:`jaxrl_llm.models.moe.sparse_moe`, over ``mesh``'s expert axis, its routing
    statistics weighted by ``tokens.weights``; with ``tokens.routing`` the recorded experts
    of layer ``layer`` replayed or compared against).

    Returns:
      (``[B, T, D]`` before the residual add, :class:`~jaxrl_llm.models.moe.MoeStats` or None).
    """
    if config.is_moe:
        rec = tokens.routing
        y, stats = moe_lib.sparse_moe(
            config,
            h_btd,
            tokens.weights,
            lp,
            mesh=mesh,
            recorded_btk=None if rec is None else rec.at_layer(layer),
            replay=rec is not None and rec.replay,
        )
        if config.moe.shared_expert_size:
            y = y + _shared_expert(h_btd, lp, layout_mesh(mesh))
        return y, stats
    return _dense_mlp(config, h_btd, lp, layout_mesh(mesh)), None


def dense_and_moe_block(
    config: ModelConfig,
    lp: Params,
    x_btd: jax.Array,
    tokens: TokenInfo,
    mesh: jax.sharding.Mesh | None = None,
    layer=None,
) -> tuple[jax.Array, moe_lib.MoeStats]:
    """Gemma 4's feed-forward with ``config.moe.beside_mlp``, on the residual stream ``x_btd``
    (un-normed): the dense MLP of ``mlp_norm(x)``, normed by ``post_dense_norm``, plus the
    sparse MoE block of ``moe_norm(x)``, normed by ``post_moe_norm``; the block routes
    ``rms(x) · router_norm · D^-1/2`` (a scale-free RMSNorm times a learned scale) and scales
    each weight by its expert's ``expert_scale`` (transformers' ``Gemma4TextDecoderLayer`` and
    ``Gemma4TextRouter``).

    Returns:
      (``[B, T, D]`` before the post-norm and residual add, the MoE block's statistics).
    """
    c = config
    lay = layout_mesh(mesh)
    dense = _dense_mlp(c, apply_norm(c, x_btd, lp["mlp_norm"]), lp, lay)
    rx = apply_norm(c, x_btd, None) * lp["router_norm"]["scale"].astype(x_btd.dtype)
    rx = rx * jnp.asarray(c.hidden_size**-0.5, rx.dtype)
    rec = tokens.routing
    y, stats = moe_lib.sparse_moe(
        c,
        apply_norm(c, x_btd, lp["moe_norm"]),
        tokens.weights,
        lp,
        mesh=mesh,
        recorded_btk=None if rec is None else rec.at_layer(layer),
        replay=rec is not None and rec.replay,
        router_x_btd=rx,
    )
    z = apply_norm(c, dense, lp["post_dense_norm"]) + apply_norm(c, y, lp["post_moe_norm"])
    return z, stats


def _shared_expert(h_btd, lp, mesh=None):
    """Qwen3.5-MoE's shared expert: ``σ(h W_sg) · down(SiLU(h W_g) ⊙ h W_u)``, every token."""
    dtype = h_btd.dtype
    h = h_btd
    gate = jnp.einsum("btd,df->btf", h, lp["shared_gate_proj"]["kernel"].astype(dtype))
    up = jnp.einsum("btd,df->btf", h, lp["shared_up_proj"]["kernel"].astype(dtype))
    act = place(jax.nn.silu(gate) * up, BTF, mesh)
    down = jnp.einsum("btf,fd->btd", act, lp["shared_down_proj"]["kernel"].astype(dtype))
    weight = jnp.einsum("btd,dl->btl", h, lp["shared_expert_gate"]["kernel"].astype(dtype))
    return jax.nn.sigmoid(weight) * down

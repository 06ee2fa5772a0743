"""How many parameters a :class:`~jaxrl_llm.models.config.ModelConfig` has, as used or as
stored (:meth:`~jaxrl_llm.models.config.ModelConfig.num_params`). The config is typed ``Any``
here: this module is imported by ``models/config.py`` and cannot import it back.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.options import LayerType


def count_params(config: Any, *, active: bool = False, stored: bool = False) -> int:
    """:meth:`~jaxrl_llm.models.config.ModelConfig.num_params` of the ``ModelConfig``
    ``config`` (its docstring says what ``active`` and ``stored`` count)."""
    d, f = config.hidden_size, config.mlp.intermediate_size
    dense = not config.is_moe or config.moe.beside_mlp
    mlp = 3 * d * f if dense and (stored or not config.mlp.double_wide) else 0
    if config.is_moe:
        experts = config.moe.num_experts_per_tok if active else config.moe.num_experts
        mlp += experts * 3 * d * config.moe.intermediate_size + d * config.moe.num_experts
        if config.moe.expert_bias:  # each expert's gate, up and down biases; the router's
            mlp += experts * (2 * config.moe.intermediate_size + d) + config.moe.num_experts
        if config.moe.shared_expert_size:
            mlp += 3 * d * config.moe.shared_expert_size + d
        if config.moe.beside_mlp:  # router norm, expert scales, three norms
            mlp += d + config.moe.num_experts + 3 * d
    per_layer = mlp + 2 * d
    if config.norms.post_norms:
        per_layer += 2 * d
    if config.norms.layer_scalars:
        per_layer += 1
    p = config.tokens.per_layer_input_size
    if p:  # gate, projection, norm; the embedding, projection and norm beside the trunk
        per_layer += 2 * d * p + d
    hv, dv = config.linear.num_value_heads, config.linear.value_head_dim
    linear = (
        d * config.linear_conv_channels  # in_proj_qkv
        + config.linear.conv_kernel * config.linear_conv_channels  # conv
        + d * hv * dv  # in_proj_z
        + 2 * d * hv  # in_proj_b, in_proj_a
        + 2 * hv  # dt_bias, A_log
        + dv  # gated norm
        + hv * dv * d  # out_proj
    )
    n = (
        config.vocab_size * d
        + config.num_layers * per_layer
        + sum(attention_params(config, i, stored) for i in range(config.num_layers))
        + sum(3 * d * config.mlp_width(i) for i in range(config.num_layers) if dense and not mlp)
        + config.num_linear_layers * linear
        + d
    )
    if p:
        n += (config.per_layer_vocab + d) * config.num_layers * p + p
    if not config.tie_embeddings:
        n += d * config.vocab_size
    n += d * config.num_labels
    return n


def attention_params(config: Any, layer: int, stored: bool = False) -> int:
    """Parameters of layer ``layer``'s attention (0 for a LINEAR layer), at its own size
    or (``stored``) at the stored one."""
    if config.attn.layer_types and config.attn.layer_types[layer] == LayerType.LINEAR:
        return 0
    d, h = config.hidden_size, config.attn.num_heads
    k, e = config.layer_heads(layer)
    kv = (
        1 if config.attn.global_k_eq_v and config.attn.layer_types[layer] == LayerType.GLOBAL else 2
    )
    norms = 2
    if config.kv_shared(layer):
        kv, norms = 0, 1
    if stored:
        k, e, kv, norms = config.store_kv_heads, config.store_head_dim, 2, 2
    n = d * h * e + kv * d * k * e + h * e * d
    if config.attn.output_gate:
        n += d * h * e
    if config.attn.bias:
        n += h * e + kv * k * e
    if config.attn.qk_norm:
        n += norms * e
    if config.attn.sinks:
        n += h
    if config.attn.out_bias:
        n += d
    return n

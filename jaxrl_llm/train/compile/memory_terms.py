"""The byte formulas the memory estimate (:func:`~jaxrl_llm.train.compile.memory.estimate_memory`)
sums: parameter counts (all, per device, LoRA adapters, a mixture of experts' experts, the
layer tree, a quantised base's projections) and what one training forward keeps per token
for its backward pass (activations by remat policy and layer kind, attention's kept scores,
a Gated DeltaNet mixer's tensors). What each counts, and what it was checked against, is in
its docstring and in :mod:`jaxrl_llm.train.compile.memory`'s."""

from __future__ import annotations

import math

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models.attention import BLOCKWISE_BLOCK, NAIVE_MAX_SCORES
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.options import LayerType
from jaxrl_llm.models.params import param_shapes_and_axes
from jaxrl_llm.models.quant import PROJECTION_IN_DIMS, kernel_bytes

#: Bytes of an element of each dtype the estimate takes ('bf16' / 'fp32' and their long names).
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2}


def lora_params(config: ModelConfig, rank: int) -> int:
    """Adapter parameters for rank-r LoRA on q, k, v, o, gate, up and down of every layer (a
    mixture of experts: q, k, v, o only; its experts take no adapters; a hybrid stack's
    linear-attention layers have no q, k, v, o)."""
    c = config
    d, f, h, k, e = (
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.store_kv_heads,
        c.store_head_dim,
    )
    attn = rank * ((d + h * e) + 2 * (d + k * e) + (h * e + d))
    dense_mlp = not c.is_moe or c.moe_beside_mlp  # Gemma 4's MoE keeps its dense MLP
    mlp = rank * (2 * (d + f) + (f + d)) if dense_mlp else 0
    return c.num_attention_layers * attn + c.num_layers * mlp


def projection_bytes(config: ModelConfig, base_dtype: str) -> tuple[int, float]:
    """(weights, stored bytes) of the dense projection kernels (q, k, v, o, gate, up, down)
    that a quantised LoRA base quantises (:func:`jaxrl_llm.models.quant.quantize_base`), over
    the whole model, held as ``base_dtype`` (:func:`~jaxrl_llm.models.quant.kernel_bytes`)."""
    specs = param_shapes_and_axes(config)["layers"]
    weights, nbytes = 0, 0.0
    for name, n_in in PROJECTION_IN_DIMS.items():
        if "kernel" in specs.get(name, {}):
            shape = specs[name]["kernel"][0]
            weights += math.prod(shape)
            nbytes += kernel_bytes(shape, n_in, base_dtype)
    return weights, nbytes


def layer_weights(config: ModelConfig) -> int:
    """Weights stored under ``params["layers"]`` (what :func:`~jaxrl_llm.models.separate_layers`
    copies): every leaf of the stacked layer tree."""

    def count(tree: dict) -> int:  # (shape, logical axes) leaves under nested dicts
        return sum(count(v) if isinstance(v, dict) else math.prod(v[0]) for v in tree.values())

    return count(param_shapes_and_axes(config)["layers"])


def expert_params(config: ModelConfig) -> int:
    """Parameters of a mixture of experts' expert weights (L · X · 3 · D · F_e; 0 when dense):
    the part of :meth:`ModelConfig.num_params` the ``expert`` mesh axis splits."""
    c = config
    if not c.is_moe:
        return 0
    return c.num_layers * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size


def params_per_device(config: ModelConfig, *, weight_shards: int, expert: int = 1) -> float:
    """Parameters one device holds: the dense ones over fsdp × tensor (``weight_shards``), the
    experts' over ``expert`` too; attention heads as stored (Gemma 4's padded ones)."""
    ne = expert_params(config)
    return (config.num_params(stored=True) - ne) / weight_shards + ne / (weight_shards * expert)


def activation_bytes_per_token_per_layer(
    config: ModelConfig,
    seq_len: int,
    *,
    remat: str,
    dtype_bytes: int,
    tensor: int = 1,
    linear: bool = False,
) -> int:
    """Bytes kept for the backward pass, per token and layer, in one model's training forward.

    ``none``: layer input, both norm outputs, q/k/v (pre and post RoPE), what attention keeps
    of its scores (:func:`kept_scores_bytes_per_token`), attention output, residual, MLP
    gate/up/activation/product.
    ``dots``: only matmul outputs (q, k, v, attention output projection, gate, up, down).
    ``full``: only the layer input (the layer is recomputed in the backward pass).
    A mixture of experts holds its MLP tensors for each of the k experts of a token (F →
    k · F_e), the routed copies of the token (k · D in, k · D out; ``dots``: the k · D down
    outputs in place of D) and the float32 router probabilities (X).
    ``linear``: a Gated DeltaNet layer of a hybrid stack (Qwen3.5) in place of attention:
    its token mixer's tensors (:func:`linear_mixer_bytes_per_token`) instead of q/k/v and the
    scores; the norms, residual and MLP as above.
    """
    c = config
    d, f, e = c.hidden_size, c.intermediate_size // tensor, c.store_head_dim
    h, k = max(c.num_heads // tensor, 1), max(c.store_kv_heads // tensor, 1)
    moe_extra = 0
    if c.is_moe:
        kk = c.num_experts_per_tok
        f = kk * c.moe_intermediate_size // tensor
        moe_extra = {"dots": dtype_bytes * (kk - 1) * d, "none": dtype_bytes * 2 * kk * d}.get(
            remat, 0
        ) + 4 * c.num_experts * (remat != "full")
        if c.shared_expert_size and remat != "full":  # its gate/up/act/product (dots: gate, up)
            f += c.shared_expert_size // tensor
    if remat == "full":
        return dtype_bytes * d
    if remat not in ("dots", "none"):
        raise ConfigError(f"unknown remat {remat!r}; allowed: 'none', 'dots', 'full'")
    if linear:
        mixer = linear_mixer_bytes_per_token(c, remat=remat, dtype_bytes=dtype_bytes, tensor=tensor)
        mlp = dtype_bytes * (2 * f + d) if remat == "dots" else dtype_bytes * (5 * d + 4 * f)
        return mixer + mlp + moe_extra
    if remat == "dots":
        return dtype_bytes * (h * e + 2 * k * e + d + 2 * f + d) + moe_extra
    scores = kept_scores_bytes_per_token(h, seq_len)
    return dtype_bytes * (5 * d + 3 * h * e + 4 * k * e + 4 * f) + scores + moe_extra


def kept_scores_bytes_per_token(heads: int, seq_len: int) -> int:
    """What attention keeps of its scores per token for the backward pass. The naive path
    (``AttentionImpl.AUTO`` for T² ≤ :data:`~jaxrl_llm.models.NAIVE_MAX_SCORES`): the float32
    scores and probabilities, 2 · 4 · H · T bytes. The blockwise path (longer T): one key
    block's float32 probabilities per query and head, 4 · H · 512 bytes, and the running
    maximum and sum, 2 · 4 · H, however long T is. Measured: the compiled Llama-3.2-1B GRPO
    step on v5e:2x2 holds ``f32[16,8,4,512,512]`` (16 rows' 512 completion tokens × 32
    heads × one 512-key block) for the layer its backward recomputes; a tiny Llama's step
    compiled on CPU with no remat at T = 1024 and 2048 holds about 4 · H · 512 bytes a token
    in every layer beyond the rest (``tests/train/test_memory.py``). Splash and cuDNN are
    not told apart from the blockwise path."""
    if seq_len * seq_len <= NAIVE_MAX_SCORES:
        return 2 * 4 * heads * seq_len
    return 4 * heads * min(seq_len, BLOCKWISE_BLOCK) + 2 * 4 * heads


def linear_mixer_bytes_per_token(
    config: ModelConfig, *, remat: str, dtype_bytes: int, tensor: int = 1
) -> int:
    """Bytes a Gated DeltaNet token mixer (:mod:`jaxrl_llm.models.gated_deltanet`, chunked
    delta rule :func:`jaxrl_llm.models.delta_rule.delta_rule_chunked`) keeps per token for the
    backward pass: an approximation from the block's code, not checked tensor by tensor.

    ``none``: the q/k/v projection, the conv's output and its SiLU (C channels each), z and the
    gated norm's output (H_v · d_v each) in the compute dtype; in float32 q and k normalised and
    repeated to the value heads, W (H_v · d_k each), U and the output (H_v · d_v each), β and
    the gate, the chunk's three C_k × C_k matrices per head (K Kᵀ, its triangular solve, the
    decayed Q Kᵀ), and the chunk-start states (H_v · d_k · d_v per chunk of C_k tokens).
    ``dots``: the matmul outputs only: the four input projections, the output projection, and
    the delta rule's matrix products (two C_k × C_k matrices, U, W, the output, the states).
    """
    c = config
    hv = max(c.linear_num_value_heads // tensor, 1)
    dk, dv, ck = c.linear_key_head_dim, c.linear_value_head_dim, c.delta_chunk_size
    channels = c.linear_conv_channels // tensor
    states = 4 * hv * dk * dv // ck
    if remat == "dots":
        proj = dtype_bytes * (channels + hv * dv + c.hidden_size) + 4 * 2 * hv
        return proj + 4 * hv * (2 * ck + dk + 2 * dv) + states
    return (
        dtype_bytes * (3 * channels + 2 * hv * dv)
        + 4 * hv * (3 * dk + 2 * dv + 2 + 3 * ck)
        + states
    )


def activation_bytes(
    config: ModelConfig, tokens: int, seq_len: int, *, remat: str, dtype_bytes: int, tensor: int
) -> int:
    """Activations one training forward over ``tokens`` keeps for its backward pass, with the
    unit the backward recomputes (``dots`` / ``full``) live again once in full.

    A plain stack scans layer by layer: L layers of :func:`activation_bytes_per_token_per_layer`
    and, with remat, one layer's ``none`` share. A hybrid stack (Qwen3.5) scans periods of its
    layer pattern (three linear-attention layers then one attention layer) and rematerialises
    a period as a unit: with ``full`` it keeps one input per period, and the period's layers
    are all live during its backward pass.
    """

    def per_token(kind_remat: str, linear: bool) -> int:
        return activation_bytes_per_token_per_layer(
            config, seq_len, remat=kind_remat, dtype_bytes=dtype_bytes, tensor=tensor, linear=linear
        )

    if not config.is_hybrid:
        per_layer = per_token(remat, False) * config.num_layers
        live = 0 if remat == "none" else per_token("none", False)
        return (per_layer + live) * tokens
    n_lin, n_att = config.num_linear_layers, config.num_attention_layers
    period = config.layer_period
    if remat == "full":
        kept = dtype_bytes * config.hidden_size * (config.num_layers // len(period))
    else:
        kept = n_lin * per_token(remat, True) + n_att * per_token(remat, False)
    live = 0
    if remat != "none":
        live = sum(per_token("none", t == LayerType.LINEAR) for t in period)
    return (kept + live) * tokens

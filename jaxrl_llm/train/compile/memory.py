"""Per-device memory estimates for a post-training run: the "models in memory" view.

The source texts compare algorithms by how many full models they hold (PPO 4: policy,
reference, critic, reward model; DPO / GRPO / KTO 2: policy and reference; SimPO / ORPO 1;
on-policy distillation 2: policy and teacher, the teacher assumed the policy's size).
This module turns that into bytes per device for a given model, algorithm, mesh, precision,
batch and sequence length, so a user can see before launching whether a run fits.

What is counted, per device (``shards`` = fsdp × tensor for weights, data × fsdp for the batch;
a mixture of experts' expert weights are further split over the ``expert`` axis):

* every model's weights (trainable ones in float32 master precision; frozen ones in
  ``frozen_dtype``, float32 by default as the trainers hold them); with LoRA the reference is
  the base with adapters off (no second copy) and only the adapters are trainable; a LoRA
  base stored quantised (``lora_base_dtype`` int8 / nf4, QLoRA) counts its stored bytes;
* gradients (float32, like the master weights) and AdamW moments (2 × float32) of what trains;
  with gradient accumulation (``micro_batches`` > 1) a second float32 gradient, the sum the
  step's scan over micro-batches carries beside each micro-batch's gradient;
* the compute-dtype copy of a trained model's weights that its step makes (XLA hoists the
  per-layer casts out of the scan over layers, so the whole sharded copy exists at once);
* training activations kept for the backward pass, without or with rematerialisation (per
  layer, per token: the layer input only for ``full``; the matmul outputs for ``dots``);
* under fsdp, the unembedding gathered whole in the compute dtype for the log-prob ops, and
  its gradient, whole until the all-reduce over fsdp sums it;
* logits: the ``[B, T, V]`` float32 tensor and its softmax/gradient when materialised, or one
  ``[B, chunk, V]`` slice with the chunked log-prob ops (the default here);
* the rollout KV cache for online algorithms (prompts × G rows × (prompt + completion) slots);
* on TPU, full fine-tuning a weight whose shard XLA lays out other than by default (a sharded
  minor dimension that is not a multiple of 128, as gpt-oss's width 2,880 over fsdp=8): the
  optimizer update's out-of-place copies of it, a phase of their own
  (:func:`~jaxrl_llm.train.compile.memory_tiles.relaid_update_bytes`).

A hybrid stack (Qwen3.5: Gated DeltaNet linear-attention layers between attention layers) is
counted by layer kind: the linear layers' own parameters (``ModelConfig.num_params``); their
token mixer's activations (:func:`linear_mixer_bytes_per_token`, an approximation from the
block's code) in place of attention's; the unit its backward recomputes is a period of the
layer pattern (the stack scans periods); in the rollout, keys and values only for the attention
layers and, for each linear layer, a conv window and a float32 delta-rule state per row.

Mixture of experts (``config.num_experts > 0``): weights, gradients and optimizer state count
every expert (the total parameters, :func:`expert_params` of them split over ``expert`` as
well); activations count the k experts a token is routed to (the sorted dispatch's
``[N·k, F_e]`` buffers and ``[N·k, D]`` gathered copies, which do not shrink with the expert
axis) and the router's float32 probabilities. Tokens are replicated over the expert axis.

Gradients, activations, logits and the KV cache are transient: the rollout and the trainable
models' updates (policy, critic) run one after the other, so the total counts the largest of
their transient memory, not the sum. Attention keeps its float32 scores (2 · H · T per token)
only on the naive path of short sequences; longer ones run blockwise and keep one key block's
worth per query (:func:`kept_scores_bytes_per_token`).

These are estimates of the dominant terms, checked against XLA's compiled memory analysis on
CPU in ``tests/train/test_memory.py`` and against TPU programs compiled for a TPU slice
(``jaxrl-llm compile``, ``tests/cli/test_compile.py``); fragmentation, small buffers and the
compiler's own temporaries (weight casts, collectives' buffers) are not modelled.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.losses.registry import ALGORITHMS as LOSS_ALGORITHMS
from jaxrl_llm.losses.registry import Algorithm
from jaxrl_llm.models.attention import BLOCKWISE_BLOCK, NAIVE_MAX_SCORES
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.options import LayerType
from jaxrl_llm.models.params import param_shapes_and_axes
from jaxrl_llm.models.quant import BASE_DTYPES, PROJECTION_IN_DIMS, QUANTIZED, kernel_bytes
from jaxrl_llm.train.compile.memory_presets import (  # noqa: F401  (re-exported: the planning tables)
    DEVICE_MEMORY,
    MODEL_PRESETS,
    GiB,
    device_memory_bytes,
)
from jaxrl_llm.train.compile.memory_tiles import relaid_update_bytes


class Role(str, enum.Enum):
    """A model held during training."""

    POLICY = "policy"
    REFERENCE = "reference"
    CRITIC = "critic"
    REWARD = "reward"
    TEACHER = "teacher"


@dataclasses.dataclass(frozen=True)
class AlgorithmMemory:
    """Which models an algorithm holds and how it uses the batch.

    Attributes:
      roles: the models in memory. trainable: the roles that get gradients and optimizer state.
      online: samples rollouts (needs a KV cache). sequences_per_example: forward passes per
      example (2 for chosen + rejected pairs). data / reward: the source texts' columns.
    """

    roles: tuple[Role, ...]
    trainable: tuple[Role, ...]
    online: bool
    sequences_per_example: int = 1
    data: str = ""
    reward: str = ""


P, R, C, RM = Role.POLICY, Role.REFERENCE, Role.CRITIC, Role.REWARD


def algorithm_memory(algo: Algorithm) -> AlgorithmMemory:
    """The models an algorithm holds, from its registry entry (``jaxrl_llm.losses.ALGORITHMS``):
    the trained model (a reward model for ``trains_reward_head``), a frozen reference when its
    loss at the paper's defaults needs one (or for PPO's KL-shaped reward), a critic, and a
    reward model when its reward usually is a learned one, a frozen teacher (distillation)."""
    trained = RM if algo.trains_reward_head else P
    try:
        preset = algo.preset()
    except TypeError:  # a preset with required fields (pairwise_rank's group size)
        preset = None
    uses_ref = preset is not None and algo.loss_spec().uses_reference(preset)
    roles = [trained] + ([R] if uses_ref or algo.critic else []) + ([C] if algo.critic else [])
    roles += [RM] if algo.scores_with_reward_model and trained is not RM else []
    roles += [Role.TEACHER] if algo.teacher else []
    data = algo.data_note + (" (+ greedy baseline)" if algo.greedy_baseline else "")
    return AlgorithmMemory(
        tuple(roles),
        (trained,) + ((C,) if algo.critic else ()),
        algo.online,
        algo.sequences_per_example,
        data,
        algo.reward_note,
    )


# Derived from the algorithm table: one source of algorithm facts.
ALGORITHM_MEMORY: dict[str, AlgorithmMemory] = {
    name: algorithm_memory(algo) for name, algo in LOSS_ALGORITHMS.items()
}


_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2}


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


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """One line of the estimate: a model (or "run") and a component with its bytes/device."""

    model: str
    component: str
    bytes: int
    transient: bool = False


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """The estimate: rows, total per device, the device's memory and the verdict."""

    rows: tuple[MemoryRow, ...]
    total_bytes_per_device: int
    device_bytes: int
    models_in_memory: int
    weight_copies: int
    algorithm: str
    device: str
    sampler_tensor: int = 0

    @property
    def fits(self) -> bool:
        """Whether the total fits in the device's memory."""
        return self.total_bytes_per_device <= self.device_bytes

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``models_in_memory`` and ``total_bytes_per_device`` are ints)."""
        return {
            "algorithm": self.algorithm,
            "device": self.device,
            "models_in_memory": int(self.models_in_memory),
            "weight_copies": int(self.weight_copies),
            "total_bytes_per_device": int(self.total_bytes_per_device),
            "device_bytes": int(self.device_bytes),
            "fits": self.fits,
            "sampler_tensor": int(self.sampler_tensor),
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }

    def table(self) -> str:
        """A plain-text table for the terminal."""
        lines = [f"{'model':<10} {'component':<34} {'GiB/device':>11}", "-" * 57]
        for r in self.rows:
            mark = " *" if r.transient else ""
            lines.append(f"{r.model:<10} {r.component + mark:<34} {r.bytes / GiB:>11.3f}")
        lines.append("-" * 57)
        if any(r.transient for r in self.rows):
            lines.append("* transient: the total counts only the largest model's share")
        lines.append(f"{'total':<45} {self.total_bytes_per_device / GiB:>11.3f}")
        lines.append(
            f"{'device memory (' + self.device + ')':<45} {self.device_bytes / GiB:>11.3f}"
        )
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(
            f"models in memory: {self.models_in_memory} "
            f"(distinct weight copies: {self.weight_copies}); verdict: {verdict}"
        )
        return "\n".join(lines)


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


def _check_estimate_args(
    algorithm: str,
    dtype: str,
    frozen_dtype: str,
    logits: str,
    optimizer: str,
    sizes: dict[str, int],
    lora_rank: int,
    lora_base_dtype: str | None = None,
) -> None:
    """Raises ConfigError for an unknown choice or a size below its minimum (estimate_memory)."""
    if algorithm not in ALGORITHM_MEMORY:
        raise ConfigError(
            f"unknown algorithm {algorithm!r}{did_you_mean(algorithm, ALGORITHM_MEMORY)}; allowed: "
            f"{sorted(ALGORITHM_MEMORY)}"
        )
    for name, text in (("dtype", dtype), ("frozen_dtype", frozen_dtype)):
        if text not in _BYTES:
            raise ConfigError(f"unknown {name} {text!r}; allowed: 'bf16', 'fp32'")
    if logits not in ("chunked", "full"):
        raise ConfigError(f"logits must be 'chunked' or 'full', got {logits!r}")
    if optimizer not in ("adamw", "sgd"):
        raise ConfigError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    for name, v in sizes.items():
        if v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if lora_rank < 0:
        raise ConfigError(f"lora_rank must be >= 0, got {lora_rank}")
    if lora_base_dtype is not None and lora_base_dtype not in BASE_DTYPES:
        raise ConfigError(
            f"unknown lora_base_dtype {lora_base_dtype!r}; allowed: {list(BASE_DTYPES)}"
        )


def _row(model: str, component: str, nbytes: float, transient: bool = False) -> MemoryRow:
    """One row of the estimate, its bytes rounded to an int."""
    return MemoryRow(model, component, int(round(nbytes)), transient)


def _update_tokens(train_rows: int, seq_len: int, prompt_len: int | None, group: int) -> int:
    """Tokens of one forward/backward slice: the shared prompt once per group of ``group``."""
    tokens = train_rows * seq_len
    if group > 1 and prompt_len:  # the shared prompt once per group
        tokens = train_rows * (seq_len - prompt_len) + -(-train_rows // group) * prompt_len
    return tokens


def _weight_rows(
    config: ModelConfig,
    name: str,
    trains: bool,
    *,
    n: float,
    lora_rank: int,
    frozen_dtype: str,
    optimizer: str,
    weight_shards: int,
    lora_base_dtype: str | None = None,
) -> list[MemoryRow]:
    """A model's weights per device and, when it trains, its gradients and optimizer state
    (the gradients transient: they exist during that model's update only, so PPO's policy and
    critic gradients are never alive together, nor either beside the rollout's KV cache).
    A LoRA base stored as ``lora_base_dtype`` (None: ``frozen_dtype``) counts its stored
    bytes: int8 / nf4 quantise the dense projections (:func:`projection_bytes`:
    codes and scales), the rest in bfloat16 (:func:`models.quant.quantize_base`)."""
    fb = _BYTES[frozen_dtype]
    opt_factor = 2 if optimizer == "adamw" else 0
    if trains and lora_rank:
        na = lora_params(config, lora_rank)
        base = [_row(name, f"base weights ({frozen_dtype}, frozen)", n * fb)]
        if lora_base_dtype in QUANTIZED:
            proj, proj_bytes = projection_bytes(config, lora_base_dtype)
            base = [
                _row(
                    name,
                    f"base projections ({lora_base_dtype}, frozen)",
                    proj_bytes / weight_shards,
                ),
                _row(name, "base other weights (bf16, frozen)", (n - proj / weight_shards) * 2),
            ]
        elif lora_base_dtype is not None:
            base = [
                _row(name, f"base weights ({lora_base_dtype}, frozen)", n * _BYTES[lora_base_dtype])
            ]
        return [
            *base,
            _row(name, "LoRA adapters (fp32)", na * 4 / weight_shards),
            _row(name, "gradients (adapters, fp32)", na * 4 / weight_shards, True),
            _row(name, f"optimizer state ({optimizer})", opt_factor * na * 4 / weight_shards),
        ]
    if trains:
        return [
            _row(name, "weights (fp32 master)", n * 4),
            _row(name, "gradients (fp32)", n * 4, True),
            _row(name, f"optimizer state ({optimizer})", opt_factor * n * 4),
        ]
    return [_row(name, f"weights ({frozen_dtype}, frozen)", n * fb)]


def _update_rows(
    config: ModelConfig,
    role: Role,
    *,
    n: float,
    seq_len: int,
    tokens: int,
    train_rows: int,
    dtype: str,
    tensor: int,
    remat: str,
    logits: str,
    logits_chunk: int,
    accumulated_bytes: float = 0,
    gathered: bool = False,
) -> list[MemoryRow]:
    """The transient rows of a trained model's step: activations, cast weights, the gradient
    sum of accumulation (``accumulated_bytes`` per device, 0 without), logits, and with the
    weights split over fsdp (``gathered``) the whole unembedding in the compute dtype, which
    XLA all-gathers once for the log-prob chunks (``bf16[4096,128256]``, 1002 MiB, in the
    8B steps compiled for v5p on fsdp=4), and its gradient, also whole: XLA all-reduces
    ``bf16[8192,128256]`` over fsdp three times in the 70B GRPO step on v5p:4x4x4, whose
    buffer report holds two dedicated 1.96 GiB slots of it beside a third it shares (in the
    8B steps gradient and weight shared one slot: counting both is the safe side)."""
    name, b = role.value, _BYTES[dtype]
    act = activation_bytes(config, tokens, seq_len, remat=remat, dtype_bytes=b, tensor=tensor)
    rows = [_row(name, f"activations (remat={remat})", act, True)]
    if b < 4:  # XLA hoists the per-layer casts out of the scan over layers
        rows.append(_row(name, f"weights cast to {dtype} (in the step)", n * b, True))
    if accumulated_bytes:  # the scan over micro-batches carries Σ∇ beside each slice's ∇
        rows.append(_row(name, "gradient sum (fp32, micro-batches)", accumulated_bytes, True))
    if role != Role.CRITIC and role != Role.REWARD:
        vocab = config.vocab_size / tensor
        if gathered:  # the log-prob ops take the unembedding whole, all-gathered over fsdp
            unembed = vocab * config.hidden_size * b
            rows.append(_row(name, f"unembedding gathered ({dtype})", unembed, True))
            # ... and its gradient is formed whole before the all-reduce over fsdp sums it
            rows.append(_row(name, f"unembedding gradient, whole ({dtype})", unembed, True))
        width = seq_len if logits == "full" else min(logits_chunk, seq_len)
        # float32 logits and their gradient (softmax fused into them by XLA)
        rows.append(_row(name, f"logits ({logits})", 2 * train_rows * width * vocab * 4, True))
    return rows


def _model_rows(
    config: ModelConfig,
    algo: AlgorithmMemory,
    *,
    n: float,
    n_teacher: float,
    lora_rank: int,
    reference_offloaded: bool,
    frozen_dtype: str,
    optimizer: str,
    weight_shards: int,
    seq_len: int,
    tokens: int,
    train_rows: int,
    dtype: str,
    tensor: int,
    remat: str,
    logits: str,
    logits_chunk: int,
    accumulate: bool = False,
    gathered: bool = False,
    lora_base_dtype: str | None = None,
) -> tuple[list[MemoryRow], int]:
    """The rows of every model the algorithm holds, and how many weight copies they are
    (``accumulate``: an update sums the gradients of several micro-batches; ``gathered``: the
    weights are split over fsdp, :func:`_update_rows`)."""
    rows: list[MemoryRow] = []
    weight_copies = 0
    trained = lora_params(config, lora_rank) / weight_shards if lora_rank else n
    for role in algo.roles:
        trains = role in algo.trainable
        name = role.value
        if role == Role.REFERENCE and lora_rank:
            rows.append(_row(name, "weights (base, adapters off: shared)", 0))
            continue
        if role == Role.REFERENCE and reference_offloaded:
            rows.append(_row(name, "weights (offloaded to host)", 0))
            continue
        weight_copies += 1
        rows += _weight_rows(
            config,
            name,
            trains,
            n=n_teacher if role == Role.TEACHER else n,
            lora_rank=lora_rank,
            frozen_dtype=frozen_dtype,
            optimizer=optimizer,
            weight_shards=weight_shards,
            lora_base_dtype=lora_base_dtype,
        )
        if trains:
            rows += _update_rows(
                config,
                role,
                n=n,
                seq_len=seq_len,
                tokens=tokens,
                train_rows=train_rows,
                dtype=dtype,
                tensor=tensor,
                remat=remat,
                logits=logits,
                logits_chunk=logits_chunk,
                accumulated_bytes=4 * trained if accumulate else 0,
                gathered=gathered,
            )
    return rows, weight_copies


def _kv_cache_rows(
    config: ModelConfig, local_rows: int, seq_len: int, tensor: int, b: int
) -> list[MemoryRow]:
    """The rollout's KV cache on one device (transient): keys and values of the attention
    layers that compute their own (not Gemma 4's KV-shared ones); a hybrid stack's linear-attention layers hold instead a conv window
    (``[W−1, C]`` per row, compute dtype) and a float32 delta-rule state (``[H_v, d_k, d_v]``
    per row), whatever the length."""
    c = config
    kv = (
        2
        * c.num_kv_layers
        * local_rows
        * seq_len
        * max(c.store_kv_heads // tensor, 1)
        * c.store_head_dim
        * b
    )
    rows = [_row("rollout", f"KV cache ({local_rows} rows x {seq_len} slots)", kv, True)]
    if c.is_hybrid:
        hv = max(c.linear_num_value_heads // tensor, 1)
        per_row = (c.linear_conv_kernel - 1) * (c.linear_conv_channels // tensor) * b + (
            4 * hv * c.linear_key_head_dim * c.linear_value_head_dim
        )
        state = c.num_linear_layers * local_rows * per_row
        rows.append(
            _row("rollout", f"recurrent state ({c.num_linear_layers} linear layers)", state, True)
        )
    return rows


#: Devices whose decode reads the layers as separate arrays (XLA:GPU copies a scanned
#: layer's weights at every token step; models.separate_layers).
GPU_DEVICES = frozenset(("h100", "h200"))


def _peak_bytes(rows: list[MemoryRow]) -> int:
    """The persistent rows' sum plus the largest model's transient rows."""
    # Activations and logits live only during one model's update, the KV cache only during the
    # rollout; these phases run one after the other, so the peak holds the largest, not the sum.
    transient: dict[str, int] = {}
    for r in rows:
        if r.transient:
            transient[r.model] = transient.get(r.model, 0) + r.bytes
    return sum(r.bytes for r in rows if not r.transient) + max(transient.values(), default=0)


def estimate_memory(
    config: ModelConfig,
    algorithm: str,
    *,
    batch_size: int = 8,
    seq_len: int = 512,
    prompt_len: int | None = None,
    group_size: int = 1,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    expert: int = 1,
    dtype: str = "bf16",
    lora_rank: int = 0,
    remat: str = "none",
    logits: str = "chunked",
    logits_chunk: int = 128,
    optimizer: str = "adamw",
    device: str = "h100",
    micro_batches: int = 1,
    minibatches: int = 1,
    frozen_dtype: str = "fp32",
    prompt_group_size: int = 1,
    reference_offloaded: bool = False,
    teacher_config: ModelConfig | None = None,
    sampler_tensor: int | str = 0,
    sampler_replicas: int = 1,
    sampler_dtype: str | None = None,
    lora_base_dtype: str | None = None,
) -> MemoryEstimate:
    """Estimate per-device memory of one training step of ``algorithm``.

    Args:
      config: the model (policy; critic and reward model are assumed the same size).
      algorithm: a key of :data:`ALGORITHM_MEMORY`.
      batch_size: examples per step (online: prompts per step; rows = prompts × group_size).
      seq_len: tokens per sequence (prompt + completion). prompt_len: the prompt's share of
        it (needed for ``prompt_group_size``).
      group_size: G samples per prompt for online algorithms.
      data, fsdp, tensor, expert: mesh axis sizes (``expert`` splits a mixture of experts'
        experts; tokens are replicated over it). dtype: 'bf16' or 'fp32' (activations and the KV
        cache; trainable weights keep float32 master copies).
      lora_rank: 0 for full fine-tuning; r > 0 trains rank-r adapters only.
      remat: 'none' | 'dots' | 'full'. logits: 'chunked' | 'full'. optimizer: 'adamw' | 'sgd'.
      device: a key of :data:`DEVICE_MEMORY` or 'cpu'.
      micro_batches: gradient-accumulation slices of one optimizer update, one after the
        other (``train.micro_batches``): activations and logits are those of one slice, and
        more than one adds the float32 gradient sum the accumulation carries beside each
        slice's gradient.
      minibatches: optimizer updates a step's rows are split into (online
        ``train.minibatches``): each update's forward/backward holds 1 / minibatches of the
        rows, with no gradient sum between updates.
      frozen_dtype: dtype frozen weights are held in (reference, reward model, LoRA base).
        'fp32' by default: this package's trainers keep the reference as a copy of the float32
        master weights and load models in float32, casting to ``dtype`` per use (the compiled
        TPU programs of ``jaxrl-llm compile`` show them at 4 bytes/param).
      prompt_group_size: rows sharing one prompt in the update's forward pass (the online
        trainer's ``loss.prompt_group_size``, G by default there): the prompt's activations
        are computed once per group, the completions' per row. 1 = every row in full.
      reference_offloaded: a frozen reference held off the device (host memory), counted as
        0 bytes per device. A what-if for
        :func:`~jaxrl_llm.train.compile.memory_advice.fit_advice`: this package's trainers keep
        the reference on the device (with LoRA it is the base and costs nothing).
      sampler_tensor, sampler_replicas, sampler_dtype: online, the sampler's own copy of the
        weights (:mod:`jaxrl_llm.parallel.placement`): its tensor degree (0: the sampler reads
        the learner's weights, no copy; ``"auto"``: chosen as a run on ``device`` chooses it,
        :func:`auto_sampler`, with the replicas the rest of the devices), its replicas over
        the whole job, its dtype (``bf16`` / ``fp32``; default ``dtype``).
      teacher_config: a distillation teacher's model (None: the policy's size); its weights
        are frozen, held in ``frozen_dtype``.
      lora_base_dtype: with ``lora_rank``, how the frozen base is stored
        (``model.lora.base_dtype``: float32, bfloat16, int8, nf4; None: ``frozen_dtype``):
        int8 / nf4 count the quantised projections' stored bytes (codes and scales) and the
        other weights at bfloat16.

    Returns:
      A :class:`MemoryEstimate`.
    """
    given = {k: v for k, v in locals().items() if k not in ("config", "algorithm")}
    if sampler_tensor == "auto":  # every argument as given, the sampler's chosen
        return _with_auto_sampler(config, algorithm, given)
    return _estimate_given(config, algorithm, types.SimpleNamespace(**given))


def _estimate_given(
    config: ModelConfig, algorithm: str, a: types.SimpleNamespace
) -> MemoryEstimate:
    """:func:`estimate_memory` of its keyword arguments ``a`` as given (the sampler's copy
    already chosen)."""
    sizes = dict(
        batch_size=a.batch_size,
        seq_len=a.seq_len,
        group_size=a.group_size,
        data=a.data,
        fsdp=a.fsdp,
        tensor=a.tensor,
        expert=a.expert,
        micro_batches=a.micro_batches,
        minibatches=a.minibatches,
        prompt_group_size=a.prompt_group_size,
    )
    _check_estimate_args(
        algorithm,
        a.dtype,
        a.frozen_dtype,
        a.logits,
        a.optimizer,
        sizes,
        a.lora_rank,
        a.lora_base_dtype,
    )
    algo = ALGORITHM_MEMORY[algorithm]
    weight_shards = a.fsdp * a.tensor
    batch_shards = a.data * a.fsdp
    n = params_per_device(config, weight_shards=weight_shards, expert=a.expert)
    n_teacher = params_per_device(
        a.teacher_config or config, weight_shards=weight_shards, expert=a.expert
    )
    rows_per_step = a.batch_size * (a.group_size if algo.online else 1) * algo.sequences_per_example
    local_rows = -(-rows_per_step // batch_shards)
    train_rows = -(-local_rows // (a.micro_batches * a.minibatches))  # one forward/backward's
    tokens = _update_tokens(train_rows, a.seq_len, a.prompt_len, a.prompt_group_size)
    rows, weight_copies = _model_rows(
        config,
        algo,
        n=n,
        n_teacher=n_teacher,
        lora_rank=a.lora_rank,
        reference_offloaded=a.reference_offloaded,
        frozen_dtype=a.frozen_dtype,
        optimizer=a.optimizer,
        weight_shards=weight_shards,
        seq_len=a.seq_len,
        tokens=tokens,
        train_rows=train_rows,
        dtype=a.dtype,
        tensor=a.tensor,
        remat=a.remat,
        logits=a.logits,
        logits_chunk=a.logits_chunk,
        accumulate=a.micro_batches > 1,
        gathered=a.fsdp > 1,
        lora_base_dtype=a.lora_base_dtype,
    )
    if a.device.startswith("tpu") and algo.trainable and not a.lora_rank:
        # the update after the backward pass: weight and moments of a re-laid weight copied
        # into the gradient's layout, and their new values (memory_tiles.py)
        mesh = dict(fsdp=a.fsdp, tensor=a.tensor, expert=a.expert)
        moments = 2 if a.optimizer == "adamw" else 0
        relaid = relaid_update_bytes(config, mesh, arrays=1 + moments)
        if relaid:
            rows.append(_row("optimizer", "update out of place (TPU layout)", relaid, True))
    sampler_tensor = a.sampler_tensor
    if algo.online and isinstance(sampler_tensor, int) and sampler_tensor:
        # the sampler's copy (parallel/placement.py): tensor parallel, whole per replica,
        # kept from step to step (its buffers take the next copy); the cache by KV heads
        b = _BYTES[a.sampler_dtype or a.dtype]
        copy = config.num_params() * b // sampler_tensor
        rows.append(_row("rollout", f"sampler copy (tensor={sampler_tensor})", copy, False))
        replica_rows = -(-rows_per_step // max(a.sampler_replicas, 1))
        rows += _kv_cache_rows(config, replica_rows, a.seq_len, sampler_tensor, b)
    elif algo.online:
        rows += _kv_cache_rows(config, local_rows, a.seq_len, a.tensor, _BYTES[a.dtype])
    if algo.online and a.device in GPU_DEVICES and not config.is_hybrid:
        # decode on GPU reads the layers as separate arrays (sampling.static_generate.
        # decode_params): one more copy of the layer weights while the rollout runs
        shards = sampler_tensor if isinstance(sampler_tensor, int) and sampler_tensor else 0
        b = _BYTES[(a.sampler_dtype or a.dtype) if shards else a.dtype]
        split = layer_weights(config) * b // (shards or weight_shards)
        rows.append(_row("rollout", "separate layer arrays (decode on GPU)", split, True))
    return MemoryEstimate(
        rows=tuple(rows),
        total_bytes_per_device=_peak_bytes(rows),
        device_bytes=device_memory_bytes(a.device),
        models_in_memory=len(algo.roles),
        weight_copies=weight_copies,
        algorithm=algorithm,
        device=a.device,
        sampler_tensor=int(sampler_tensor) if algo.online else 0,
    )


def auto_sampler(config: ModelConfig, algorithm: str, **kwargs: Any) -> dict[str, Any]:
    """The sampler's copy for an :func:`estimate_memory` setup (``kwargs``), chosen as a run
    on ``kwargs["device"]`` chooses it (``rollout.tensor: auto``,
    :func:`jaxrl_llm.parallel.decode_model.auto_tensor`): tensor parallel within a host of the
    device kind (or over a TPU slice's hosts), in bfloat16 on TPU and GPU, in the HBM the
    rest of the step leaves; ``{}`` (no copy: decode on the learner's layout) offline or when
    no degree fits."""
    from jaxrl_llm.parallel.decode_model import auto_tensor, host_devices, kind_chip

    if not ALGORITHM_MEMORY[algorithm].online:
        return {}
    kwargs = {**kwargs, "sampler_tensor": 0}
    device = kwargs.get("device", "h100")
    n = 1
    for k in ("data", "fsdp", "tensor", "expert"):
        n *= int(kwargs.get(k, 1))
    chip = kind_chip(device)
    dtype = "fp32" if chip is None else "bf16"
    without = estimate_memory(config, algorithm, **kwargs).total_bytes_per_device
    rows = kwargs.get("batch_size", 8) * kwargs.get("group_size", 1)
    t, _ = auto_tensor(
        config,
        devices=n,
        local_devices=host_devices(device, n),
        rows=rows,
        tokens=kwargs.get("seq_len", 512),
        chip=chip,
        dtype="bfloat16" if dtype == "bf16" else "float32",
        free_bytes=None if chip is None else max(chip.hbm_bytes - without, 0.0),
        cross_process=device.startswith("tpu-"),
    )
    if t == 0:
        return {}
    return dict(sampler_tensor=t, sampler_replicas=n // t, sampler_dtype=dtype)


def _with_auto_sampler(config: ModelConfig, algorithm: str, kwargs: dict) -> MemoryEstimate:
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("sampler_")}
    chosen = auto_sampler(config, algorithm, **kwargs)
    return estimate_memory(config, algorithm, **kwargs, **chosen)

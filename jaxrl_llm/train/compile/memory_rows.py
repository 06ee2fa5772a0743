"""The models an algorithm holds during a step and each one's rows of the memory estimate
(:func:`~jaxrl_llm.train.compile.memory.estimate_memory`): weights, gradients and optimizer
state; the transient rows of an update (activations, cast weights, the gradient sum, logits,
the unembedding gathered whole under fsdp); the rollout's KV cache; and the peak, which
counts the persistent rows and the largest model's transient ones."""

from __future__ import annotations

import dataclasses

from jaxrl_llm.losses.registry import ALGORITHMS as LOSS_ALGORITHMS
from jaxrl_llm.losses.registry import Algorithm
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.quant import QUANTIZED
from jaxrl_llm.parallel.roles import Role
from jaxrl_llm.train.compile.memory_terms import (
    DTYPE_BYTES,
    activation_bytes,
    lora_params,
    projection_bytes,
)


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


P, R, C, RM = Role.LEARNER, Role.REFERENCE, Role.CRITIC, Role.REWARD


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


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """One line of the estimate: a model (or "run") and a component with its bytes/device."""

    model: str
    component: str
    bytes: int
    transient: bool = False


def row(model: str, component: str, nbytes: float, transient: bool = False) -> MemoryRow:
    """One row of the estimate, its bytes rounded to an int."""
    return MemoryRow(model, component, int(round(nbytes)), transient)


def update_tokens(train_rows: int, seq_len: int, prompt_len: int | None, group: int) -> int:
    """Tokens of one forward/backward slice: the shared prompt once per group of ``group``."""
    tokens = train_rows * seq_len
    if group > 1 and prompt_len:  # the shared prompt once per group
        tokens = train_rows * (seq_len - prompt_len) + -(-train_rows // group) * prompt_len
    return tokens


def weight_rows(
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
    fb = DTYPE_BYTES[frozen_dtype]
    opt_factor = 2 if optimizer == "adamw" else 0
    if trains and lora_rank:
        na = lora_params(config, lora_rank)
        base = [row(name, f"base weights ({frozen_dtype}, frozen)", n * fb)]
        if lora_base_dtype in QUANTIZED:
            proj, proj_bytes = projection_bytes(config, lora_base_dtype)
            base = [
                row(
                    name,
                    f"base projections ({lora_base_dtype}, frozen)",
                    proj_bytes / weight_shards,
                ),
                row(name, "base other weights (bf16, frozen)", (n - proj / weight_shards) * 2),
            ]
        elif lora_base_dtype is not None:
            base = [
                row(
                    name,
                    f"base weights ({lora_base_dtype}, frozen)",
                    n * DTYPE_BYTES[lora_base_dtype],
                )
            ]
        return [
            *base,
            row(name, "LoRA adapters (fp32)", na * 4 / weight_shards),
            row(name, "gradients (adapters, fp32)", na * 4 / weight_shards, True),
            row(name, f"optimizer state ({optimizer})", opt_factor * na * 4 / weight_shards),
        ]
    if trains:
        return [
            row(name, "weights (fp32 master)", n * 4),
            row(name, "gradients (fp32)", n * 4, True),
            row(name, f"optimizer state ({optimizer})", opt_factor * n * 4),
        ]
    return [row(name, f"weights ({frozen_dtype}, frozen)", n * fb)]


def update_rows(
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
    name, b = role.value, DTYPE_BYTES[dtype]
    act = activation_bytes(config, tokens, seq_len, remat=remat, dtype_bytes=b, tensor=tensor)
    rows = [row(name, f"activations (remat={remat})", act, True)]
    if b < 4:  # XLA hoists the per-layer casts out of the scan over layers
        rows.append(row(name, f"weights cast to {dtype} (in the step)", n * b, True))
    if accumulated_bytes:  # the scan over micro-batches carries Σ∇ beside each slice's ∇
        rows.append(row(name, "gradient sum (fp32, micro-batches)", accumulated_bytes, True))
    if role != Role.CRITIC and role != Role.REWARD:
        vocab = config.vocab_size / tensor
        if gathered:  # the log-prob ops take the unembedding whole, all-gathered over fsdp
            unembed = vocab * config.hidden_size * b
            rows.append(row(name, f"unembedding gathered ({dtype})", unembed, True))
            # ... and its gradient is formed whole before the all-reduce over fsdp sums it
            rows.append(row(name, f"unembedding gradient, whole ({dtype})", unembed, True))
        width = seq_len if logits == "full" else min(logits_chunk, seq_len)
        # float32 logits and their gradient (softmax fused into them by XLA)
        rows.append(row(name, f"logits ({logits})", 2 * train_rows * width * vocab * 4, True))
    return rows


def model_rows(
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
    weights are split over fsdp, :func:`update_rows`)."""
    rows: list[MemoryRow] = []
    weight_copies = 0
    trained = lora_params(config, lora_rank) / weight_shards if lora_rank else n
    for role in algo.roles:
        trains = role in algo.trainable
        name = role.value
        if role == Role.REFERENCE and lora_rank:
            rows.append(row(name, "weights (base, adapters off: shared)", 0))
            continue
        if role == Role.REFERENCE and reference_offloaded:
            rows.append(row(name, "weights (offloaded to host)", 0))
            continue
        weight_copies += 1
        rows += weight_rows(
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
            rows += update_rows(
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


def kv_cache_rows(
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
    rows = [row("rollout", f"KV cache ({local_rows} rows x {seq_len} slots)", kv, True)]
    if c.is_hybrid:
        hv = max(c.linear_num_value_heads // tensor, 1)
        per_row = (c.linear_conv_kernel - 1) * (c.linear_conv_channels // tensor) * b + (
            4 * hv * c.linear_key_head_dim * c.linear_value_head_dim
        )
        state = c.num_linear_layers * local_rows * per_row
        rows.append(
            row("rollout", f"recurrent state ({c.num_linear_layers} linear layers)", state, True)
        )
    return rows


def peak_bytes(rows: list[MemoryRow]) -> int:
    """The persistent rows' sum plus the largest model's transient rows."""
    # Activations and logits live only during one model's update, the KV cache only during the
    # rollout; these phases run one after the other, so the peak holds the largest, not the sum.
    transient: dict[str, int] = {}
    for r in rows:
        if r.transient:
            transient[r.model] = transient.get(r.model, 0) + r.bytes
    return sum(r.bytes for r in rows if not r.transient) + max(transient.values(), default=0)

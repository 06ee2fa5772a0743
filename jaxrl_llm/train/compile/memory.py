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
token mixer's activations
(:func:`~jaxrl_llm.train.compile.memory_terms.linear_mixer_bytes_per_token`, an
approximation from the block's code) in place of attention's; the unit its backward recomputes is a period of the
layer pattern (the stack scans periods); in the rollout, keys and values only for the attention
layers and, for each linear layer, a conv window and a float32 delta-rule state per row.

Mixture of experts (``config.num_experts > 0``): weights, gradients and optimizer state count
every expert (the total parameters,
:func:`~jaxrl_llm.train.compile.memory_terms.expert_params` of them split over ``expert``
as well); activations count the k experts a token is routed to (the sorted dispatch's
``[N·k, F_e]`` buffers and ``[N·k, D]`` gathered copies, which do not shrink with the expert
axis) and the router's float32 probabilities. Tokens are replicated over the expert axis.

Gradients, activations, logits and the KV cache are transient: the rollout and the trainable
models' updates (policy, critic) run one after the other, so the total counts the largest of
their transient memory, not the sum. Attention keeps its float32 scores (2 · H · T per token)
only on the naive path of short sequences; longer ones run blockwise and keep one key block's
worth per query (:func:`~jaxrl_llm.train.compile.memory_terms.kept_scores_bytes_per_token`).

These are estimates of the dominant terms, checked against XLA's compiled memory analysis on
CPU in ``tests/train/test_memory.py`` and against TPU programs compiled for a TPU slice
(``jaxrl-llm compile``, ``tests/cli/test_compile.py``); fragmentation, small buffers and the
compiler's own temporaries (weight casts, collectives' buffers) are not modelled.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.quant import BASE_DTYPES
from jaxrl_llm.parallel.chips import GiB
from jaxrl_llm.train.compile.memory_presets import (  # noqa: F401  (re-exported: the planning tables)
    DEVICE_MEMORY,
    MODEL_PRESETS,
    device_memory_bytes,
)
from jaxrl_llm.train.compile.memory_rows import (  # noqa: F401  (re-exported: the algorithm table)
    ALGORITHM_MEMORY,
    AlgorithmMemory,
    MemoryRow,
    Role,
    kv_cache_rows,
    model_rows,
    peak_bytes,
    row,
    update_tokens,
)
from jaxrl_llm.train.compile.memory_terms import DTYPE_BYTES, layer_weights, params_per_device
from jaxrl_llm.train.compile.memory_tiles import relaid_update_bytes


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
        if text not in DTYPE_BYTES:
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


#: Devices whose decode reads the layers as separate arrays (XLA:GPU copies a scanned
#: layer's weights at every token step; models.separate_layers).
GPU_DEVICES = frozenset(("h100", "h200"))


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
    tokens = update_tokens(train_rows, a.seq_len, a.prompt_len, a.prompt_group_size)
    rows, weight_copies = model_rows(
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
            rows.append(row("optimizer", "update out of place (TPU layout)", relaid, True))
    sampler_tensor = a.sampler_tensor
    if algo.online and isinstance(sampler_tensor, int) and sampler_tensor:
        # the sampler's copy (parallel/placement.py): tensor parallel, whole per replica,
        # kept from step to step (its buffers take the next copy); the cache by KV heads
        b = DTYPE_BYTES[a.sampler_dtype or a.dtype]
        copy = config.num_params() * b // sampler_tensor
        rows.append(row("rollout", f"sampler copy (tensor={sampler_tensor})", copy, False))
        replica_rows = -(-rows_per_step // max(a.sampler_replicas, 1))
        rows += kv_cache_rows(config, replica_rows, a.seq_len, sampler_tensor, b)
    elif algo.online:
        rows += kv_cache_rows(config, local_rows, a.seq_len, a.tensor, DTYPE_BYTES[a.dtype])
    if algo.online and a.device in GPU_DEVICES and not config.is_hybrid:
        # decode on GPU reads the layers as separate arrays (sampling.static_generate.
        # decode_params): one more copy of the layer weights while the rollout runs
        shards = sampler_tensor if isinstance(sampler_tensor, int) and sampler_tensor else 0
        b = DTYPE_BYTES[(a.sampler_dtype or a.dtype) if shards else a.dtype]
        split = layer_weights(config) * b // (shards or weight_shards)
        rows.append(row("rollout", "separate layer arrays (decode on GPU)", split, True))
    return MemoryEstimate(
        rows=tuple(rows),
        total_bytes_per_device=peak_bytes(rows),
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
        # the memory the rest of the step leaves, on a chip's HBM or (CPU, no chip model)
        # what the table itself fits against: this machine's RAM (device_memory_bytes)
        free_bytes=max(
            (device_memory_bytes(device) if chip is None else chip.hbm_bytes) - without, 0.0
        ),
        cross_process=device.startswith("tpu-"),
    )
    if t == 0:
        return {}
    return dict(sampler_tensor=t, sampler_replicas=n // t, sampler_dtype=dtype)


def _with_auto_sampler(config: ModelConfig, algorithm: str, kwargs: dict) -> MemoryEstimate:
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("sampler_")}
    chosen = auto_sampler(config, algorithm, **kwargs)
    return estimate_memory(config, algorithm, **kwargs, **chosen)

"""A modeled step time from datasheet numbers: how ``jaxrl-llm memory`` ranks the setups that
fit before any of them is compiled.

One online step is modeled as its programs one after the other (as the trainers run them,
colocated), each at its roofline bound, nothing overlapped between programs:

* the updates: ``c · N`` FLOPs per token (c = 6, 8 with full rematerialisation; Kaplan et al.
  2020, https://arxiv.org/abs/2001.08361) over the step's tokens, split over every device,
  at the chip's peak; or, when slower, the FSDP all-gathers of the bf16 weights (2 passes, 3
  with full remat) and the gradients' reduce-scatter, per update, over the interconnect;
* the reference forward (algorithms that hold one): ``2 N`` per token;
* the reshard into the sampler's copy: the copy's shard a chip does not hold yet (all but
  1 / (fsdp × tensor) of it), over the interconnect;
* the decode loop (:func:`jaxrl_llm.parallel.decode_model.decode_step_cost`): every generated
  token step reads the copy's shard and its rows' KV cache from HBM, plus the
  tensor-parallel all-reduces; without a copy (none fits) on the learner's layout, whose
  FSDP all-gathers every weight at every step.

``jaxrl-llm compile`` measures the same terms from the compiled programs; this model is for
ranking (it leaves out attention's T² term, the log-prob chunks and every elementwise op).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.models import ModelConfig
from jaxrl_llm.parallel.decode_model import Chip, decode_step_cost
from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, Role

# bf16 dense matmul peak per chip: TPUs from jaxrl_llm.parallel.topology; NVIDIA's H100 SXM /
# H200 (989 TFLOP/s) and A100 (312 TFLOP/s) datasheets
_GPU_PEAK = {"h100": 989e12, "h200": 989e12, "a100": 312e12}


#: Latency of one link hop of a collective, seconds, by chip generation: what a collective
#: costs on top of its bytes (:func:`~jaxrl_llm.train.compile.hlo_cost.collective_hops`
#: counts the hops). TPU ICI: about 1 µs per hop, the figure "How to Scale Your Model"
#: (Austin et al. 2025, https://jax-ml.github.io/scaling-book/sharding/) uses for the
#: latency-bound regime of small collectives; an order of magnitude, not a measurement of
#: ours, the same for every TPU generation until one is measured. GPUs (NVLink, NCCL): 5 µs
#: per hop, NCCL's ring latency order for small messages on one node (NVIDIA's NCCL tests);
#: again an order, not a measurement.
HOP_LATENCY_S: dict[str, float] = {
    "v4": 1e-6,
    "v5e": 1e-6,
    "v5p": 1e-6,
    "v6e": 1e-6,
    "h100": 5e-6,
    "h200": 5e-6,
    "a100": 5e-6,
}


def peak_flops(kind: str) -> float | None:
    """A device kind's bf16 peak FLOP/s (``tpu-v5p``, ``h100``; None for ``cpu``)."""
    from jaxrl_llm.parallel.topology import TPU_PEAK_BF16_FLOPS

    if kind.startswith("tpu-"):
        return TPU_PEAK_BF16_FLOPS.get(kind[4:])
    return _GPU_PEAK.get(kind)


@dataclasses.dataclass(frozen=True)
class StepModel:
    """Modeled seconds of one step by program, their sum, and the step's tokens (prompt +
    completion of every row) per second per chip."""

    train_s: float
    reference_s: float
    reshard_s: float
    decode_s: float
    step_s: float
    tokens_per_s_per_chip: float

    def to_json(self) -> dict[str, float]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def model_step(
    config: ModelConfig,
    algorithm: str,
    chip: Chip,
    peak: float,
    *,
    batch_size: int,
    seq_len: int,
    prompt_len: int | None = None,
    group_size: int = 1,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    expert: int = 1,
    remat: str = "none",
    minibatches: int = 1,
    lora_rank: int = 0,
    sampler_tensor: int = 0,
    sampler_replicas: int = 1,
    sampler_dtype: str | None = None,
    **_: Any,
) -> StepModel:
    """The modeled step of a setup given as :func:`~jaxrl_llm.train.compile.memory.
    estimate_memory`'s arguments (module docstring)."""
    algo = ALGORITHM_MEMORY[algorithm]
    devices = data * fsdp * tensor * expert
    n = config.num_params(active=True)
    if not config.tie_embeddings:  # the input embedding is a lookup
        n -= config.vocab_size * config.hidden_size
    rows = batch_size * (group_size if algo.online else 1) * algo.sequences_per_example
    tokens = rows * seq_len
    trained = 8 if remat == "full" else 6
    train_compute = trained * n * tokens / devices / peak
    link = chip.link_bandwidth or chip.hbm_bandwidth
    weights_bf16 = config.num_params() * 2
    gather = 0.0
    if fsdp > 1 and not lora_rank:  # per update: weights gathered, gradients reduce-scattered
        passes = 3 if remat == "full" else 2
        moved = weights_bf16 / tensor * (fsdp - 1) / fsdp
        gather = minibatches * (passes * moved + 2 * moved) / link
    train_s = max(train_compute, gather)
    reference_s = 0.0
    if Role.REFERENCE in algo.roles:
        reference_s = 2 * n * tokens / devices / peak
    reshard_s = decode_s = 0.0
    gen = seq_len - (seq_len // 2 if prompt_len is None else prompt_len)
    kv_row = 2 * config.num_kv_layers * config.store_kv_heads * config.store_head_dim
    if algo.online and not sampler_tensor:  # on the learner's layout: FSDP gathers per token
        b = 2
        shard = weights_bf16 / (fsdp * tensor)
        kv = rows / (data * fsdp) * kv_row * b * seq_len / tensor
        gathered = weights_bf16 / tensor * (fsdp - 1) / fsdp
        decode_s = gen * max((shard + kv) / chip.hbm_bandwidth, gathered / link)
    if algo.online and sampler_tensor:
        b = 2 if (sampler_dtype or "bf16") == "bf16" else 4
        # a chip receives its shard of the copy less the part its own learner shard holds
        copy = config.num_params() * b / sampler_tensor
        reshard_s = copy * (1 - 1 / max(fsdp * tensor, 1)) / link
        cost = decode_step_cost(
            sampler_tensor,
            devices=sampler_replicas * sampler_tensor,
            weight_bytes=config.num_params() * b,
            kv_bytes_per_row=kv_row * b * seq_len,
            rows=rows,
            layers=config.num_layers,
            hidden=config.hidden_size,
            chip=chip,
        )
        compute = 2 * n * rows / devices / peak
        decode_s = gen * max(cost.step_s, compute)
    step = train_s + reference_s + reshard_s + decode_s
    return StepModel(
        train_s=train_s,
        reference_s=reference_s,
        reshard_s=reshard_s,
        decode_s=decode_s,
        step_s=step,
        tokens_per_s_per_chip=tokens / devices / step if step > 0 else 0.0,
    )


def model_setup(
    config: ModelConfig, algorithm: str, chip: Chip, peak: float, **setup: Any
) -> StepModel:
    """:func:`model_step` of a setup whose ``sampler_tensor`` may be ``"auto"``: the copy the
    setup gets (:func:`~jaxrl_llm.train.compile.memory.auto_sampler`; none when none fits)."""
    if setup.get("sampler_tensor") == "auto":
        from jaxrl_llm.train.compile.memory import auto_sampler

        setup = {**setup, "sampler_tensor": 0, **auto_sampler(config, algorithm, **setup)}
    return model_step(config, algorithm, chip, peak, **setup)


def faster_setups(
    config: ModelConfig,
    algorithm: str,
    chip: Chip,
    peak: float,
    *,
    max_devices: int,
    **setup: Any,
) -> list[tuple[str, str, Any, StepModel]]:
    """Setups near ``setup`` (:func:`~jaxrl_llm.train.compile.memory.estimate_memory`'s
    arguments, ``sampler_tensor="auto"`` for online runs) that fit and model a faster step,
    fastest first: ``(change, note, estimate, step model)``. The levers: fewer rows per
    update (online ``--minibatches``: the activations they free may make room for the
    sampler's copy), lighter rematerialisation, LoRA, a tensor split of the learner within
    the same devices. A what-if search on the model, not a compile: ``jaxrl-llm compile``
    checks the one taken."""
    from jaxrl_llm.losses.registry import ALGORITHMS as LOSS_ALGORITHMS
    from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, estimate_memory
    from jaxrl_llm.train.compile.memory_advice import ADVICE_LORA_RANK

    base = model_setup(config, algorithm, chip, peak, **setup)
    changes: list[tuple[str, str, dict]] = []
    algo = ALGORITHM_MEMORY[algorithm]
    rows = setup.get("batch_size", 8) * (setup.get("group_size", 1) if algo.online else 1)
    if algo.online:
        mb = setup.get("minibatches", 1) * 2
        while mb <= rows and rows % mb == 0 and mb <= 16:
            changes.append(
                (
                    f"--minibatches {mb}",
                    f"rollout.minibatches={mb}: {mb} updates a step on 1/{mb} of the rows each",
                    {"minibatches": mb},
                )
            )
            mb *= 2
    order = ("none", "dots", "full")
    for remat in order[: order.index(setup.get("remat", "none"))]:
        changes.append(
            (f"--remat {remat}", "recomputes less in the backward pass", {"remat": remat})
        )
    if LOSS_ALGORITHMS[algorithm].lora and not setup.get("lora_rank"):
        changes.append(
            (
                f"--lora-rank {ADVICE_LORA_RANK}",
                "model.lora: trains adapters, base frozen",
                {"lora_rank": ADVICE_LORA_RANK},
            )
        )
    devices = setup.get("data", 1) * setup.get("fsdp", 1) * setup.get("tensor", 1)
    t = setup.get("tensor", 1) * 2
    while t <= min(devices, 8, max_devices) and devices % t == 0:
        if config.num_kv_heads % t == 0:
            changes.append(
                (
                    f"--mesh fsdp={devices // t},tensor={t}",
                    f"the learner's activations and weights split {t} ways",
                    {"fsdp": devices // t, "data": 1, "tensor": t},
                )
            )
        t *= 2
    out = []
    for change, note, kw in changes:
        e = estimate_memory(config, algorithm, **{**setup, **kw})
        if not e.fits:
            continue
        m = model_setup(config, algorithm, chip, peak, **{**setup, **kw})
        if m.step_s < 0.95 * base.step_s:
            out.append((change, note, e, m))
    out.sort(key=lambda x: x[3].step_s)
    return out

"""What ``jaxrl-llm compile`` needs beside the run's own programs: the run config its command
line sizes describe (:func:`run_config_for`), compiling one program and reading its memory
(:func:`compile_program`), the decode state's shardings, per-device bytes of abstract arrays,
and the analytic FLOPs (see :mod:`jaxrl_llm.train.compile.aot`). The batches are the run plan's
layouts (:class:`jaxrl_llm.train.config.batch_layout.BatchLayout`)."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_spec
from jaxrl_llm.train.compile.aot_report import ProgramMemory
from jaxrl_llm.train.compile.hlo_cost import hlo_cost
from jaxrl_llm.train.config.sections import CorrectionSection

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with NamedShardings (its shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def compile_program(
    name: str,
    jitted,
    args: tuple,
    resident: int,
    *,
    kwargs: dict | None = None,
    num_devices: int = 1,
    unknown_trips: int = 1,
) -> ProgramMemory:
    """Compile ``jitted`` for ``args`` (and keyword ``kwargs``) and read its memory, cost,
    ring transfers and per-device work (:func:`~jaxrl_llm.train.compile.hlo_cost.hlo_cost`
    with ``num_devices`` and ``unknown_trips``); ``resident``: the bytes per device that live
    beside it.

    Raises:
      ConfigError: the TPU compiler refuses a program whose temporaries alone exceed a
        device's HBM (XLA's RESOURCE_EXHAUSTED, one line with its numbers).
    """
    try:
        compiled = jitted.lower(*args, **(kwargs or {})).compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        xla = str(e).strip().splitlines()[0].rstrip(".")
        raise ConfigError(
            f"the {name} program does not fit one device ({xla}); split it over more "
            f"devices (--mesh, --topology) or lower --batch / --seq-len"
        ) from None
    ma = compiled.memory_analysis()
    text = compiled.as_text() or ""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    work = hlo_cost(text, num_devices=num_devices, unknown_trips=unknown_trips)
    return ProgramMemory(
        name=name,
        argument_bytes=int(ma.argument_size_in_bytes),
        output_bytes=int(ma.output_size_in_bytes),
        alias_bytes=int(ma.alias_size_in_bytes),
        temp_bytes=int(ma.temp_size_in_bytes),
        code_bytes=int(ma.generated_code_size_in_bytes),
        flops=float((cost or {}).get("flops", 0.0)),
        resident_bytes=resident,
        collective_permutes=len(_COLLECTIVE_PERMUTE.findall(text)),
        largest_buffers=largest_buffers(text),
        hlo_flops=work.flops,
        hlo_flops_once=work.flops_once,
        hbm_access_bytes=work.hbm_bytes,
        copy_bytes=work.copy_bytes,
        collective_hops=work.collective_hops,
        collective_bytes=work.collective_bytes,
        collectives=work.collectives,
        trip_counts=work.trip_counts,
        unknown_loops=work.unknown_loops,
    )


# a collective-permute op in compiled HLO text (synchronous, or the start of an async one):
# ring attention's neighbour transfers (jaxrl_llm.models.ring_attention), among others
_COLLECTIVE_PERMUTE = re.compile(r"\bcollective-permute(?:-start)?\(")


# a computation's header line: its name, then its parameters and result
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
# ops whose results are other instructions' buffers (or none): not counted
_PASS_THROUGH = frozenset(
    (
        "parameter",
        "constant",
        "bitcast",
        "get-tuple-element",
        "tuple",
        "while",
        "call",
        "conditional",
        "copy-start",
        "copy-done",
    )
)
# HLO element type names that are not numpy's
_DTYPE_NAMES = {
    "pred": "bool",
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "s8": "int8",
    "s16": "int16",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "c64": "complex64",
    "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
}


def _result_and_op(line: str) -> tuple[str, str] | None:
    """(result type text, op name) of an HLO instruction line, or None."""
    if " = " not in line:
        return None
    rhs = line.split(" = ", 1)[1].lstrip()
    if rhs.startswith("("):  # a tuple result: up to its matching parenthesis
        depth, end = 0, len(rhs)
        for i, ch in enumerate(rhs):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                end = i + 1
                break
        kind, rest = rhs[:end], rhs[end:]
    else:
        kind, _, rest = rhs.partition(" ")
    op = rest.strip().split("(", 1)[0]
    return kind, op


def largest_buffers(hlo_text: str, top: int | None = 5) -> tuple[str, ...]:
    """The ``top`` largest per-device arrays a compiled program computes (None: all), as
    ``"bf16[8,512,14336] 112.0 MiB"``, largest first, one entry per distinct shape.

    Read from the compiled (partitioned) HLO text, so the shapes are each device's: an
    activation split by rows over N devices shows B / N rows. Counted: the results (tuple
    results element by element) of the instructions of the program's computations (entry,
    loop bodies, branches), leaving out parameters and ops that pass other buffers on
    (tuples, loops, bitcasts); the insides of fusions are left out (not buffers of their
    own). A list of shapes, not a liveness analysis: the temporaries' total is
    ``temp_bytes``.
    """
    lines = hlo_text.splitlines()
    fused = {m.group(1) for line in lines if " fusion(" in line for m in _CALLS.finditer(line)}
    sizes: dict[str, int] = {}
    inside = False
    for line in lines:
        header = _COMPUTATION.match(line)
        if header and " = " not in line.split("{")[0]:
            inside = header.group(1) not in fused
            continue
        parsed = _result_and_op(line) if inside else None
        if parsed is None or parsed[1] in _PASS_THROUGH:
            continue
        for dtype, dims in _ARRAY.findall(parsed[0]):
            if dtype not in _DTYPE_NAMES:
                continue
            shape = [int(d) for d in dims.split(",") if d]
            sizes[f"{dtype}[{dims}]"] = math.prod(shape) * jnp.dtype(_DTYPE_NAMES[dtype]).itemsize
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])[:top]
    return tuple(f"{name} {_size(size)}" for name, size in ranked)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


# HLO element type names that are not numpy's
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "s8": "int8",
    "s16": "int16",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "c64": "complex64",
    "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
}


# ----- the run ---------------------------------------------------------------------------------


def run_config_for(
    algorithm: str,
    *,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    expert: int = 1,
    context: int = 1,
    batch_size: int = 8,
    seq_len: int = 1024,
    prompt_len: int | None = None,
    group_size: int = 8,
    minibatches: int = 1,
    micro_batches: int = 1,
    remat: str = "full",
    dtype: str = "bf16",
    lora_rank: int = 0,
    lora_base_dtype: str = "float32",
    correction: CorrectionSection | None = None,
    rollout_tensor: int | Literal["auto"] = "auto",
) -> tuple[Any, int, int]:
    """The run config ``jaxrl-llm compile --algorithm ...`` describes, with its row lengths.

    Args:
      algorithm: a key of :data:`jaxrl_llm.losses.ALGORITHMS`.
      data, fsdp, tensor, expert, context: mesh axis sizes (one may be -1).
      batch_size: online: prompts per step (rows = prompts × group_size); offline: examples
        (pairs for preference losses) per step.
      seq_len: tokens per row, prompt + completion. prompt_len: online prompt part (default
        ``seq_len // 2``); the completion (generation) part is ``seq_len − prompt_len``.
      group_size: G samples per prompt (online).
      minibatches: online: optimizer updates per rollout batch.
      micro_batches: offline: gradient-accumulation slices per step.
      remat: per-layer rematerialisation 'none' | 'dots' | 'full'.
      dtype: 'bf16' | 'fp32' compute dtype (master weights and optimizer state are float32).
      lora_rank: 0 = full fine-tuning; r > 0 trains rank-r adapters on a frozen base.
      lora_base_dtype: how that base is stored (``model.lora.base_dtype``: float32, bfloat16,
        int8, nf4).
      correction: the run's ``rollout.correction`` (online).
      rollout_tensor: the sampler's tensor degree (``rollout.tensor``; ``auto``).

    Returns:
      ``(RunConfig, seq_len, prompt_len)``.

    Raises:
      ConfigError: an unknown algorithm or dtype, a correction offline, lengths that do not
        fit, or a config the trainer would refuse.
    """
    from jaxrl_llm.losses import ALGORITHMS as LOSS_ALGORITHMS
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.config.sections import (
        DataSection,
        LogprobSection,
        LoRASection,
        MeshSection,
        ModelSection,
        RewardItem,
        RolloutSection,
        TeacherSection,
        TrainSection,
    )

    online = _check_run_sizes(algorithm, dtype, correction, seq_len, context)
    prompt_len = seq_len // 2 if prompt_len is None else int(prompt_len)
    if not 1 <= prompt_len < seq_len:
        raise ConfigError(f"prompt_len={prompt_len} must be in [1, seq_len={seq_len})")
    gen_len = seq_len - prompt_len
    mesh = dict(data=data, fsdp=fsdp, tensor=tensor, expert=expert, context=context)
    model: dict[str, Any] = dict(  # the section checks the values
        source="(preset)",
        compute_dtype=DTYPES[dtype],
        remat=remat,
        lora=LoRASection(rank=lora_rank, base_dtype=lora_base_dtype) if lora_rank else None,
    )
    cfg = RunConfig(
        output_dir="(compile)",
        max_steps=1,
        algorithm=algorithm,
        model=ModelSection(**model),
        mesh=MeshSection(**mesh),
        # context parallelism needs every row's own forward (train.preflight.check_context)
        logprobs=LogprobSection(shared_prompt=context <= 1),
        # online: data.max_length bounds the prompt; offline: the whole row
        data=DataSection(train="(compile)", max_length=prompt_len if online else seq_len),
        rollout=RolloutSection(
            prompts_per_step=batch_size,
            group_size=group_size,
            max_new_tokens=gen_len,
            minibatches=minibatches,
            correction=correction,
            tensor=rollout_tensor,
        ),
        train=TrainSection(batch_size=batch_size, micro_batches=micro_batches),
        rewards=(RewardItem("math_answer"),) if online else (),
        # distillation: a teacher of the policy's architecture (compile_run)
        teacher=TeacherSection(source="(preset)") if LOSS_ALGORITHMS[algorithm].teacher else None,
    )
    return cfg, seq_len, prompt_len


def _check_run_sizes(
    algorithm: str,
    dtype: str,
    correction: CorrectionSection | None,
    seq_len: int,
    context: int,
) -> bool:
    """Check :func:`run_config_for`'s algorithm, dtype, correction and context split; return
    whether the algorithm is trained online."""
    from jaxrl_llm.losses import ALGORITHMS as LOSS_ALGORITHMS

    if algorithm not in LOSS_ALGORITHMS:
        raise ConfigError(
            f"unknown algorithm {algorithm!r}{did_you_mean(algorithm, LOSS_ALGORITHMS)}; "
            f"allowed: {sorted(LOSS_ALGORITHMS)}"
        )
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
    online = LOSS_ALGORITHMS[algorithm].online
    if correction is not None and not online:
        raise ConfigError(
            f"rollout.correction corrects an online rollout; {algorithm!r} is trained offline"
        )
    if context > 1 and seq_len % context:  # named as the command line gives it
        raise ConfigError(
            f"--seq-len {seq_len} cannot be split over the mesh's context axis ({context} "
            f"devices); use a multiple of {context}"
        )
    return online


_DECODE_AXES = {  # logical names of DecodeState / KVCache dimensions
    "logits": ("batch", None),
    "tokens": ("batch", None),
    "logprobs": ("batch", None),
    "positions": ("batch",),
    "done": ("batch",),
    "lengths": ("batch",),
    "keys": ("batch", None),
    "step": (),
    "max_new_tokens": (),
    "routing": ("batch", None, None, None),  # a MoE's recorded experts (routing replay)
}
_CACHE_AXES = {
    "k": ("layers", "batch", "length", "kv_heads", "head_dim"),
    "v": ("layers", "batch", "length", "kv_heads", "head_dim"),
    "mask": ("batch", "length"),
    "positions": ("batch", "length"),
    "index": (),
    "conv": ("layers", "batch", None, None),  # a hybrid stack's Gated DeltaNet state
    "state": ("layers", "batch", None, None, None),
}


def decode_state_sharding(dstate, mesh, rules=DEFAULT_RULES):
    """Rows over the batch axes, KV heads over ``tensor``: how a sharded sampler lays out its
    loop state (``DecodeState`` fields by name), by the rule table ``rules``."""

    def named(axes, x, name):
        return NamedSharding(mesh, logical_to_spec(axes, mesh, rules, shape=x.shape, name=name))

    fields = {}
    for f, x in dstate._asdict().items():
        if f == "cache":
            fields[f] = type(x)(
                **{
                    k: jax.tree.map(lambda a, k=k: named(_CACHE_AXES[k], a, f"cache.{k}"), v)
                    for k, v in x._asdict().items()
                }
            )
        elif x is None:  # an optional field left out (no routing recorded)
            fields[f] = None
        else:
            fields[f] = named(_DECODE_AXES[f], x, f)
    return type(dstate)(**fields)


def analytic_train_flops(config: models.ModelConfig, tokens: int, *, remat: str) -> float:
    """Matmul FLOPs of one training pass over ``tokens`` tokens: 6·N·tokens (forward 2·N,
    backward 4·N; Kaplan et al. 2020, https://arxiv.org/abs/2001.08361) + 2·N·tokens more when
    every layer is recomputed (``remat='full'``). Attention's T² term is left out. For a
    mixture of experts N is the active parameters (the k experts a token runs)."""
    n = config.num_params(active=True)
    return (8.0 if remat == "full" else 6.0) * n * tokens

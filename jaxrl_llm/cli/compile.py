"""``jaxrl-llm compile``: compile a run's programs (train step, reference, recompute, critic,
decode loop) for a TPU slice on this machine (no TPU needed, ``libtpu`` is) and print
per-device compiled memory, FLOPs and whether it fits, next to ``jaxrl-llm memory``'s
estimate, and each program's per-device work (FLOPs and HBM bytes with loop trip counts,
collective bytes) with its roofline time on the chip's datasheet numbers. ``--config
RUN.yaml`` compiles exactly what ``jaxrl-llm train RUN.yaml`` runs; otherwise the run is
described by ``--algorithm`` and the size flags."""

from __future__ import annotations

import argparse
import json
import math


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm compile``."""
    from jaxrl_llm.cli.memory import add_model_and_algorithm

    add_model_and_algorithm(parser, default_model=None, required=False)
    parser.add_argument(
        "--config",
        default=None,
        help="a jaxrl-llm train config (YAML): compile that run (its algorithm, mesh, batch, "
        "packing, correction, schedules); --model defaults to its model.source, the size "
        "flags other than --seq-len / --prompt-len are ignored",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="with --config: dotted.key=value overrides, as jaxrl-llm train takes them",
    )
    parser.add_argument(
        "--topology",
        required=True,
        help="TPU slice as GENERATION:GRID, e.g. v5e:2x2, v5p:2x2x2, v6e:2x4",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        help="compile for the first N devices of the slice only (e.g. 1: one chip of a v5p "
        "slice, whose smallest topology is 2x2x1)",
    )
    parser.add_argument(
        "--mesh",
        default="fsdp=-1",
        help="mesh axis sizes, e.g. fsdp=8, data=2,fsdp=4, fsdp=2,expert=4 or fsdp=2,context=4 "
        "(one may be -1; default: fsdp over every device; expert splits a mixture of experts' "
        "experts; context splits every row's tokens, attention as ring attention, and "
        "--seq-len must be a multiple of it)",
    )
    parser.add_argument(
        "--dtype",
        default="bf16",
        choices=["bf16", "fp32"],
        help="compute dtype (master weights and Adam moments stay float32)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=8,
        help="examples per step (online algorithms: prompts per step)",
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="prompt + completion tokens (default 1024; with --config data.max_length + "
        "rollout.max_new_tokens)",
    )
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="online: prompt tokens of --seq-len (default half)",
    )
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (online)")
    parser.add_argument(
        "--minibatches", type=int, default=1, help="online: optimizer updates per rollout batch"
    )
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=1,
        help="offline: gradient-accumulation micro-batches per step",
    )
    parser.add_argument("--remat", default="full", choices=["none", "dots", "full"])
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0 = full fine-tune)")
    parser.add_argument(
        "--lora-base-dtype",
        default="float32",
        help="with --lora-rank: the frozen base's storage (model.lora.base_dtype: float32, "
        "bfloat16, int8, nf4)",
    )
    parser.add_argument(
        "--no-decode", action="store_true", help="skip compiling the sampler's decode loop"
    )
    parser.add_argument(
        "--sampler-only", action="store_true", help="online: only the reshard and decode loop"
    )
    parser.add_argument(
        "--correction",
        choices=["is", "decoupled"],
        default=None,
        help="online: the run's rollout.correction (is: TIS / MIS importance weights; "
        "decoupled: decoupled PPO); adds its batch entry and the recompute forward",
    )
    parser.add_argument(
        "--rollout-layout",
        default=None,
        help="online: the sampler's layout, auto (chosen from a model of the decode step; the "
        "default) or tensor=N (tensor parallel over N chips of a host, replicas over the rest)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _rollout_layout(text: str | None) -> int | str | None:
    """``--rollout-layout``: None (the run's own), ``"auto"`` or the tensor degree."""
    from jaxrl_llm.errors import ConfigError

    if text is None or text.strip() == "auto":
        return None if text is None else "auto"
    k, sep, v = text.strip().partition("=")
    if k != "tensor" or not sep or not v.isdigit() or int(v) < 1:
        raise ConfigError(f"--rollout-layout {text!r}: expected auto or tensor=N (N >= 1)")
    return int(v)


#: Cloud TPU's accelerator-type name of a slice by generation: ``{n}`` is the slice's chips
#: (v5e, v6e) or TensorCores (v4, v5p: two per chip), as the Cloud TPU pages name them
#: (``v5litepod-4``, ``v5p-8``, ``v6e-4``, ``v4-8``).
_ACCELERATOR_TYPES = {"v5e": ("v5litepod-{n}", 1), "v6e": ("v6e-{n}", 1), "v5p": ("v5p-{n}", 2)}
_ACCELERATOR_TYPES["v4"] = ("v4-{n}", 2)


def accelerator_type(topology: str) -> str | None:
    """The ``TPU_ACCELERATOR_TYPE`` of a slice ``GEN:GRID`` (``v5e:2x2`` -> ``v5litepod-4``),
    or None for a generation or a name this does not know (``tpu_topology`` judges the name).

    On a host with no TPU, libtpu asks this variable for the slice's host layout when
    ``compile`` loads it, and without it prints "Failed to find host bounds for accelerator
    type: WARNING: could not determine TPU accelerator type". The compiled programs do not
    depend on it (the same ``--json`` report with and without it, v4 / v5e / v5p / v6e)."""
    gen, _, grid = topology.partition(":")
    if gen not in _ACCELERATOR_TYPES or not grid:
        return None
    try:
        chips = math.prod(int(x) for x in grid.split("x"))
    except ValueError:
        return None
    name, per_chip = _ACCELERATOR_TYPES[gen]
    return name.format(n=chips * per_chip)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm compile``."""
    import glob
    import os

    if not (glob.glob("/dev/accel*") or os.path.exists("/dev/vfio")):  # no TPU here
        name = accelerator_type(args.topology)
        if name is not None:
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", name)
    from jaxrl_llm.cli.memory import params_text, parse_mesh, resolve_model_config
    from jaxrl_llm.errors import ConfigError
    from jaxrl_llm.parallel.topology import first_devices, tpu_topology
    from jaxrl_llm.train.compile.aot import compile_preset, compile_run
    from jaxrl_llm.train.config.sections import CorrectionSection

    mesh = parse_mesh(args.mesh, rest=True)  # a bad --mesh fails before the compiler loads
    topology = tpu_topology(args.topology)  # LibtpuMissingError: one line, exit status 2
    if args.devices is not None:
        topology = first_devices(topology, args.devices)
    if args.config is not None:
        from jaxrl_llm.train.config.config_io import load_config
        from jaxrl_llm.train.config.run_config import RunConfig

        overrides = list(args.overrides)
        layout = _rollout_layout(args.rollout_layout)
        if layout is not None:
            overrides.append(f"rollout.tensor={layout}")
        cfg = load_config(RunConfig, args.config, overrides)
        config = resolve_model_config(args.model or cfg.model.source, cfg.model.tiny)
        report = compile_run(
            cfg,
            config,
            topology,
            seq_len=args.seq_len,
            prompt_len=args.prompt_len,
            decode=not args.no_decode,
            sampler_only=args.sampler_only,
        )
        algorithm, model = cfg.algorithm, args.model or cfg.model.source
    else:
        if args.algorithm is None:
            raise ConfigError("jaxrl-llm compile: give --algorithm (or a run's --config)")
        if args.overrides:
            raise ConfigError(f"overrides {args.overrides} need a run config (--config)")
        model = args.model or "135m"
        config = resolve_model_config(model)
        report = compile_preset(
            config,
            args.algorithm,
            topology,
            batch_size=args.batch,
            seq_len=1024 if args.seq_len is None else args.seq_len,
            prompt_len=args.prompt_len,
            group_size=args.group_size,
            minibatches=args.minibatches,
            micro_batches=args.micro_batches,
            remat=args.remat,
            dtype=args.dtype,
            lora_rank=args.lora_rank,
            lora_base_dtype=args.lora_base_dtype,
            decode=not args.no_decode,
            sampler_only=args.sampler_only,
            rollout_tensor=_rollout_layout(args.rollout_layout) or "auto",
            correction=(
                None
                if args.correction is None
                else CorrectionSection(decoupled=args.correction == "decoupled")
            ),
            **mesh,
        )
        algorithm = args.algorithm
    if args.json:
        print(json.dumps({**report.to_json(), "model": model}))
    else:
        s = report.settings
        print(
            f"{algorithm} on {model} ({params_text(config)}), "
            f"{topology.name} ({topology.num_devices} devices), mesh {report.mesh}, "
            f"{s['dtype']}, remat={s['remat']}, batch {s['batch_size']} x {s['seq_len']} "
            f"tokens, {s['rows_per_update']} rows per forward/backward"
        )
        print(report.table())
    return 0

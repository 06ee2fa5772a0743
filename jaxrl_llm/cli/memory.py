"""``jaxrl-llm memory``: per-device memory table for a model, algorithm, mesh and batch.

The device is ``--device``, else the generation of ``--topology`` (``v5e:2x2`` -> ``tpu-v5e``),
else the backend this machine runs (a TPU's or GPU's kind, or ``cpu``). When the setup does
not fit, the changes that would make it fit are listed, each with the estimator's total
(:func:`jaxrl_llm.train.compile.memory_advice.fit_advice`).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.parallel.chips import chip_kind


def add_model_and_algorithm(
    parser: argparse.ArgumentParser, *, default_model: str | None = "135m", required: bool = True
) -> None:
    """``--model`` (a size preset, a model alias, ``tiny``, an HF directory or a config.json)
    and ``--algorithm``, as ``jaxrl-llm memory`` and ``jaxrl-llm compile`` take them
    (``required``: ``--algorithm`` must be given; ``compile --config`` reads it from the run
    config)."""
    from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, MODEL_PRESETS

    parser.add_argument(
        "--model",
        default=default_model,
        help=f"a size preset ({', '.join(MODEL_PRESETS)}), a model alias "
        f"({', '.join(ALIAS_PRESETS)}: its preset's shapes), tiny, a Hugging Face model "
        f"directory, or a config.json file",
    )
    parser.add_argument(
        "--algorithm",
        required=required,
        choices=sorted(ALGORITHM_MEMORY),
        metavar="ALGO",
        help=f"one of: {', '.join(sorted(ALGORITHM_MEMORY))}",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm memory``."""
    from jaxrl_llm.train.compile.memory import DEVICE_MEMORY

    add_model_and_algorithm(parser)
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0 = full fine-tune)")
    parser.add_argument(
        "--lora-base-dtype",
        default=None,
        help="with --lora-rank: how the frozen base is stored (model.lora.base_dtype: float32, "
        "bfloat16, int8, nf4; default: float32 as the trainers hold it)",
    )
    parser.add_argument(
        "--mesh",
        default="data=1,fsdp=1,tensor=1",
        help="mesh axis sizes, e.g. data=2,fsdp=4,tensor=1 (expert=E splits a mixture of "
        "experts' experts)",
    )
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument(
        "--batch",
        type=int,
        default=8,
        help="examples per step (online algorithms: prompts per step)",
    )
    parser.add_argument("--seq-len", type=int, default=1024, help="prompt + completion tokens")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (online)")
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="online: prompt tokens of --seq-len (default half, as jaxrl-llm compile)",
    )
    parser.add_argument(
        "--minibatches", type=int, default=1, help="online: optimizer updates per rollout batch"
    )
    parser.add_argument("--remat", default="none", choices=["none", "dots", "full"])
    parser.add_argument("--logits", default="chunked", choices=["chunked", "full"])
    parser.add_argument(
        "--device",
        default=None,
        choices=sorted(DEVICE_MEMORY) + ["cpu"],
        help="device kind (default: --topology's generation, else this machine's backend)",
    )
    parser.add_argument(
        "--topology",
        default=None,
        help="TPU slice as GENERATION:GRID (e.g. v5e:2x2): sets the device and the most "
        "devices the advice may use",
    )
    parser.add_argument(
        "--teacher-model",
        default=None,
        help="distill: the teacher (as --model; default: the policy's size)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def parse_mesh(text: str, *, rest: bool = False) -> dict[str, int]:
    """``"data=2,fsdp=4"`` -> {"data": 2, "fsdp": 4, "tensor": 1, "expert": 1, "context": 1};
    clear errors otherwise. The one ``--mesh`` parser: ``jaxrl-llm memory`` and ``compile``;
    with ``rest`` (``compile``, whose slice sizes the mesh) one axis may be -1, the devices left."""
    out = {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1, "context": 1}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(f"--mesh: {part!r} must look like axis=size")
        k, v = part.split("=", 1)
        if k not in out:
            raise ConfigError(
                f"--mesh: unknown axis {k!r}{did_you_mean(k, out)}; allowed: data, fsdp, "
                f"tensor, expert, context"
            )
        try:
            out[k] = int(v)
        except ValueError:
            raise ConfigError(f"--mesh: size of {k!r} must be an integer, got {v!r}") from None
        if out[k] < 1 and not (rest and out[k] == -1):
            least = "-1 (the rest) or >= 1" if rest else ">= 1"
            raise ConfigError(f"--mesh: size of {k!r} must be {least}, got {out[k]}")
    return out


def check_splits(config, mesh: dict[str, int], model: str) -> None:
    """Each mesh axis must divide the model dimensions it splits (``tensor``: the attention
    heads and the MLP width; ``fsdp``: the hidden size; ``expert``: the experts). A run keeps a
    dimension that does not divide whole on every device (:mod:`jaxrl_llm.parallel.rules`),
    which the estimate, dividing by the axis, would not count.

    Raises:
      ConfigError: one line naming the axis, the dimension and its divisors.
    """
    dims = {
        "tensor": [("attention heads", config.num_heads)]
        + ([("MLP width", config.intermediate_size)] if config.intermediate_size else []),
        "fsdp": [("hidden size", config.hidden_size)],
        "expert": [("experts", config.num_experts or 1)],
    }
    if mesh.get("expert", 1) > 1 and not config.num_experts:
        raise ConfigError(
            f"--mesh expert={mesh['expert']}: {model} is a dense model, with no experts to "
            f"split; use expert=1"
        )
    for axis, named in dims.items():
        n = mesh.get(axis, 1)
        for what, size in named:
            if n > 1 and size % n:
                fits = [d for d in range(1, min(size, 64) + 1) if size % d == 0]
                raise ConfigError(
                    f"--mesh {axis}={n} does not divide {model}'s {size} {what}; a run keeps "
                    f"such weights whole on every device, which this estimate does not count; "
                    f"use a divisor of {size} (e.g. {', '.join(map(str, fits[-4:]))})"
                )


# Model aliases (interop/aliases.py) -> the size preset of the same shapes. An estimate or a
# compile needs only the shapes, so a shipped config's ``model.source`` (an alias) needs no
# model file; the presets match the aliases' GGUF configs in every shape (they differ in the
# norm epsilon's float32 rounding and Gemma's end-of-turn id).
ALIAS_PRESETS: dict[str, str] = {
    "smollm2-135m-instruct": "135m",
    "gemma3-270m": "gemma3-270m",
}


def resolve_model_config(spec: str, tiny: dict | None = None):
    """A size preset, a model alias (its preset, :data:`ALIAS_PRESETS`), ``tiny`` (with the
    run's ``model.tiny`` overrides), an HF directory or a config.json path -> ModelConfig.

    Raises:
      ConfigError: one line naming ``spec``, with the closest preset or alias.
    """
    from jaxrl_llm.interop.hf_config import model_config_from_hf
    from jaxrl_llm.train.compile.memory import MODEL_PRESETS
    from jaxrl_llm.train.config.preflight import known_model_config

    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    if spec in ALIAS_PRESETS:
        return MODEL_PRESETS[ALIAS_PRESETS[spec]]
    if spec == "tiny":
        return known_model_config(spec, tiny)
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        names = [*MODEL_PRESETS, *ALIAS_PRESETS, "tiny"]
        raise ConfigError(
            f"--model {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}), a model alias "
            f"({', '.join(ALIAS_PRESETS)}) or tiny, and no config.json found at {path!r}"
            f"{did_you_mean(spec, names)}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--model {path!r}: not a JSON config ({e})") from None
    try:
        return model_config_from_hf(data)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"--model {path!r}: {e}") from None


def resolve_device(device: str | None, topology: str | None) -> tuple[str, str, int]:
    """``(device kind, why, most devices)`` for ``jaxrl-llm memory``: ``--device`` if given,
    else ``--topology``'s generation, else the detected backend's device kind (``cpu`` on a
    CPU backend). The most devices is the slice's chips with ``--topology``, else 1024.

    Raises:
      ConfigError: a bad topology name, or a backend whose device kind has no known memory
        (pass ``--device``).
    """
    from jaxrl_llm.train.compile.memory import DEVICE_MEMORY

    max_devices = 1024
    gen = None
    if topology is not None:
        from jaxrl_llm.parallel.topology import parse_topology_name

        gen, grid = parse_topology_name(topology)
        max_devices = math.prod(grid)
    if device is not None:
        return device, "--device", max_devices
    if gen is not None:
        return f"tpu-{gen}", f"--topology {topology}", max_devices
    import jax

    backend = jax.default_backend()
    if backend == "cpu":
        return "cpu", "this machine's backend", max_devices
    kind = jax.devices()[0].device_kind
    key = chip_kind(kind)
    if key is None:
        raise ConfigError(
            f"this machine's {backend} devices are {kind!r}, whose memory is not in the "
            f"table; pass --device (one of {', '.join(sorted(DEVICE_MEMORY))}, cpu)"
        )
    return key, f"this machine's {backend} ({kind})", max_devices


def _json_report(args, mesh, config, est, why, base_step, faster, advice_steps) -> dict:
    """The ``--json`` output of ``jaxrl-llm memory``: the estimate's JSON with the setup, the
    modeled step, the faster setups that fit and the advice."""
    out = est.to_json()
    out.update(
        model=args.model,
        mesh=mesh,
        params=config.num_params(),
        active_params=config.num_params(active=True),
        device_from=why,
        step_model=None if base_step is None else base_step.to_json(),
        faster=[
            {
                "change": c,
                "note": n,
                "total_bytes_per_device": int(e.total_bytes_per_device),
                "sampler_tensor": int(e.sampler_tensor),
                "step_model": m.to_json(),
            }
            for c, n, e, m in faster
        ],
        advice=[
            {**a.to_json(), "step_model": None if m is None else m.to_json()}
            for a, m in advice_steps
        ],
    )
    return out


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm memory``."""
    from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, GiB, Role, estimate_memory
    from jaxrl_llm.train.compile.memory_advice import fit_advice

    mesh = parse_mesh(args.mesh)
    if mesh["context"] > 1:
        # Ring attention changes more than the tokens per device: its blockwise scores are
        # not the plain attention's H x T per token this estimate counts (remat none/dots).
        raise ConfigError(
            f"--mesh context={mesh['context']}: the estimate has no model of context "
            f"parallelism (ring attention); compile the run for a TPU slice with "
            f"jaxrl-llm compile --mesh context={mesh['context']} instead"
        )
    del mesh["context"]  # the axes the estimate is made for
    device, why, max_devices = resolve_device(args.device, getattr(args, "topology", None))
    n_devices = mesh["data"] * mesh["fsdp"] * mesh["tensor"] * mesh["expert"]
    if n_devices > max_devices:
        raise ConfigError(
            f"--mesh {args.mesh}: {n_devices} devices, more than the {max_devices} chips of "
            f"--topology {args.topology}"
        )
    config = resolve_model_config(args.model)
    check_splits(config, mesh, args.model)
    setup = dict(
        batch_size=args.batch,
        seq_len=args.seq_len,
        group_size=args.group_size,
        lora_rank=args.lora_rank,
        dtype=args.dtype,
        remat=args.remat,
        logits=args.logits,
        minibatches=args.minibatches,
        device=device,
        data=mesh["data"],
        fsdp=mesh["fsdp"],
        tensor=mesh["tensor"],
        expert=mesh["expert"],
    )
    if args.lora_base_dtype is not None:
        if not args.lora_rank:
            raise ConfigError("--lora-base-dtype sizes a LoRA base; give --lora-rank too")
        setup["lora_base_dtype"] = args.lora_base_dtype
    if args.teacher_model is not None:
        if Role.TEACHER not in ALGORITHM_MEMORY[args.algorithm].roles:
            raise ConfigError(
                f"--teacher-model: {args.algorithm} holds no teacher; it sizes the teacher of "
                f"--algorithm distill"
            )
        setup["teacher_config"] = resolve_model_config(args.teacher_model)
        check_splits(setup["teacher_config"], mesh, args.teacher_model)
    if args.algorithm in _online():  # as jaxrl-llm compile resolves the same flags
        setup["prompt_len"] = args.seq_len // 2 if args.prompt_len is None else args.prompt_len
        if (args.batch * args.group_size) % args.minibatches == 0:
            setup["prompt_group_size"] = args.group_size  # logprobs.shared_prompt
    if args.algorithm in _online():  # the sampler's copy, as a run on the device lays it out
        setup["sampler_tensor"] = "auto"
    est = estimate_memory(config, args.algorithm, **setup)  # type: ignore[arg-type]
    advice = fit_advice(config, args.algorithm, max_devices=max_devices, **setup)
    base_step, advice_steps = _ranked(config, args.algorithm, setup, advice)
    advice = [a for a, _ in advice_steps]
    faster = []
    if est.fits and base_step is not None:  # what would make it faster, and still fit
        from jaxrl_llm.parallel.decode_model import kind_chip
        from jaxrl_llm.train.compile.step_model import faster_setups, peak_flops

        chip, peak = kind_chip(device), peak_flops(device)
        if chip is not None and peak:
            faster = faster_setups(
                config, args.algorithm, chip, peak, max_devices=max_devices, **setup
            )
    if args.json:
        print(
            json.dumps(_json_report(args, mesh, config, est, why, base_step, faster, advice_steps))
        )
    else:
        print(
            f"{args.algorithm} on {args.model} ({params_text(config)}), "
            f"mesh {mesh}, {args.dtype}, batch {args.batch} x {args.seq_len} tokens"
            + (
                f", G={args.group_size}"
                if est.models_in_memory and args.algorithm in _online()
                else ""
            )
            + (f", LoRA r={args.lora_rank}" if args.lora_rank else "")
            + (f" on a {args.lora_base_dtype} base" if args.lora_base_dtype else "")
        )
        print(f"device: {device} (from {why})")
        print(est.table())
        if base_step is not None:
            print(f"modeled step: {_step_text(base_step)}")
        if not est.fits:
            print(_advice_text(advice_steps, device, est.device_bytes))
        elif faster:
            print(f"faster setups that fit ({device}; modeled, fastest first):")
            for change, note, e, m in faster:
                print(f"  {change:<34} {e.total_bytes_per_device / GiB:>9.3f} GiB/device  [{note}]")
                print(f"  {'':<34} modeled step {_step_text(m)}")
    return 0


def _ranked(config, algorithm: str, setup: dict, advice: list):
    """``(base model, [(advice, model)])``: the modeled step of the setup and of each change
    (:func:`jaxrl_llm.train.compile.step_model.model_step`), the changes fastest first
    (models None, in the advice's order, without a chip model: CPU)."""
    from jaxrl_llm.parallel.decode_model import kind_chip
    from jaxrl_llm.train.compile.step_model import model_setup, peak_flops

    def model(device: str, **change):
        chip, peak = kind_chip(device), peak_flops(device)
        if chip is None or not peak:
            return None
        return model_setup(config, algorithm, chip, peak, **{**setup, **change, "device": device})

    base = model(setup["device"])
    out = []
    for a in advice:
        change = _change_kwargs(a.change)
        out.append((a, model(a.device, **change)))
    if all(m is not None for _, m in out):
        out.sort(key=lambda am: am[1].step_s)
    return base, out


def _change_kwargs(change: str) -> dict:
    """An advice's ``change`` (its flags) as :func:`estimate_memory` arguments, for the step
    model (the flags it does not model, such as a device kind, give {})."""
    out: dict = {}
    words = change.split()
    for flag, key, cast in (
        ("--remat", "remat", str),
        ("--lora-rank", "lora_rank", int),
        ("--minibatches", "minibatches", int),
    ):
        if flag in words:
            out[key] = cast(words[words.index(flag) + 1])
    for w in words:
        for part in w.split(","):
            k, sep, v = part.partition("=")
            if sep and k in ("data", "fsdp", "tensor") and v.isdigit():
                out[k] = int(v)
    if "--mesh" in words:
        out.setdefault("data", 1)
    return out


def _step_text(m) -> str:
    return (
        f"{m.step_s:.2f} s ({m.tokens_per_s_per_chip:,.0f} tokens/s per chip; train "
        f"{m.train_s:.2f}, reference {m.reference_s:.2f}, reshard {m.reshard_s:.3f}, decode "
        f"{m.decode_s:.2f})"
    )


def _advice_text(advice, device: str, device_bytes: int) -> str:
    """The lines after a "does NOT fit" verdict: each change, its per-device total and its
    modeled step, fastest first."""
    from jaxrl_llm.train.compile.memory import GiB

    if not advice:
        return (
            f"no single change tried (remat, LoRA, more fsdp, the reference off the device, a "
            f"bigger device) nor their combination fits {device}; shorten --seq-len or --batch"
        )
    ranked = all(m is not None for _, m in advice)
    order = "fastest modeled step first" if ranked else "no step model for this device"
    lines = [f"changes that fit ({device}: {device_bytes / GiB:.1f} GiB/device; {order}):"]
    for a, m in advice:
        where = f" on {a.device} ({a.device_bytes / GiB:.0f} GiB)" if a.device != device else ""
        lines.append(
            f"  {a.change:<34} {a.total_bytes_per_device / GiB:>9.3f} GiB/device{where}  [{a.note}]"
        )
        if m is not None:
            lines.append(f"  {'':<34} modeled step {_step_text(m)}")
    return "\n".join(lines)


def params_text(config) -> str:
    """The size as text: "1.24B params", or "30.53B params, 3.34B active" for experts."""

    def size(n: int) -> str:
        return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"

    text = f"{size(config.num_params())} params"
    if config.is_moe:
        text += f", {size(config.num_params(active=True))} active"
    return text


def _online() -> set[str]:
    from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY

    return {k for k, v in ALGORITHM_MEMORY.items() if v.online}

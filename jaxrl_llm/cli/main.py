"""The ``jaxrl-llm`` command: one subcommand per module, dispatched from an explicit table.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``. A
:class:`jaxrl_llm.errors.JaxrlError` raised anywhere is printed as one line on stderr with
exit status 2; set ``JAXRL_LLM_TRACEBACK=1`` to see the full traceback instead. A usage error
(unknown option, a flag's value of the wrong type) is also one line with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

# name -> (module, one-line help). Explicit, in one place (no import side effects).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("jaxrl_llm.cli.train", "train with a YAML config and dotted overrides"),
    "eval": ("jaxrl_llm.cli.evaluate", "score a model on held-out prompts with rewards"),
    "generate": ("jaxrl_llm.cli.generate", "sample completions from a model"),
    "convert": ("jaxrl_llm.cli.convert", "convert a model or checkpoint (e.g. to Hugging Face)"),
    "memory": ("jaxrl_llm.cli.memory", "estimate per-device memory for an algorithm"),
    "compile": ("jaxrl_llm.cli.compile", "compile for a TPU slice: per-device memory, FLOPs, fit"),
    "plot": ("jaxrl_llm.cli.plot", "write PNG learning curves for a run directory"),
    "bench": ("jaxrl_llm.cli.bench", "run the benchmark suite and rewrite BENCHMARKS.md"),
    "serve": ("jaxrl_llm.cli.serve", "serve a model over HTTP (Tinker API, OpenAI-compatible)"),
}

#: What ``jaxrl-llm --help`` says above and below the commands (for a user, not a developer).
DESCRIPTION = (
    "Post-train language models in JAX: SFT, DPO and its kin, GRPO and other online RL,\n"
    "distillation. Each command has its own --help."
)
EPILOG = """examples:
  jaxrl-llm train configs/grpo.yaml max_steps=50 rollout.group_size=8
  jaxrl-llm train configs/sft.yaml --dry-run       check a config, print it resolved
  jaxrl-llm eval runs/grpo --num-samples 8 --pass-at 1 8 --maj-at 8
  jaxrl-llm generate --model smollm2-135m-instruct --chat --prompt "What is 2 + 3?"
  jaxrl-llm convert runs/grpo runs/grpo-hf         a Hugging Face directory
  jaxrl-llm memory --model 8b --algorithm grpo --lora-rank 16 --device tpu-v5e

configs: configs/*.yaml; docs: README.md and docs/ (evaluation, rewards, data, tools, metrics)
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage block) naming the help."""

    def error(self, message: str):
        """Print ``<prog>: error: <message>`` and the help hint on one line; exit status 2.
        An invalid choice (a subcommand, a flag's value) names the closest one."""
        self.exit(2, f"{self.prog}: error: {suggest_choice(message)}; see `{self.prog} --help`\n")


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)$")


def suggest_choice(message: str) -> str:
    """An argparse ``invalid choice: 'x' (choose from 'a', 'b')`` with ``; did you mean 'a'?``
    after it when a choice is close (:func:`jaxrl_llm.errors.did_you_mean`); any other
    message unchanged."""
    from jaxrl_llm.errors import did_you_mean

    m = _INVALID_CHOICE.search(message)
    if m is None:
        return message
    choices = re.findall(r"'([^']*)'", m.group("choices"))
    hint = did_you_mean(m.group("word"), choices)
    return f"{message}; {hint.strip()[1:-1]}" if hint else message


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand attached."""
    parser = _Parser(
        prog="jaxrl-llm",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # subcommand not built yet
            raise
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _parser=p)
    return parser


#: What libtpu is told on a machine with no TPU, so that it does not look for one: no metadata
#: server to ask, no other TPU workers (``jaxrl-llm compile`` still compiles for any slice; the
#: compiled programs are the same, byte for byte, with or without these).
NO_TPU_HOST = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost"}


def quiet_tpu_discovery(environ=os.environ) -> None:
    """On a machine with no TPU, tell libtpu there is none (:data:`NO_TPU_HOST`, each unless
    set) and, with no GPU plugin either, set ``JAX_PLATFORMS=cpu`` (unless set); before JAX is
    imported. The CLI's entry point calls it; ``import jaxrl_llm`` does not (importing the
    package changes no environment variable: tests/test_import_effects.py).

    The development install carries ``libtpu`` (the ``jax[tpu]`` wheel: ``jaxrl-llm compile``
    compiles for a TPU slice on a CPU host with it). When JAX starts with every platform
    allowed, or ``compile`` loads libtpu for a topology, libtpu looks for TPU workers on the
    network and prints error-like lines (``E0000 ... INVALID_ARGUMENT: Error: unexpected
    worker hostname``). Where no TPU device exists (``/dev/accel*``, ``/dev/vfio`` on TPU VMs)
    there are none to find; with no CUDA / ROCm plugin installed either, the CPU is the only
    platform JAX could use anyway, so asking for it alone changes nothing but the noise.
    ``jaxrl-llm compile`` loads libtpu itself (``jax.experimental.topologies``), which works
    under ``JAX_PLATFORMS=cpu`` (the test suite runs it so), and names the slice to libtpu
    (``TPU_ACCELERATOR_TYPE``, :func:`jaxrl_llm.cli.compile.accelerator_type`), which would
    otherwise print ``Failed to find host bounds for accelerator type``."""
    import glob
    import importlib.util

    if glob.glob("/dev/accel*") or os.path.exists("/dev/vfio"):
        return
    for key, value in NO_TPU_HOST.items():
        environ.setdefault(key, value)
    if "JAX_PLATFORMS" in environ:
        return
    plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")
    if any(importlib.util.find_spec(p) is not None for p in plugins):
        return
    if "jax" in sys.modules:  # too late to choose (an embedding program imported JAX first)
        return
    environ["JAX_PLATFORMS"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxrl-llm`` console script."""
    quiet_tpu_discovery()
    from jaxrl_llm.errors import JaxrlError

    parser = build_parser()
    # parse_known_args, so that ``train CFG --resume a.b=1`` works: argparse stops filling a
    # nargs="*" positional at the first option, and the rest would be "unrecognized". A word
    # without "=" joins them too, so that its error names the override and the expected form.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if isinstance(getattr(args, "overrides", None), list) and all(
            not x.startswith("-") for x in extra
        ):
            args.overrides = args.overrides + extra
        else:  # the subcommand's parser, so the error names the command and its --help
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except JaxrlError as e:
        if os.environ.get("JAXRL_LLM_TRACEBACK"):
            raise
        print(f"jaxrl-llm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # SIGTERM during a run: train.signals.Terminated
        signum = int(getattr(e, "signum", 2))
        print(f"jaxrl-llm {args.command}: interrupted", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())

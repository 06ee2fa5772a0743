"""``jaxrl-llm bench``: run the benchmark suite (``tools/bench``) and rewrite BENCHMARKS.md.

The suite lives in the source tree, not in the package: ``tools/bench/run_all.py`` runs each
benchmark script in its own process, writes ``tools/bench/results/*.md`` (+ ``.json``, PNGs) and
rewrites the marked sections of BENCHMARKS.md. This command finds that file next to the
installed package (an editable install or a checkout) or under the current directory.

Examples::

    jaxrl-llm bench                                   # everything, the real model
    jaxrl-llm bench --only decode,scaling
    jaxrl-llm bench --quick --model tiny --out /tmp/b/BENCHMARKS.md   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from jaxrl_llm.errors import JaxrlError

SUITE = os.path.join("tools", "bench", "run_all.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm bench`` (``tools/bench/run_all.py`` takes the same)."""
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAME[,NAME]",
        help="run only these benchmarks (decode, train_step, memory, grpo_split, scaling)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, seconds per benchmark (smoke test; the numbers mean "
        "nothing); default --out becomes build/bench-quick/BENCHMARKS.md",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="the markdown file to rewrite (default: BENCHMARKS.md of the repository)",
    )
    parser.add_argument(
        "--results-dir",
        default=None,
        help="where each benchmark's .md/.json/.png go (default: "
        "tools/bench/results for the repository's BENCHMARKS.md, else "
        "OUT_DIR/results)",
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="model alias or path, or 'tiny' (random weights, no download)",
    )


def find_suite() -> str:
    """Path of ``tools/bench/run_all.py``: next to the package, else under the current folder.

    Raises:
      JaxrlError: when neither has it (the package was installed without its source tree).
    """
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for root in (package_root, os.getcwd()):
        path = os.path.join(root, SUITE)
        if os.path.isfile(path):
            return path
    raise JaxrlError(
        f"the benchmark suite ({SUITE}) is not part of this installation: jaxrl_llm was "
        f"installed without its source tree. Clone the repository and run `pip install -e .` "
        f"there, or run `jaxrl-llm bench` (or `python {SUITE}`) from the checkout's root"
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm bench``."""
    path = find_suite()
    name = "jaxrl_llm_bench_suite"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise JaxrlError(f"cannot load the benchmark suite from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.run_suite(args, prog="jaxrl-llm bench")

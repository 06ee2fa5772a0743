"""``jaxrl-llm generate``: sample completions from a model for one or more prompts.

Prints only the generated text of each sample on stdout (prompt-major, samples separated by a
blank line when there is more than one); diagnostics (model, timing) go to stderr.

Example (the README's ``make run``)::

    jaxrl-llm generate --model smollm2-135m-instruct --chat --greedy --max-new-tokens 48 \\
        --prompt "What is 37 + 45? Reply with just the number."
"""

from __future__ import annotations

import argparse
import sys
import time

from jaxrl_llm.errors import ConfigError, ModelLoadError

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Attach the ``generate`` options to ``parser``."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model alias, Hugging Face directory or .gguf file (default {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="prompt text; repeat for several prompts (one batch)",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt as a user turn with the tokenizer's chat template",
    )
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (argmax)")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature τ > 0 (default 1.0)"
    )
    parser.add_argument("--top-k", type=int, default=0, help="top-k truncation (0 = off)")
    parser.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus truncation p in (0, 1] (1 = off)"
    )
    parser.add_argument(
        "--min-p", type=float, default=0.0, help="min-p truncation in [0, 1) (0 = off)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="maximum generated tokens per sample (default 128)",
    )
    parser.add_argument(
        "--num-samples", type=int, default=1, help="samples per prompt, G (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")


def _sampling_from_args(args: argparse.Namespace):
    from jaxrl_llm.sampling import SamplingConfig

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    if args.greedy and (args.top_k or args.top_p != 1.0 or args.min_p):
        raise ConfigError(
            "--greedy cannot be combined with --top-k/--top-p/--min-p; drop one of them"
        )
    try:
        return SamplingConfig(
            greedy=args.greedy,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
        )
    except ConfigError as e:  # re-word field names as the flags the user typed
        msg = str(e).replace("sampling top_p", "--top-p").replace("sampling top_k", "--top-k")
        msg = msg.replace("sampling min_p", "--min-p").replace(
            "sampling temperature", "--temperature"
        )
        msg = msg.replace("use greedy decoding", "use --greedy")
        raise ConfigError(msg) from None


def run(args: argparse.Namespace) -> int:
    """Load the model, generate, print the completions; returns the exit status."""
    sampling = _sampling_from_args(args)  # validate before the (slow) model load
    if any(not p for p in args.prompt):
        raise ConfigError("--prompt must not be empty")

    from jaxrl_llm.interop import load_model
    from jaxrl_llm.sampling.text import generate_text

    t0 = time.perf_counter()
    model = load_model(args.model)
    if model.tokenizer is None:
        raise ModelLoadError(
            f"{args.model}: the model has no tokenizer files; generate needs "
            "a tokenizer to encode --prompt text"
        )
    print(
        f"loaded {args.model} ({model.config.num_params() / 1e6:.1f}M parameters) in "
        f"{time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    texts, out = generate_text(
        model.params,
        model.config,
        model.tokenizer,
        args.prompt,
        chat=args.chat,
        sampling=sampling,
        num_samples=args.num_samples,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
    )
    n_tokens = int(out.lengths.sum())
    dt = time.perf_counter() - t0
    print(
        f"generated {n_tokens} tokens in {len(texts)} samples in {dt:.1f}s (including compilation)",
        file=sys.stderr,
    )
    for i, text in enumerate(texts):
        if i:
            print()
        print(text)
    sys.stdout.flush()
    return 0

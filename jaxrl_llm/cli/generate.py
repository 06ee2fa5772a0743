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
        help="model alias, Hugging Face directory, .gguf file, PEFT adapter directory, run "
        f"directory or checkpoint directory (default {DEFAULT_MODEL})",
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
    parser.add_argument(
        "--engine",
        choices=("static", "paged"),
        default="static",
        help="static batch (default) or continuous batching over a paged KV cache; "
        "the same tokens for the same seed",
    )
    parser.add_argument(
        "--rollout-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weights and KV cache dtype while sampling (default: the model's); "
        "log-probs stay float32",
    )


def _sampling_from_args(args: argparse.Namespace):
    from jaxrl_llm.sampling import SamplingConfig

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    if not 0 <= args.seed <= 2**32 - 1:
        raise ConfigError(f"--seed must be an integer in [0, {2**32 - 1}], got {args.seed}")
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

    from jaxrl_llm.cli.sources import classify_source, describe, load_any
    from jaxrl_llm.interop import LoadedModel
    from jaxrl_llm.sampling import ROLLOUT_ENGINES, cast_for_rollout
    from jaxrl_llm.sampling.text import generate_text

    t0 = time.perf_counter()
    source = classify_source(args.model)
    config, params, tokenizer, restored = load_any(source, prefer_export=True)
    model = LoadedModel(config, params, tokenizer)
    if model.tokenizer is None:
        raise ModelLoadError(
            f"{args.model}: the model has no tokenizer files; generate needs "
            "a tokenizer to encode --prompt text"
        )
    print(
        f"loaded {describe(source, restored)} ({model.config.num_params() / 1e6:.1f}M "
        f"parameters) in {time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )
    _check_budget(model, args)
    t0 = time.perf_counter()
    params, config = cast_for_rollout(model.params, model.config, args.rollout_dtype)
    texts, out = generate_text(
        params,
        config,
        model.tokenizer,
        args.prompt,
        chat=args.chat,
        sampling=sampling,
        num_samples=args.num_samples,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        generate_fn=ROLLOUT_ENGINES[args.engine],
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


def _check_budget(model, args: argparse.Namespace) -> None:
    """Refuse, before compiling, a request the model's context or this machine's memory cannot
    hold: prompt + ``--max-new-tokens`` beyond ``max_position_embeddings``, or a KV cache and
    logits for ``prompts × --num-samples`` rows larger than the available memory."""
    import numpy as np

    from jaxrl_llm.parallel import free_memory
    from jaxrl_llm.sampling.text import encode_prompts
    from jaxrl_llm.train.config.preflight import check_context_budget

    c = model.config
    prompt_len = max(
        len(ids) for ids in encode_prompts(model.tokenizer, args.prompt, chat=args.chat)
    )
    total = prompt_len + args.max_new_tokens
    check_context_budget(
        c.max_position_embeddings,
        prompt_len,
        args.max_new_tokens,
        key=f"--max-new-tokens {args.max_new_tokens}",
    )
    rows = len(args.prompt) * args.num_samples
    itemsize = np.dtype(c.compute_dtype).itemsize
    kv = 2 * c.num_kv_layers * c.store_kv_heads * c.store_head_dim * total * itemsize
    need = rows * (kv + 4 * c.vocab_size)  # the KV cache and one step's float32 logits per row
    avail = free_memory()  # the host: generate holds the weights and KV cache in its memory
    if need > 0.8 * avail:
        fit = max(int(0.8 * avail // max(kv + 4 * c.vocab_size, 1)), 0)
        raise ConfigError(
            f"--num-samples {args.num_samples} x {len(args.prompt)} prompt(s) x {total} tokens "
            f"needs ~{need / 2**30:.1f} GiB of KV cache and logits, more than this machine has "
            f"free ({avail / 2**30:.1f} GiB); at this length at most {fit} rows fit"
        )

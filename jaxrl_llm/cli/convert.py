"""``jaxrl-llm convert SRC OUT --to hf [--dtype float32|bfloat16] [--adapter-only]``.

SRC is a run directory (``jaxrl-llm train``'s ``output_dir``: its newest checkpoint), a
checkpoint directory (``RUN/checkpoints`` or one step of it), a Hugging Face directory, a PEFT
adapter directory (merged onto its base), a ``.gguf`` file or a model alias
(``smollm2-135m-instruct``); the first line printed says which it found
(:mod:`jaxrl_llm.cli.sources`). OUT becomes a Hugging Face directory that ``transformers``
loads with the same logits; a LoRA run's adapters are merged into its base. With
``--adapter-only`` (a LoRA run or checkpoint), OUT becomes a PEFT adapter directory instead
(``adapter_config.json`` + ``adapter_model.safetensors``) that ``peft`` loads on top of the
transformers export of the base, and that ``model.source`` / ``--model`` accept.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from jaxrl_llm.errors import ModelLoadError

_FORMATS = ("hf",)
_DTYPES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Attach ``SRC OUT --to --dtype`` to the ``convert`` sub-parser."""
    parser.add_argument(
        "src",
        metavar="SRC",
        help="run directory, checkpoint directory, Hugging Face directory, PEFT adapter "
        "directory, .gguf file or model alias",
    )
    parser.add_argument("out", metavar="OUT", help="output directory")
    parser.add_argument("--to", choices=_FORMATS, default="hf", help="output format (hf)")
    parser.add_argument(
        "--dtype", choices=_DTYPES, default="float32", help="stored weight dtype (default float32)"
    )
    parser.add_argument(
        "--adapter-only",
        action="store_true",
        help="a LoRA run or checkpoint: write its adapters as a PEFT adapter directory "
        "(adapter_config.json + adapter_model.safetensors) instead of the merged model",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT, first removing the model and tokenizer files there",
    )


# What a Hugging Face export writes (and --force clears): everything else in OUT stays.
_OWNED = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "adapter_config.json",
    "adapter_model.safetensors",
)


def _prepare_out(out: Path, force: bool) -> None:
    """OUT must be new or empty; with ``force``, the files an export owns are removed first
    (stale tokenizer files of another model would otherwise be loaded beside the new ones)."""
    if out.exists() and not out.is_dir():
        raise ModelLoadError(f"{out}: exists and is not a directory; choose another OUT")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise ModelLoadError(
            f"{out}: not empty; choose a new OUT, or pass --force to replace the model and "
            f"tokenizer files there"
        )
    for p in out.iterdir():
        if p.is_file() and (p.name in _OWNED or p.name.startswith("model-0")):
            p.unlink()


def _weights_warnings(fn, *args, **kwargs):
    """Call ``fn`` and print each warning it raises as one ``warning: ...`` line on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return out


def inf_weights(params, dtype: str) -> dict[str, int]:
    """Parameter path -> number of ±inf values once cast to ``dtype`` (the export's), for the
    tensors that hold any."""
    import jax
    import jax.numpy as jnp

    out: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            continue
        n = int(jnp.isinf(jnp.asarray(leaf).astype(dtype)).sum())
        if n:
            out["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)] = n
    return out


def inf_warning(counts: dict[str, int], *, source: str, dtype: str) -> str:
    """One line for :func:`inf_weights`: the total and the first tensors (as NaN is warned)."""
    first = ", ".join(f"{k} ({v})" for k, v in sorted(counts.items())[:3])
    more = f" and {len(counts) - 3} more" if len(counts) > 3 else ""
    return (
        f"{source}: {sum(counts.values())} inf weight value(s) in {dtype} in {len(counts)} "
        f"tensor(s): {first}{more}"
    )


def _resolved(path: Path, what: str) -> Path:
    """``path`` resolved; a symlink loop is one line naming it."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as e:  # RuntimeError: Python < 3.13's symlink loop
        raise ModelLoadError(
            f"{what} {path}: cannot be resolved ({getattr(e, 'strerror', None) or e}); a "
            f"symlink loop? point it at the model itself"
        ) from None


def _base_for_peft(base: str | None, src: str) -> str:
    """``base_model_name_or_path`` for an adapter: an alias as is, a path made absolute."""
    from jaxrl_llm.interop import MODEL_ALIASES

    if base is None or base == "tiny":
        raise ModelLoadError(
            f"{src}: the run's model.source={base!r} is a random initialisation, not a model "
            f"peft can load as a base; convert without --adapter-only (the merged model)"
        )
    if base in MODEL_ALIASES or not Path(base).expanduser().exists():
        return base
    return str(Path(base).expanduser().resolve())


def run(args: argparse.Namespace) -> int:
    """Convert ``args.src`` into ``args.out``; prints what SRC is and each file written.
    Returns 0."""
    from jaxrl_llm.cli.sources import SourceKind, classify_source, describe, load_any
    from jaxrl_llm.interop import export_hf
    from jaxrl_llm.interop.peft import export_peft_adapter, peft_base_model

    src = Path(str(args.src)).expanduser()
    out = Path(args.out)
    if _resolved(out, "OUT") == _resolved(src, "SRC"):
        raise ModelLoadError(f"{out}: OUT must differ from SRC")
    if args.to != "hf":  # argparse already restricts this; kept for programmatic callers
        raise ModelLoadError(f"--to {args.to!r} is not supported; allowed: {list(_FORMATS)}")
    source = classify_source(args.src)
    adapter_only = getattr(args, "adapter_only", False)
    if adapter_only and source.kind not in (SourceKind.RUN, SourceKind.CHECKPOINT):
        raise ModelLoadError(
            f"{args.src}: --adapter-only needs a LoRA run or checkpoint directory; this is a "
            f"{source.kind.value}"
        )
    _prepare_out(out, getattr(args, "force", False))
    config, params, tokenizer, restored = load_any(source, prefer_export=False)
    if adapter_only and (restored is None or restored.lora is None):
        raise ModelLoadError(
            f"{args.src}: holds full weights, not LoRA adapters; --adapter-only needs a "
            f"run trained with model.lora (drop --adapter-only to export the model)"
        )
    print(f"found {describe(source, restored, merged=not adapter_only)}")
    if adapter_only:
        assert restored is not None and restored.lora is not None
        base = _base_for_peft(restored.base_source, str(args.src))
        written = export_peft_adapter(
            out,
            config=config,
            adapters=restored.adapters,
            lora=restored.lora,
            base_model=base,
            dtype=args.dtype,
        )
        # the base as adapter_config.json names it (an alias is written as its hub id)
        named = peft_base_model(base)
        named = named if named == base else f"{named} ({base})"
        what = f"PEFT LoRA adapter r={restored.lora.rank}, base_model_name_or_path {named}"
    else:
        inf = inf_weights(params, args.dtype)
        if inf:
            print(
                f"warning: {inf_warning(inf, source=str(out), dtype=args.dtype)}", file=sys.stderr
            )
        written = _weights_warnings(
            export_hf,
            out,
            config=config,
            params=params,
            tokenizer=tokenizer if hasattr(tokenizer, "save_pretrained") else None,
            dtype=args.dtype,
        )
        arch = "sequence classifier" if config.num_labels else "causal LM"
        what = f"{config.family.value} {arch}, {config.num_params() / 1e6:.1f}M params"
    print(f"converted {args.src} -> {out} ({what}, {args.dtype})")
    for p in written:
        print(f"  wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0

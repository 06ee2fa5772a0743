"""``jaxrl-llm convert SRC OUT --to hf [--dtype float32|bfloat16]``.

SRC is a Hugging Face directory, a ``.gguf`` file, a model alias (``smollm2-135m-instruct``)
or a training checkpoint directory (restored through
``jaxrl_llm.train.run.checkpoint.restore_model``). OUT becomes a Hugging Face directory that
``transformers`` loads with the same logits.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from jaxrl_llm.errors import CheckpointError, ModelLoadError

_FORMATS = ("hf",)
_DTYPES = ("float32", "bfloat16")
# Names found at the top of an orbax checkpoint or a run's checkpoint folder.
_CHECKPOINT_MARKERS = (
    "_CHECKPOINT_METADATA",
    "_METADATA",
    "manifest.ocdbt",
    "checkpoints",
    "params",
    "model_config",
    "state",
    "metadata.json",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Attach ``SRC OUT --to --dtype`` to the ``convert`` sub-parser."""
    parser.add_argument(
        "src",
        metavar="SRC",
        help="Hugging Face directory, .gguf file, model alias, or checkpoint dir",
    )
    parser.add_argument("out", metavar="OUT", help="output directory")
    parser.add_argument("--to", choices=_FORMATS, default="hf", help="output format (hf)")
    parser.add_argument(
        "--dtype", choices=_DTYPES, default="float32", help="stored weight dtype (default float32)"
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


def _looks_like_checkpoint(path: Path) -> bool:
    """A directory without config.json that holds orbax-style entries or step folders."""
    if not path.is_dir() or (path / "config.json").is_file():
        return False
    names = {p.name for p in path.iterdir()}
    return bool(names & set(_CHECKPOINT_MARKERS)) or any(n.isdigit() for n in names)


def _restore_checkpoint(path: Path):
    """(config, params, tokenizer_or_None) from ``jaxrl_llm.train.run.checkpoint.restore_model``."""
    try:
        module = importlib.import_module("jaxrl_llm.train.run.checkpoint")
    except ModuleNotFoundError as e:
        if e.name not in ("jaxrl_llm.train.run.checkpoint", "jaxrl_llm.train"):
            raise
        module = None
    restore = getattr(module, "restore_model", None)
    if restore is None:
        raise CheckpointError(
            f"{path}: looks like a training checkpoint, but checkpoint "
            f"restore is not available in this install "
            f"(jaxrl_llm.train.run.checkpoint.restore_model is missing)"
        )
    config, params, tokenizer = restore(str(path))
    return config, params, tokenizer


def run(args: argparse.Namespace) -> int:
    """Convert ``args.src`` into ``args.out``; prints each file written. Returns 0."""
    from jaxrl_llm.interop import export_hf, load_model

    src = Path(str(args.src)).expanduser()
    out = Path(args.out)
    if out.resolve() == src.resolve():
        raise ModelLoadError(f"{out}: OUT must differ from SRC")
    _prepare_out(out, getattr(args, "force", False))
    if _looks_like_checkpoint(src):
        config, params, tokenizer = _restore_checkpoint(src)
        generation_config = None
    else:
        loaded = load_model(args.src, param_dtype="float32")
        config, params, tokenizer = loaded
        generation_config = None
    if args.to != "hf":  # argparse already restricts this; kept for programmatic callers
        raise ModelLoadError(f"--to {args.to!r} is not supported; allowed: {list(_FORMATS)}")
    written = export_hf(
        out,
        config=config,
        params=params,
        tokenizer=tokenizer,
        generation_config=generation_config,
        dtype=args.dtype,
    )
    arch = "sequence classifier" if config.num_labels else "causal LM"
    print(
        f"converted {args.src} -> {out} ({config.family.value} {arch}, "
        f"{config.num_params() / 1e6:.1f}M params, {args.dtype})"
    )
    for p in written:
        print(f"  wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    return 0

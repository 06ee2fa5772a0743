"""GGUF files: the header's architecture, the check that transformers can read one, and its
conversion into a cached Hugging Face directory.

GGUF files go through transformers' GGUF reader (which de-quantises to float32 and is slow);
the converted model is cached on disk as an ordinary Hugging Face directory under
``$JAXRL_LLM_CACHE`` (default ``~/.cache/jaxrl_llm``), keyed by the GGUF file's path, size and
modification time, so later loads read safetensors and take seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.aliases import cache_dir
from jaxrl_llm.interop.from_hf import from_hf_model, quiet_transformers

_CACHE_FORMAT = "1"  # bump when the cached layout changes


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{_CACHE_FORMAT}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    arch = gguf_architecture(path)
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # transformers names some architectures apart from llama.cpp (qwen3moe -> qwen3_moe)
    readable = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})
    if arch is not None and arch.replace("_", "") not in {a.replace("_", "") for a in readable}:
        raise ModelLoadError(
            f"{path}: GGUF architecture {arch!r} is not one that transformers converts "
            f"(GGUF files are read through it; it reads {', '.join(readable)}); use the "
            f"model's Hugging Face directory (safetensors) instead"
        )


# GGUF metadata value types -> their size in bytes (8 string, 9 array: variable)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_architecture(path: str | os.PathLike) -> str | None:
    """A GGUF file's ``general.architecture`` (e.g. ``llama``, ``qwen35``), None if unset.

    Reads the header's key/value pairs up to that key (GGUF v2/v3, little-endian; the format
    of ggml's ``docs/gguf.md``) and no tensor: the gguf package's reader indexes every tensor
    first (2-8 s on the alias files)."""
    import struct

    size = os.path.getsize(path)
    truncated = ModelLoadError(
        f"{path}: a truncated or corrupt GGUF file ({size} bytes; its header ends early or "
        f"names lengths past the end); download it again"
    )

    def read(f, fmt):
        data = f.read(struct.calcsize(fmt))
        if len(data) < struct.calcsize(fmt):
            raise truncated
        return struct.unpack("<" + fmt, data)[0]

    def string(f):
        n = read(f, "Q")
        if n > size - f.tell():
            raise truncated
        return f.read(n).decode("utf-8", "replace")

    def skip(f, vtype):
        if vtype == 8:
            f.seek(read(f, "Q"), 1)
        elif vtype == 9:
            item, count = read(f, "I"), read(f, "Q")
            if item in (8, 9):
                for _ in range(count):
                    skip(f, item)
            else:
                f.seek(_GGUF_SIZES[item] * count, 1)
        else:
            f.seek(_GGUF_SIZES[vtype], 1)

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF" or read(f, "I") < 2:
            return None
        _, n_kv = read(f, "Q"), read(f, "Q")
        for _ in range(n_kv):
            key, vtype = string(f), read(f, "I")
            if key == "general.architecture" and vtype == 8:
                return string(f)
            skip(f, vtype)
    return None


def _convert_gguf(path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF file with transformers and write it as an HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jaxrl_llm.interop.export import export_hf

    directory, name = str(path.parent), path.name
    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                directory, gguf_file=name, local_files_only=True, trust_remote_code=False
            )
            tokenizer = AutoTokenizer.from_pretrained(
                directory, gguf_file=name, local_files_only=True, trust_remote_code=False
            )
    except Exception as e:  # transformers raises ValueError/OSError/RuntimeError here
        raise ModelLoadError(f"{path}: transformers cannot read this GGUF file ({e})") from None
    loaded = from_hf_model(model, tokenizer)
    gen = getattr(model, "generation_config", None)
    export_hf(
        out_dir,
        config=loaded.config,
        params=loaded.params,
        tokenizer=tokenizer,
        generation_config=gen,
    )
    (out_dir / "jaxrl_llm_source.json").write_text(
        json.dumps(
            {
                "gguf": str(path.resolve()),
                "size": path.stat().st_size,
                "mtime_ns": path.stat().st_mtime_ns,
                "format": _CACHE_FORMAT,
            },
            indent=1,
        )
    )


def cached_gguf_dir(path: str | os.PathLike) -> Path:
    """The cached Hugging Face directory for a GGUF file, converting it on first use.

    The cache entry is written to a temporary directory and renamed into place, so a
    concurrent or interrupted conversion never leaves a half-written entry.

    Args:
      path: the ``.gguf`` file.

    Returns:
      ``cache_dir()/gguf/<key>``, an HF directory (config.json, model.safetensors,
      tokenizer files, generation_config.json).

    Raises:
      ModelLoadError: not a GGUF file, or transformers cannot read it.
    """
    path = Path(path)
    _check_gguf(path)
    target = cache_dir() / "gguf" / f"{path.stem}-{_gguf_cache_key(path)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _convert_gguf(path, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def has_gguf_magic(path: Path) -> bool:
    """Whether the file starts with the GGUF magic bytes ``GGUF`` (whatever its suffix)."""
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"

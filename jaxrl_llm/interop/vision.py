"""Vision-language models in and out: a transformers conditional-generation directory (Gemma 3's
``Gemma3ForConditionalGeneration``, ``model_type`` gemma3) loaded with its vision tower
(:func:`load_vision_model`: the text model as :func:`~jaxrl_llm.interop.load_model` loads it,
plus ``params["vision"]`` and the family's vision config), and written back
(:func:`export_vision_hf`) so that transformers' own class loads it with the same logits.

The family's vision part is asked through its entry
(:attr:`~jaxrl_llm.models.families.registry.FamilyEntry.vision`); a text-only load of the
same directory (:func:`~jaxrl_llm.interop.load_model`) is unchanged: it drops the tower.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.export import export_hf, numpy_dtype
from jaxrl_llm.interop.from_hf import to_jax
from jaxrl_llm.interop.load import load_hf_dir, read_safetensors
from jaxrl_llm.interop.state_dict import checked_taker, params_to_hf_state_dict
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.families.registry import VisionEntry, entry_of, family_entry

#: Where the text decoder's tensors sit in a conditional-generation checkpoint.
TEXT_PREFIX = "model.language_model."


class VisionLanguageModel(NamedTuple):
    """A vision-language model ready to run: ``(config, vision, params, tokenizer)``.

    Attributes:
      config: the text model's :class:`~jaxrl_llm.models.ModelConfig`.
      vision: the family's vision config (Gemma 3:
        :class:`~jaxrl_llm.models.families.gemma.vision_config.GemmaVisionConfig`).
      params: the text params tree plus ``params["vision"]`` (jax arrays, ``param_dtype``).
      tokenizer: a transformers tokenizer, or None when the directory has none.
    """

    config: ModelConfig
    vision: Any
    params: dict[str, Any]
    tokenizer: Any


def vision_entry(config: ModelConfig, *, source: str) -> VisionEntry:
    """The vision part of ``config``'s family.

    Raises:
      ModelLoadError: the family has no vision tower we implement (one line).
    """
    entry = entry_of(config.family).vision
    if entry is None:
        raise ModelLoadError(
            f"{source}: {config.family.value} has no vision tower here; images need a "
            f"vision-language model"
        )
    return entry


def vision_params_from_hf_state_dict(
    state_dict: Mapping[str, Any], config: ModelConfig, vision: Any, *, source: str = "state dict"
) -> dict[str, Any]:
    """``params["vision"]`` of a conditional-generation state dict (numpy arrays).

    Raises:
      ModelLoadError: a missing or mis-shaped vision tensor, or one we do not map, named.
    """
    entry = vision_entry(config, source=source)
    sd = entry.hf_names(state_dict)
    used: set[str] = set()
    out = entry.weights_from_hf(checked_taker(sd, used, config, source), vision)
    extra = sorted(k for k in sd if k.startswith(entry.prefixes) and k not in used)
    if extra:
        raise ModelLoadError(f"{source}: unexpected vision weights {extra[:3]}")
    return out


def load_vision_model(
    path: str | os.PathLike, *, param_dtype: str = "float32", compute_dtype: str | None = None
) -> VisionLanguageModel:
    """Load a local conditional-generation directory with its vision tower.

    Args:
      path: the directory (``config.json`` with ``text_config`` and ``vision_config``,
        ``*.safetensors``, tokenizer files if any).
      param_dtype, compute_dtype: as in :func:`~jaxrl_llm.interop.load_model`.

    Returns:
      A :class:`VisionLanguageModel`.

    Raises:
      ModelLoadError: what :func:`~jaxrl_llm.interop.load_hf_dir` raises, a directory with
        no vision tower (a text-only model), an unsupported vision feature.
    """
    d = Path(path)
    text = load_hf_dir(d, param_dtype=param_dtype, compute_dtype=compute_dtype)
    hf = json.loads((d / "config.json").read_text())
    entry = family_entry(hf.get("model_type", ""))
    if "vision_config" not in hf or entry is None or entry.vision is None:
        raise ModelLoadError(
            f"{d}: no vision tower (model_type {hf.get('model_type')!r} has no vision_config "
            f"we read); load it with load_model for text"
        )
    try:
        vision = entry.vision.config_from_hf(hf, text.config.hidden_size)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{d / 'config.json'}: {e}") from None
    sd = read_safetensors(d)
    tower = vision_params_from_hf_state_dict(sd, text.config, vision, source=str(d))
    params = dict(text.params)
    params["vision"] = to_jax(tower, text.config.param_jnp_dtype)
    return VisionLanguageModel(text.config, vision, params, text.tokenizer)


def vision_hf_state_dict(
    params: Mapping[str, Any], config: ModelConfig, vision: Any
) -> dict[str, np.ndarray]:
    """The conditional-generation state dict of ``params`` (text under
    ``model.language_model.``, ``lm_head`` at the top, the tower under the family's names)."""
    entry = vision_entry(config, source="export")
    host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), dict(params))
    tower = host.pop("vision")
    text = params_to_hf_state_dict(host, config)
    out = {
        (TEXT_PREFIX + k[len("model.") :] if k.startswith("model.") else k): w
        for k, w in text.items()
    }
    out.update(entry.weights_to_hf(tower, vision))
    return {k: np.ascontiguousarray(w) for k, w in out.items()}


def export_vision_hf(
    out_dir: str | os.PathLike,
    *,
    config: ModelConfig,
    vision: Any,
    params: Mapping[str, Any],
    tokenizer: Any = None,
    dtype: str | None = None,
) -> list[Path]:
    """Write a conditional-generation directory that transformers' own class of the family
    (``AutoModelForImageTextToText`` / ``Gemma3ForConditionalGeneration``) loads with no
    missing or unexpected keys and the logits of
    :func:`~jaxrl_llm.models.families.gemma.vision.forward_with_images`.

    The text part is written by :func:`~jaxrl_llm.interop.export_hf` (its checks and
    generation config), then its weights and ``config.json`` are replaced by the multimodal
    ones.

    Raises:
      ModelLoadError: what :func:`~jaxrl_llm.interop.export_hf` raises; a family without a
        vision tower.
    """
    from safetensors.numpy import save_file

    entry = vision_entry(config, source="export")
    text_params = {k: v for k, v in params.items() if k != "vision"}
    written = export_hf(
        out_dir, config=config, params=text_params, tokenizer=tokenizer, dtype=dtype
    )
    out = Path(out_dir)
    text_cfg = json.loads((out / "config.json").read_text())
    np_dtype = numpy_dtype(dtype or config.param_dtype)
    sd = vision_hf_state_dict(params, config, vision)
    save_file({k: w.astype(np_dtype) for k, w in sd.items()}, str(out / "model.safetensors"))
    outer = {
        "architectures": [entry.architecture],
        "model_type": entry_of(config.family).multimodal_model_type,
        "text_config": {k: v for k, v in text_cfg.items() if k != "architectures"},
        "tie_word_embeddings": config.tie_embeddings,
        **entry.config_to_hf(vision),
    }
    for key in ("torch_dtype", "dtype", "transformers_version"):
        if key in text_cfg:
            outer[key] = text_cfg[key]
    (out / "config.json").write_text(json.dumps(outer, indent=2, sort_keys=True) + "\n")
    return written

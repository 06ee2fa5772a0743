"""Export our params tree as a Hugging Face directory that transformers loads unchanged.

The directory holds ``config.json`` (the family's transformers architecture, the stored
``torch_dtype``, never a ``quantization_config``), ``model.safetensors``, the tokenizer files
with the chat template, and ``generation_config.json``. A model with a scalar head
(``num_labels == 1``) becomes a ``*ForSequenceClassification`` model (``score.weight``).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.hf_config import hf_config_dict
from jaxrl_llm.interop.state_dict import params_to_hf_state_dict
from jaxrl_llm.interop.weight_checks import check_weights, nan_warning
from jaxrl_llm.models.config import ModelConfig


def numpy_dtype(name: str):
    """The numpy dtype of a stored-weight dtype name (``float32``, ``bfloat16``, ``float16``).

    Raises:
      ModelLoadError: another name.
    """
    if name == "float32":
        return np.float32
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    if name == "float16":
        return np.float16
    raise ModelLoadError(
        f"export: dtype {name!r} is not supported; allowed: 'float32', 'bfloat16', 'float16'"
    )


def _generation_config_dict(config: ModelConfig, generation_config: Any) -> dict[str, Any]:
    if generation_config is None:
        d: dict[str, Any] = {}
    elif isinstance(generation_config, Mapping):
        d = dict(generation_config)
    else:  # transformers.GenerationConfig
        d = (
            generation_config.to_diff_dict()
            if hasattr(generation_config, "to_diff_dict")
            else generation_config.to_dict()
        )
    d.pop("transformers_version", None)
    eos = list(config.tokens.eos_ids)
    defaults = {
        "bos_token_id": config.tokens.bos_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": config.tokens.pad_id,
    }
    for k, v in defaults.items():
        if d.get(k) is None and v is not None:
            d[k] = v
    return d


def export_hf(
    out_dir: str | os.PathLike,
    *,
    config: ModelConfig,
    params: Mapping[str, Any],
    tokenizer: Any = None,
    generation_config: Any = None,
    dtype: str | None = None,
) -> list[Path]:
    """Write a Hugging Face model directory for ``(config, params)``.

    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` (or
    ``AutoModelForSequenceClassification`` for a scalar-head model) then loads it with no
    missing or unexpected keys and gives the same logits as :func:`jaxrl_llm.models.forward`.

    Args:
      out_dir: directory to create (may exist; files of the same name are overwritten).
      config: the model config (``num_labels == 1`` -> ``*ForSequenceClassification``).
      params: the params tree (jax or numpy arrays).
      tokenizer: a transformers tokenizer to save alongside (keeps its chat template).
      generation_config: a ``transformers.GenerationConfig`` or dict; by default one with the
        config's bos/eos/pad token ids.
      dtype: stored weight dtype, 'float32' or 'bfloat16' (default ``config.param_dtype``).

    Returns:
      The paths written, in order.

    Raises:
      ModelLoadError: params do not match the config, a weight is not floating point (named),
        or the config cannot be expressed in transformers (e.g. Llama with q/k norm).

    Warns:
      RuntimeWarning: NaN weights, with their count and the tensors that hold them.
    """
    from safetensors.numpy import save_file

    out = Path(out_dir)
    dtype = dtype or config.param_dtype
    np_dtype = numpy_dtype(dtype)
    hf_cfg = hf_config_dict(config, dtype=dtype)
    host = {}
    import jax

    host_params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), dict(params))
    state_dict = params_to_hf_state_dict(host_params, config)
    nans = check_weights(state_dict, source="export")
    if nans:
        warnings.warn(nan_warning(nans, source=str(out)), RuntimeWarning, stacklevel=2)
    for k, v in state_dict.items():
        host[k] = np.ascontiguousarray(v.astype(np_dtype))
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    weights = out / "model.safetensors"
    save_file(host, str(weights), metadata={"format": "pt"})
    written.append(weights)

    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    written.append(cfg_path)

    gen_path = out / "generation_config.json"
    gen_path.write_text(
        json.dumps(_generation_config_dict(config, generation_config), indent=2, sort_keys=True)
        + "\n"
    )
    written.append(gen_path)

    if tokenizer is not None:
        before = set(out.iterdir())
        tokenizer.save_pretrained(str(out))
        written.extend(
            sorted(set(out.iterdir()) - before)
            or sorted(p for p in out.iterdir() if "token" in p.name or "template" in p.name)
        )
    return written

"""LoRA adapters in PEFT's directory format, written from our adapters and read back onto a base.

A PEFT LoRA adapter directory (https://huggingface.co/docs/peft/developer_guides/checkpoint)
holds ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``,
``target_modules``, ``base_model_name_or_path``, ...) and ``adapter_model.safetensors`` with two
tensors per adapted ``nn.Linear``, named after the module inside the ``PeftModel`` wrapper:

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

PEFT computes ``y = x Wᵀ + (α / r) · x Aᵀ Bᵀ`` (``α / √r`` with ``use_rslora``), so the merged
weight is ``W' = W + (α / r) · B A`` in transformers' ``[out, in]`` layout. Ours
(:mod:`jaxrl_llm.models.lora`) keeps ``a [L, in, r]`` and ``b [L, r, out]`` with in / out the
kernel's input and output dims flattened in row-major order, which is exactly the order of
transformers' flattened ``[out, in]`` weight (see :mod:`jaxrl_llm.interop.state_dict`), so
PEFT's ``lora_A = a[i]ᵀ`` and ``lora_B = b[i]ᵀ`` with the same α and r.

The base an adapter names (``base_model_name_or_path``) must be one peft can load: a model
alias is written as the hub id it was made from (``smollm2-135m-instruct`` →
``HuggingFaceTB/SmolLM2-135M-Instruct``, :data:`~jaxrl_llm.interop.aliases.ALIAS_HF_IDS`), and the
alias itself is kept in ``jaxrl_llm_base.json`` beside it, so that reading the adapter here
merges it onto the weights it was trained on (the alias's file, a 4-bit quantisation: the hub
model's float weights differ from it by that rounding).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.state_dict import hf_projection_name
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.lora import LoRAConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Beside an adapter whose base is a model alias: ``{"alias": ..., "hf_id": ...}``.
BASE_NOTE = "jaxrl_llm_base.json"
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def is_peft_adapter(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory holding a PEFT ``adapter_config.json``."""
    return Path(path).is_dir() and (Path(path) / ADAPTER_CONFIG).is_file()


def peft_adapter_config(
    lora: LoRAConfig, *, base_model: str | None, task_type: str = "CAUSAL_LM"
) -> dict[str, Any]:
    """The ``adapter_config.json`` dict PEFT reads for our :class:`LoRAConfig` (plain LoRA:
    no dropout at inference, no bias, no DoRA, no rsLoRA, every layer)."""
    return {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": sorted(lora.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def peft_base_model(base: str | None) -> str | None:
    """What ``base_model_name_or_path`` holds for a base named ``base``: the hub id of a model
    alias that has one, else ``base`` unchanged (a path, a hub id, None)."""
    from jaxrl_llm.interop.aliases import alias_hf_id

    return (alias_hf_id(base) or base) if base else base


def export_peft_adapter(
    out_dir: str | os.PathLike,
    *,
    config: ModelConfig,
    adapters: Mapping[str, Any],
    lora: LoRAConfig,
    base_model: str | None,
    dtype: str = "float32",
) -> list[Path]:
    """Write our LoRA adapters as a PEFT adapter directory.

    ``peft.PeftModel.from_pretrained(base, out_dir)`` on the transformers model of the base
    (e.g. :func:`~jaxrl_llm.interop.export_hf` of it) then gives the logits of the merged
    model, and :func:`~jaxrl_llm.interop.load_model` reads the directory back on its base.

    Args:
      out_dir: directory to write (created if missing).
      config: the base model's config (for the layer count and shapes).
      adapters: ``{"layers": {name: {"a": [L, in, r], "b": [L, r, out]}}}`` as
        :func:`jaxrl_llm.models.lora.init_lora` builds and training updates them; ``b``
        unscaled (the scale α / r goes into ``lora_alpha``).
      lora: the run's rank, α and targets.
      base_model: the base (a directory, GGUF file, hub id or alias); written as
        :func:`peft_base_model` of it (an alias as its hub id, noted in :data:`BASE_NOTE`).
      dtype: stored dtype, ``float32`` or ``bfloat16``.

    Returns:
      The paths written (the weights, ``adapter_config.json`` and, for an alias base, the
      note).

    Raises:
      ModelLoadError: an adapter's shape does not match ``config`` and ``lora``.
    """
    import jax
    from safetensors.numpy import save_file

    from jaxrl_llm.interop.export import numpy_dtype

    np_dtype = numpy_dtype(dtype)
    layers = adapters.get("layers", {}) if isinstance(adapters, Mapping) else {}
    if sorted(layers) != sorted(lora.targets):
        raise ModelLoadError(
            f"adapters hold {sorted(layers)}, but the LoRA config targets {sorted(lora.targets)}"
        )
    attention = sorted(set(layers) & {"q_proj", "k_proj", "v_proj", "o_proj"})
    if attention and (
        config.has_padded_heads or config.attn.global_k_eq_v or config.attn.kv_shared_layers
    ):
        raise ModelLoadError(
            f"PEFT export of adapters on {attention} of a model with attention heads of two "
            f"sizes, values that are keys or KV sharing (Gemma 4) is not supported; export the "
            f"merged model"
        )
    mlp = sorted(set(layers) & {"gate_proj", "up_proj", "down_proj"})
    if mlp and config.mlp.double_wide:
        raise ModelLoadError(
            f"PEFT export of adapters on {mlp} of a model whose MLPs have two widths "
            f"(double_wide_mlp, Gemma 4) is not supported; export the merged model"
        )
    tensors: dict[str, np.ndarray] = {}
    for name, ab in layers.items():
        a = np.asarray(jax.device_get(ab["a"]), np.float32)
        b = np.asarray(jax.device_get(ab["b"]), np.float32)
        if a.ndim != 3 or b.ndim != 3 or a.shape[0] != config.num_layers:
            raise ModelLoadError(
                f"adapter {name}: a {a.shape} / b {b.shape} are not [L={config.num_layers}, "
                f"in, r] / [L, r, out]"
            )
        if a.shape[2] != lora.rank or b.shape[1] != lora.rank:
            raise ModelLoadError(f"adapter {name}: rank {a.shape[2]}, expected r={lora.rank}")
        for i in range(config.num_layers):
            module = _PREFIX + hf_projection_name(name, i)
            tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(a[i].T.astype(np_dtype))
            tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(b[i].T.astype(np_dtype))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / ADAPTER_WEIGHTS
    save_file(tensors, str(weights), metadata={"format": "pt"})
    cfg_path = out / ADAPTER_CONFIG
    written = peft_base_model(base_model)
    cfg_path.write_text(
        json.dumps(peft_adapter_config(lora, base_model=written), indent=2, sort_keys=True) + "\n"
    )
    note = out / BASE_NOTE
    if written != base_model:
        note.write_text(json.dumps({"alias": base_model, "hf_id": written}, indent=2) + "\n")
        return [weights, cfg_path, note]
    note.unlink(missing_ok=True)  # a stale note from an earlier export to this directory
    return [weights, cfg_path]


class PeftAdapter(NamedTuple):
    """A PEFT LoRA adapter read from disk.

    Attributes:
      path: its directory. base_model: ``base_model_name_or_path`` (None when absent), or
        the model alias :data:`BASE_NOTE` records for it (what the adapter was trained on).
      scale: α / r (α / √r with ``use_rslora``).
      weights: transformers module name (``model.layers.0.self_attn.q_proj``) ->
        ``(lora_A [r, in], lora_B [out, r])`` float32.
    """

    path: Path
    base_model: str | None
    scale: float
    weights: dict[str, tuple[np.ndarray, np.ndarray]]


# adapter_config.json settings whose non-default value changes what the weights mean.
_UNSUPPORTED = {
    "use_dora": (False, None),
    "fan_in_fan_out": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "modules_to_save": (None, []),
    "trainable_token_indices": (None, {}),
    "layer_replication": (None,),
    "target_parameters": (None, []),
}


def _read_adapter_config(path: Path) -> dict[str, Any]:
    cfg_file = path / ADAPTER_CONFIG
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{cfg_file}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object")
    if cfg.get("peft_type") != "LORA":
        raise ModelLoadError(
            f"{cfg_file}: peft_type {cfg.get('peft_type')!r}; only LoRA adapters ('LORA') load"
        )
    for key, allowed in _UNSUPPORTED.items():
        if key in cfg and cfg[key] not in allowed:
            raise ModelLoadError(
                f"{cfg_file}: {key}={cfg[key]!r} is not supported (plain LoRA only; allowed "
                f"{allowed[0]!r}); merge the adapter with peft's merge_and_unload instead"
            )
    for key in ("r", "lora_alpha"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ModelLoadError(f"{cfg_file}: {key} must be a number > 0, got {v!r}")
    return cfg


def read_peft_adapter(path: str | os.PathLike) -> PeftAdapter:
    """Read a PEFT LoRA adapter directory (``adapter_config.json`` +
    ``adapter_model.safetensors``).

    Raises:
      ModelLoadError: not a LoRA adapter, a setting that changes the weights' meaning (DoRA,
        bias, per-module ranks, ``modules_to_save``, ``fan_in_fan_out``), missing weights,
        unknown tensor names or mismatched A / B shapes, each naming the file.
    """
    from safetensors.numpy import load_file

    d = Path(path)
    cfg = _read_adapter_config(d)
    weights_file = d / ADAPTER_WEIGHTS
    if not weights_file.is_file():
        hint = (
            " (adapter_model.bin is pickle and is never read)"
            if (d / "adapter_model.bin").is_file()
            else ""
        )
        raise ModelLoadError(f"{d}: no {ADAPTER_WEIGHTS}{hint}")
    try:
        raw = load_file(str(weights_file))
    except Exception as e:  # SafetensorError, OSError
        raise ModelLoadError(f"{weights_file}: not a readable safetensors file ({e})") from None
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    halves: dict[str, dict[str, np.ndarray]] = {}
    for key, value in raw.items():
        m = _KEY.match(key.removeprefix(_PREFIX))
        if m is None:
            raise ModelLoadError(
                f"{weights_file}: unexpected tensor {key!r} (only lora_A / lora_B weights of "
                f"linear layers are supported)"
            )
        halves.setdefault(m["module"], {})[m["which"]] = np.asarray(value, np.float32)
    if not halves:
        raise ModelLoadError(f"{weights_file}: holds no LoRA weights")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for module, ab in sorted(halves.items()):
        if set(ab) != {"A", "B"}:
            raise ModelLoadError(f"{weights_file}: {module} has lora_{''.join(ab)} only")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise ModelLoadError(
                f"{weights_file}: {module}: lora_A {a.shape} and lora_B {b.shape} are not "
                f"[r, in] and [out, r]"
            )
        out[module] = (a, b)
    base = cfg.get("base_model_name_or_path")
    alias = _noted_alias(d, base)
    return PeftAdapter(d, alias or (str(base) if base else None), float(scale), out)


def _noted_alias(d: Path, base: Any) -> str | None:
    """The model alias :data:`BASE_NOTE` records for hub id ``base`` (the weights the adapter
    was trained on), when the note is there, agrees and names a known alias."""
    from jaxrl_llm.interop.aliases import MODEL_ALIASES

    try:
        note = json.loads((d / BASE_NOTE).read_text())
    except (OSError, ValueError):
        return None
    alias = note.get("alias") if isinstance(note, dict) else None
    if alias in MODEL_ALIASES and note.get("hf_id") == base:
        return str(alias)
    return None


def merge_peft_adapter(
    state_dict: Mapping[str, Any], adapter: PeftAdapter, *, source: str = "base model"
) -> dict[str, Any]:
    """A copy of a transformers state dict with each adapted weight replaced by
    ``W + scale · B A`` (computed in float32, stored in W's dtype).

    Raises:
      ModelLoadError: an adapted module has no weight in the base, or its shape differs from
        ``[out, in]`` of the adapter (an adapter trained on another model).
    """
    sd = dict(state_dict)
    for module, (a, b) in adapter.weights.items():
        name = f"{module}.weight"
        if name not in sd:
            raise ModelLoadError(
                f"{adapter.path}: adapts {module}, which {source} does not have (an adapter "
                f"for another model?)"
            )
        w = np.asarray(sd[name])
        if w.shape != (b.shape[0], a.shape[1]):
            raise ModelLoadError(
                f"{adapter.path}: {module} is {tuple(w.shape)} in {source}, but the adapter "
                f"expects {(b.shape[0], a.shape[1])} (an adapter for another model?)"
            )
        sd[name] = (w.astype(np.float32) + adapter.scale * (b @ a)).astype(w.dtype)
    return sd

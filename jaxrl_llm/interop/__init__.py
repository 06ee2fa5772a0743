"""Hugging Face / GGUF import and Hugging Face export for the Llama-family model.

Import: :func:`load_model` takes a local Hugging Face directory (safetensors only), a GGUF file
(de-quantised through transformers and cached on disk), a model alias such as
``"smollm2-135m-instruct"``, or a transformers model object, and returns
``LoadedModel(config, params, tokenizer)``; a PEFT LoRA adapter directory loads merged onto its
base (:mod:`jaxrl_llm.interop.peft`), and :func:`export_peft_adapter` writes one. A
vision-language directory loads with its vision tower through :func:`load_vision_model` and is
written back by :func:`export_vision_hf` (:mod:`jaxrl_llm.interop.vision`). Export: :func:`export_hf` writes a directory that
``transformers`` loads with no missing or unexpected keys and identical logits.
"""

from jaxrl_llm.interop.aliases import MODEL_ALIASES, cache_dir, resolve_alias
from jaxrl_llm.interop.export import export_hf
from jaxrl_llm.interop.from_hf import LoadedModel, from_hf_model
from jaxrl_llm.interop.gguf import cached_gguf_dir
from jaxrl_llm.interop.hf_config import config_from_hf_dict, hf_config_dict, model_config_from_hf
from jaxrl_llm.interop.hub import hub_cache_dir, hub_offline, hub_snapshot, is_hub_id
from jaxrl_llm.interop.load import (
    load_hf_dir,
    load_model,
    load_peft_dir,
    peft_base_dir,
)
from jaxrl_llm.interop.peft import (
    PeftAdapter,
    export_peft_adapter,
    is_peft_adapter,
    merge_peft_adapter,
    read_peft_adapter,
)
from jaxrl_llm.interop.state_dict import params_from_hf_state_dict, params_to_hf_state_dict
from jaxrl_llm.interop.vision import VisionLanguageModel, export_vision_hf, load_vision_model
from jaxrl_llm.interop.weight_checks import check_weights

__all__ = [
    "MODEL_ALIASES",
    "LoadedModel",
    "PeftAdapter",
    "VisionLanguageModel",
    "cache_dir",
    "cached_gguf_dir",
    "check_weights",
    "config_from_hf_dict",
    "export_hf",
    "export_peft_adapter",
    "export_vision_hf",
    "from_hf_model",
    "hf_config_dict",
    "hub_cache_dir",
    "hub_offline",
    "hub_snapshot",
    "is_hub_id",
    "is_peft_adapter",
    "load_hf_dir",
    "load_model",
    "model_config_from_hf",
    "load_peft_dir",
    "load_vision_model",
    "merge_peft_adapter",
    "peft_base_dir",
    "read_peft_adapter",
    "params_from_hf_state_dict",
    "params_to_hf_state_dict",
    "resolve_alias",
]

"""Every model family, each as one :class:`FamilyEntry` built from its folder
(:mod:`jaxrl_llm.models.families`): what the shared import, export and config code asks a family
instead of comparing its name. :data:`FAMILIES` is the one table (one entry per
:class:`~jaxrl_llm.models.Family` member); nothing outside it, :mod:`.facts` and the family's own
folder names the family."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_llm.models.families.gemma import chat as gemma_chat
from jaxrl_llm.models.families.gemma import hf_config as gemma_hf
from jaxrl_llm.models.families.gemma import vision_config as gemma_vision
from jaxrl_llm.models.families.gemma import vision_weights as gemma_vision_weights
from jaxrl_llm.models.families.gemma4 import hf_config as gemma4_hf
from jaxrl_llm.models.families.gemma4 import weights as gemma4_weights
from jaxrl_llm.models.families.gpt_oss import hf_config as gpt_oss_hf
from jaxrl_llm.models.families.gpt_oss import weights as gpt_oss_weights
from jaxrl_llm.models.families.llama import hf_config as llama_hf
from jaxrl_llm.models.families.llama_moe import hf_config as llama_moe_hf
from jaxrl_llm.models.families.llama_moe import weights as llama_moe_weights
from jaxrl_llm.models.families.qwen3_5 import hf_config as qwen3_5_hf
from jaxrl_llm.models.families.qwen3_5 import weights as qwen3_5_weights
from jaxrl_llm.models.options import Family


@dataclasses.dataclass(frozen=True)
class VisionEntry:
    """A multimodal family's vision part: what import and export ask it.

    Attributes:
      architecture: transformers' conditional-generation class export names.
      config_from_hf: (the multimodal ``config.json`` dict, the text width D) -> the family's
        vision config; ValueError on a feature we do not implement.
      config_to_hf: vision config -> the multimodal config's keys beside ``text_config``.
      hf_names: state dict -> the same under the names ``weights_from_hf`` reads (older
        checkpoints' spellings renamed).
      weights_from_hf: ``(take, vision config)`` -> ``params["vision"]``, reading through the
        importer's checked ``take(name, shape)``.
      weights_to_hf: ``(params["vision"], vision config)`` -> transformers name -> array.
      prefixes: the name prefixes of every vision tensor of a checkpoint.
    """

    architecture: str
    config_from_hf: Callable[[Mapping[str, Any], int], Any]
    config_to_hf: Callable[[Any], dict[str, Any]]
    hf_names: Callable[[Mapping[str, Any]], dict[str, Any]]
    weights_from_hf: Callable[..., dict[str, dict[str, Any]]]
    weights_to_hf: Callable[..., dict[str, Any]]
    prefixes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FamilyEntry:
    """One family's answers to the shared code.

    Attributes:
      family: the :class:`~jaxrl_llm.models.Family` (transformers' ``model_type``).
      fields_from_hf: ``config.json`` dict -> the family's own ModelConfig fields (the shared
        ones are :func:`jaxrl_llm.interop.model_config_from_hf`'s); ValueError on a feature
        we do not implement.
      hf_config_class: the name of transformers' config class export builds.
      hf_architectures: (causal LM, sequence classifier): transformers' architecture names
        export writes.
      hf_config_kwargs: ModelConfig -> that class's keywords beyond the shared ones;
        ValueError when transformers cannot express the config.
      layer_weights: the ``(module, leaf)`` pairs of ``params["layers"]`` the family maps
        itself (the shared mapping skips them); a config's params tree may lack some (a dense
        Qwen3.5 has no shared expert).
      weights_from_hf: ``(take, state_dict, config)`` -> ``{module: {leaf: [L, ...]}}``;
        None when the family has no layer tensors of its own (Gemma 2 / 3).
      weights_to_hf: ``(stacked layers, config)`` -> transformers name -> array; None with
        ``weights_from_hf``.
      expert_names: (block prefix, gate, up, down) of the per-expert checkpoint names the
        shared expert mapping (:mod:`jaxrl_llm.interop.state_dict_moe`) reads and writes, for a
        family with experts that does not map them itself; None otherwise.
      check_hf: ``config.json`` dict -> the dict to read, after the checks of features the
        shared layer does not implement that :func:`jaxrl_llm.interop.config_from_hf_dict`
        runs before the mapping (the Llama layout's: the activation, MLP biases, mixed layer
        types, a classifier's labels); ValueError naming the key. None: the family's
        ``fields_from_hf`` checks its own.
      multimodal_model_type: the ``model_type`` of transformers' multimodal model whose
        ``text_config`` is this family's (import reads its text part), if any.
      chat_template: the chat template a tokenizer of this family without one gets, if any;
      end_of_turn: the token that then ends a chat reply (a stop token of the config).
      tool_call_format: how the family's chat models write a tool call, a
        :data:`jaxrl_llm.envs.tools.CALL_FORMATS` name (``hermes``: Qwen / Hermes JSON in
        ``<tool_call>`` tags, the default; ``gemma4``; ``harmony``: gpt-oss).
      vision: the family's vision tower and projector (:class:`VisionEntry`), if we
        implement them.
    """

    family: Family
    fields_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]]
    hf_config_class: str
    hf_config_kwargs: Callable[[Any], dict[str, Any]]
    hf_architectures: tuple[str, str]
    layer_weights: frozenset[tuple[str, str]] = frozenset()
    weights_from_hf: Callable[..., dict[str, dict[str, Any]]] | None = None
    weights_to_hf: Callable[..., dict[str, Any]] | None = None
    expert_names: tuple[str, str, str, str] | None = None
    check_hf: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    multimodal_model_type: str | None = None
    chat_template: str | None = None
    end_of_turn: str | None = None
    tool_call_format: str = "hermes"
    vision: VisionEntry | None = None


FAMILIES: dict[Family, FamilyEntry] = {
    **{
        f: FamilyEntry(
            family=f,
            fields_from_hf=llama_hf.FIELDS_FROM_HF[f],
            hf_config_class=llama_hf.HF_CONFIG_CLASSES[f],
            hf_config_kwargs=llama_hf.hf_config_kwargs,
            hf_architectures=llama_hf.HF_ARCHITECTURES[f],
            check_hf=llama_hf.check_hf,
        )
        for f in (Family.LLAMA, Family.MISTRAL, Family.QWEN2, Family.QWEN3)
    },
    **{
        f: FamilyEntry(
            family=f,
            fields_from_hf=llama_moe_hf.FIELDS_FROM_HF[f],
            hf_config_class=llama_moe_hf.HF_CONFIG_CLASSES[f],
            hf_config_kwargs=llama_moe_hf.hf_config_kwargs,
            hf_architectures=llama_moe_hf.HF_ARCHITECTURES[f],
            expert_names=llama_moe_weights.EXPERT_NAMES[f],
            check_hf=llama_hf.check_hf,
        )
        for f in (Family.QWEN3_MOE, Family.MIXTRAL)
    },
    Family.GEMMA2: FamilyEntry(
        family=Family.GEMMA2,
        fields_from_hf=gemma_hf.gemma2_fields_from_hf,
        hf_config_class=gemma_hf.HF_CONFIG_CLASSES[Family.GEMMA2],
        hf_config_kwargs=gemma_hf.hf_config_kwargs,
        hf_architectures=gemma_hf.HF_ARCHITECTURES[Family.GEMMA2],
        chat_template=gemma_chat.CHAT_TEMPLATE,
        end_of_turn=gemma_chat.END_OF_TURN,
    ),
    Family.GEMMA3: FamilyEntry(
        family=Family.GEMMA3,
        fields_from_hf=gemma_hf.gemma3_fields_from_hf,
        hf_config_class=gemma_hf.HF_CONFIG_CLASSES[Family.GEMMA3],
        hf_config_kwargs=gemma_hf.hf_config_kwargs,
        hf_architectures=gemma_hf.HF_ARCHITECTURES[Family.GEMMA3],
        multimodal_model_type=gemma_hf.MULTIMODAL_MODEL_TYPE,
        chat_template=gemma_chat.CHAT_TEMPLATE,
        end_of_turn=gemma_chat.END_OF_TURN,
        vision=VisionEntry(
            architecture=gemma_hf.MULTIMODAL_ARCHITECTURE,
            config_from_hf=gemma_vision.vision_config_from_hf,
            config_to_hf=gemma_vision.vision_config_to_hf,
            hf_names=gemma_vision_weights.hf_vision_names,
            weights_from_hf=gemma_vision_weights.vision_weights_from_hf,
            weights_to_hf=gemma_vision_weights.vision_weights_to_hf,
            prefixes=gemma_vision_weights.VISION_PREFIXES,
        ),
    ),
    Family.GPT_OSS: FamilyEntry(
        family=Family.GPT_OSS,
        fields_from_hf=gpt_oss_hf.fields_from_hf,
        hf_config_class=gpt_oss_hf.HF_CONFIG_CLASS,
        hf_config_kwargs=gpt_oss_hf.hf_config_kwargs,
        hf_architectures=gpt_oss_hf.HF_ARCHITECTURES,
        layer_weights=gpt_oss_weights.LAYER_WEIGHTS,
        weights_from_hf=gpt_oss_weights.weights_from_hf,
        weights_to_hf=gpt_oss_weights.weights_to_hf,
        tool_call_format="harmony",
    ),
    Family.GEMMA4: FamilyEntry(
        family=Family.GEMMA4,
        fields_from_hf=gemma4_hf.fields_from_hf,
        hf_config_class=gemma4_hf.HF_CONFIG_CLASS,
        hf_config_kwargs=gemma4_hf.hf_config_kwargs,
        hf_architectures=gemma4_hf.HF_ARCHITECTURES,
        layer_weights=gemma4_weights.LAYER_WEIGHTS,
        weights_from_hf=gemma4_weights.weights_from_hf,
        weights_to_hf=gemma4_weights.weights_to_hf,
        multimodal_model_type=gemma4_hf.MULTIMODAL_MODEL_TYPE,
        tool_call_format="gemma4",
    ),
    Family.QWEN3_5: FamilyEntry(
        family=Family.QWEN3_5,
        fields_from_hf=qwen3_5_hf.dense_fields_from_hf,
        hf_config_class=qwen3_5_hf.HF_CONFIG_CLASSES[Family.QWEN3_5],
        hf_config_kwargs=qwen3_5_hf.hf_config_kwargs,
        hf_architectures=qwen3_5_hf.HF_ARCHITECTURES[Family.QWEN3_5],
        layer_weights=qwen3_5_weights.LAYER_WEIGHTS,
        weights_from_hf=qwen3_5_weights.weights_from_hf,
        weights_to_hf=qwen3_5_weights.weights_to_hf,
        multimodal_model_type=qwen3_5_hf.MULTIMODAL_MODEL_TYPES[Family.QWEN3_5],
    ),
    Family.QWEN3_5_MOE: FamilyEntry(
        family=Family.QWEN3_5_MOE,
        fields_from_hf=qwen3_5_hf.moe_fields_from_hf,
        hf_config_class=qwen3_5_hf.HF_CONFIG_CLASSES[Family.QWEN3_5_MOE],
        hf_config_kwargs=qwen3_5_hf.hf_config_kwargs,
        hf_architectures=qwen3_5_hf.HF_ARCHITECTURES[Family.QWEN3_5_MOE],
        expert_names=qwen3_5_weights.EXPERT_NAMES,
        layer_weights=qwen3_5_weights.LAYER_WEIGHTS,
        weights_from_hf=qwen3_5_weights.weights_from_hf,
        weights_to_hf=qwen3_5_weights.weights_to_hf,
        multimodal_model_type=qwen3_5_hf.MULTIMODAL_MODEL_TYPES[Family.QWEN3_5_MOE],
    ),
}

#: transformers' architecture names per family: (causal LM, sequence classifier), what export
#: writes (:attr:`FamilyEntry.hf_architectures`).
HF_ARCHITECTURES: dict[Family, tuple[str, str]] = {
    f: e.hf_architectures for f, e in FAMILIES.items()
}

#: transformers' multimodal ``model_type`` -> the family of its text part.
MULTIMODAL_TEXT: dict[str, Family] = {
    e.multimodal_model_type: e.family for e in FAMILIES.values() if e.multimodal_model_type
}


def family_entry(family: Family | str) -> FamilyEntry | None:
    """The :class:`FamilyEntry` of ``family`` (a :class:`~jaxrl_llm.models.Family` or its
    ``model_type``, or the multimodal ``model_type`` of its text part), or None for a
    ``model_type`` that is no family of ours."""
    if isinstance(family, str) and family in MULTIMODAL_TEXT:
        family = MULTIMODAL_TEXT[family]
    try:
        return FAMILIES.get(Family(family))
    except ValueError:
        return None


def entry_of(family: Family | str) -> FamilyEntry:
    """The :class:`FamilyEntry` of ``family`` (a :class:`~jaxrl_llm.models.Family` or its
    ``model_type``); every family has one.

    Raises:
      ValueError: ``family`` is no family of ours.
    """
    return FAMILIES[Family(family)]

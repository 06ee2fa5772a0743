"""Qwen3-MoE and Mixtral's part of the config mapping, both ways: the ModelConfig fields of
their transformers config dicts beyond the keys every family shares (:func:`fields_from_hf`:
the Llama layout's and the experts'), and the keywords of ``Qwen3MoeConfig`` /
``MixtralConfig`` export passes (:func:`hf_config_kwargs`), asked through
:mod:`jaxrl_llm.models.families.registry`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Family, ModelConfig
from jaxrl_llm.models.families.llama import hf_config as llama_hf

#: transformers' config classes export builds, per family.
HF_CONFIG_CLASSES = {Family.QWEN3_MOE: "Qwen3MoeConfig", Family.MIXTRAL: "MixtralConfig"}
#: (causal LM, sequence classifier): transformers' architecture names, per family.
HF_ARCHITECTURES = {
    Family.QWEN3_MOE: ("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"),
    Family.MIXTRAL: ("MixtralForCausalLM", "MixtralForSequenceClassification"),
}


def moe_fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The expert fields of a Qwen3-MoE / Mixtral transformers config dict.

    Raises:
      ValueError: a Qwen3-MoE config that mixes dense and sparse layers (``decoder_sparse_step``
        ≠ 1 or ``mlp_only_layers``), or Mixtral's ``router_jitter_noise`` > 0 (training-time
        multiplicative noise on the router input, not implemented).
    """
    if family == Family.QWEN3_MOE:
        step = int(d.get("decoder_sparse_step") or 1)
        dense = list(d.get("mlp_only_layers") or [])
        if step != 1 or dense:
            raise ValueError(
                f"Qwen3-MoE with dense layers (decoder_sparse_step={step}, "
                f"mlp_only_layers={dense}) is not supported: every layer must be sparse "
                f"(decoder_sparse_step=1, mlp_only_layers=[])"
            )
        return dict(
            # config.json says num_experts; transformers >= 5's to_dict num_local_experts.
            num_experts=int(d["num_experts"] if "num_experts" in d else d["num_local_experts"]),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )
    if family == Family.MIXTRAL:
        jitter = float(d.get("router_jitter_noise") or 0.0)
        if jitter > 0:
            raise ValueError(
                f"Mixtral router_jitter_noise={jitter} is not supported (only 0.0, the "
                f"released models' value)"
            )
        return dict(
            num_experts=int(d["num_local_experts"]),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["intermediate_size"]),
            norm_topk_prob=True,
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )
    raise ValueError(f"{family.value} is not a mixture-of-experts family")


def fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The Llama layout's family fields (:func:`..llama.hf_config.fields_from_hf`) and the
    experts' (:func:`moe_fields_from_hf`) of a Qwen3-MoE / Mixtral config dict."""
    return {**llama_hf.fields_from_hf(d, family), **moe_fields_from_hf(d, family)}


def moe_hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The MoE keywords of transformers' ``Qwen3MoeConfig`` / ``MixtralConfig`` for ``config``.

    Raises:
      ValueError: a Mixtral config without ``norm_topk_prob`` (transformers' Mixtral always
        renormalises) or whose expert width differs from ``intermediate_size``.
    """
    c = config
    if c.family == Family.QWEN3_MOE:
        return dict(
            num_experts=c.moe.num_experts,
            num_experts_per_tok=c.moe.num_experts_per_tok,
            moe_intermediate_size=c.moe.intermediate_size,
            norm_topk_prob=c.moe.norm_topk_prob,
            router_aux_loss_coef=c.moe.router_aux_loss_coef,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if c.family == Family.MIXTRAL:
        if not c.moe.norm_topk_prob:
            raise ValueError("transformers' Mixtral always renormalises the top-k weights")
        if c.moe.intermediate_size != c.mlp.intermediate_size:
            raise ValueError(
                f"Mixtral's experts have width intermediate_size={c.mlp.intermediate_size}, "
                f"this config has moe_intermediate_size={c.moe.intermediate_size}"
            )
        return dict(
            num_local_experts=c.moe.num_experts,
            num_experts_per_tok=c.moe.num_experts_per_tok,
            router_aux_loss_coef=c.moe.router_aux_loss_coef,
            router_jitter_noise=0.0,
        )
    raise ValueError(f"{c.family.value} is not a mixture-of-experts family")


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of ``Qwen3MoeConfig`` / ``MixtralConfig`` for ``config`` beyond the shared
    ones: the experts' (:func:`moe_hf_config_kwargs`, checked first) and the Llama layout's
    (:func:`..llama.hf_config.layout_hf_config_kwargs`).

    Raises:
      ValueError: what either refuses.
    """
    experts = moe_hf_config_kwargs(config)
    return {**llama_hf.layout_hf_config_kwargs(config), **experts}


#: Family -> :func:`fields_from_hf` of its config dicts (the registry's entries).
FIELDS_FROM_HF = {f: functools.partial(fields_from_hf, family=f) for f in HF_CONFIG_CLASSES}

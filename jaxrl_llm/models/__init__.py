"""Llama-family decoder transformers as pure functions over a parameter dict, with an
explicit KV cache and an optional scalar head. Knows nothing about RL."""

from jaxrl_llm.models.attention import AttentionMask
from jaxrl_llm.models.attention import NAIVE_MAX_SCORES
from jaxrl_llm.models.attention import blockwise_attention
from jaxrl_llm.models.attention import causal_self_mask
from jaxrl_llm.models.attention import cudnn_attention
from jaxrl_llm.models.attention import dot_product_attention
from jaxrl_llm.models.attention import naive_attention
from jaxrl_llm.models.attention import select_attention_impl
from jaxrl_llm.models.attention import splash_attention
from jaxrl_llm.models.config import AttentionImpl
from jaxrl_llm.models.config import Family
from jaxrl_llm.models.config import HF_ARCHITECTURES
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.config import RopeScaling
from jaxrl_llm.models.config import dtype_from_name
from jaxrl_llm.models.lora import LoRAConfig
from jaxrl_llm.models.lora import attach_lora
from jaxrl_llm.models.lora import init_lora
from jaxrl_llm.models.lora import merge_lora
from jaxrl_llm.models.transformer import KVCache
from jaxrl_llm.models.transformer import ModelOutputs
from jaxrl_llm.models.transformer import apply
from jaxrl_llm.models.transformer import default_positions
from jaxrl_llm.models.transformer import forward
from jaxrl_llm.models.transformer import init_cache
from jaxrl_llm.models.transformer import init_params
from jaxrl_llm.models.transformer import logits_from_hidden
from jaxrl_llm.models.transformer import param_logical_axes
from jaxrl_llm.models.transformer import param_shapes_and_axes
from jaxrl_llm.models.transformer import scalar_head
from jaxrl_llm.models.transformer import trunk
from jaxrl_llm.models.transformer import trunk_shared_prefix
from jaxrl_llm.models.transformer import unembedding

__all__ = [
    "AttentionImpl",
    "AttentionMask",
    "Family",
    "HF_ARCHITECTURES",
    "KVCache",
    "NAIVE_MAX_SCORES",
    "LoRAConfig",
    "ModelConfig",
    "ModelOutputs",
    "RopeScaling",
    "apply",
    "attach_lora",
    "blockwise_attention",
    "causal_self_mask",
    "cudnn_attention",
    "default_positions",
    "dot_product_attention",
    "dtype_from_name",
    "forward",
    "init_cache",
    "init_lora",
    "init_params",
    "logits_from_hidden",
    "merge_lora",
    "naive_attention",
    "param_logical_axes",
    "param_shapes_and_axes",
    "scalar_head",
    "select_attention_impl",
    "splash_attention",
    "trunk",
    "trunk_shared_prefix",
    "unembedding",
]

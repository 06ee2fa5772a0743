"""What every family's part of the config mapping (:mod:`jaxrl_llm.interop.hf_config` and the
families' ``hf_config`` modules, :mod:`jaxrl_llm.models.families`) writes alike: the
``config.json`` keys all families share, the dict a transformers config object becomes, and
the architecture names (the family's entry's)."""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.config import Family, ModelConfig
from jaxrl_llm.models.families.registry import entry_of


def shared_hf_fields(c: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` keys every family's transformers config takes alike: sizes, norm
    epsilon, tied embeddings and the special token ids (one eos id as an int, several as a
    list)."""
    eos = list(c.tokens.eos_ids)
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.attn.num_heads,
        num_key_value_heads=c.attn.num_kv_heads,
        head_dim=c.attn.head_dim,
        max_position_embeddings=c.rope.max_position_embeddings,
        rms_norm_eps=c.norms.eps,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=c.tokens.bos_id,
        pad_token_id=c.tokens.pad_id,
        eos_token_id=None if not eos else eos[0] if len(eos) == 1 else eos,
    )


def config_json(hf: Any, config: ModelConfig, architecture: str, dtype: str | None):
    """The ``config.json`` dict of a transformers config object built for ``config``: its
    ``to_dict()`` without quantization or a source path, with the architecture, model type and
    stored dtype."""
    d = hf.to_dict()
    d.pop("quantization_config", None)
    d.pop("_name_or_path", None)
    d["architectures"] = [architecture]
    d["model_type"] = config.family.value
    d["torch_dtype"] = dtype or config.param_dtype
    if "dtype" in d:
        d["dtype"] = dtype or config.param_dtype
    return d


def hf_architectures(family: Family) -> tuple[str, str]:
    """(causal LM, sequence classifier): transformers' architecture names of ``family``."""
    return entry_of(family).hf_architectures

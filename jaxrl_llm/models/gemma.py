"""Gemma 2 and Gemma 3 (text) as :class:`~jaxrl_llm.models.ModelConfig` values.

The decoder in :mod:`jaxrl_llm.models.transformer` runs Gemma through config fields whose
defaults are the Llama behaviour; this module says which values make a Gemma:

- Gemma 2 (Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size", 2024,
  https://arxiv.org/abs/2408.00118): local (sliding window 4096) and global layers alternate,
  RMSNorm before *and after* attention and the MLP ("pre-norm and post-norm", §2), GeGLU with
  the tanh GELU, logit soft-capping ``cap · tanh(x / cap)`` on the attention scores (cap 50)
  and the final logits (cap 30), the embedding multiplied by √D, tied embeddings, scores
  scaled by ``query_pre_attn_scalar^-1/2``.
- Gemma 3 (Gemma Team, "Gemma 3 Technical Report", 2025, https://arxiv.org/abs/2503.19786,
  §2): five local layers (window 512 or 1024) per global layer, the soft-capping replaced by
  q/k RMSNorm, RoPE base 10k on local and 1M on global layers (with linear scaling ×8 on
  global layers for the long-context models).

RMSNorm in both is ``x / rms(x) · (1 + w)`` computed in float32 (weights stored as w, initialised
at zero), which :func:`jaxrl_llm.models.transformer.rms_norm` does with ``unit_offset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Activation, Family, LayerType, RopeScaling

_LOCAL, _GLOBAL = LayerType.LOCAL, LayerType.GLOBAL


def pattern_layer_types(num_layers: int, period: int) -> tuple[LayerType, ...]:
    """``period − 1`` LOCAL layers then one GLOBAL layer, repeated (transformers' default
    ``layer_types`` for Gemma 3 with period 6 and Gemma 2 with period 2)."""
    return tuple(_GLOBAL if (i + 1) % period == 0 else _LOCAL for i in range(num_layers))


def _common(family: Family) -> dict[str, Any]:
    """The fields every Gemma 2 / Gemma 3 model shares."""
    return dict(
        family=family,
        rms_norm_unit_offset=True,
        post_norms=True,
        mlp_activation=Activation.GELU_TANH,
        scale_embeddings=True,
        tie_embeddings=True,
        qk_norm=family == Family.GEMMA3,
    )


def tiny_fields(family: Family) -> dict[str, Any]:
    """ModelConfig fields of a tiny random Gemma 2 / Gemma 3 for unit tests: odd distinct sizes,
    3 layers so that both layer types occur, window 4, a query scalar ≠ head_dim and, for
    Gemma 2, the soft caps."""
    family = Family(family)
    fields: dict[str, Any] = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=3,
        num_heads=3,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        sliding_window=4,
        query_pre_attn_scalar=24.0,
        **_common(family),
    )
    if family == Family.GEMMA2:
        fields.update(
            layer_types=pattern_layer_types(3, 2), attn_logit_softcap=50.0, final_logit_softcap=30.0
        )
    else:
        fields.update(layer_types=pattern_layer_types(3, 2), rope_theta=1e6, rope_local_theta=1e4)
    return fields


def gemma3_270m_fields() -> dict[str, Any]:
    """ModelConfig fields of Gemma 3 270M (google/gemma-3-270m, and the Q4_K_M GGUF of the
    ``gemma3-270m`` alias): 18 layers, five local (window 512) per global, D=640, F=2048,
    4 heads / 1 KV head of E=256, V=262144, RoPE 1M global / 10k local."""
    return dict(
        **_common(Family.GEMMA3),
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_layers=18,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        sliding_window=512,
        layer_types=pattern_layer_types(18, 6),
        query_pre_attn_scalar=256.0,
        bos_token_id=2,
        eos_token_ids=(1, 106),
        pad_token_id=0,
    )


def _rope_fields(rope: Mapping[str, Any] | None, prefix: str) -> dict[str, Any]:
    """RoPE fields from one transformers rope-parameters dict (``rope_type``, ``factor``)."""
    rope = rope or {}
    kind = RopeScaling(rope.get("rope_type", rope.get("type", "default")))
    if kind not in (RopeScaling.NONE, RopeScaling.LINEAR):
        raise ValueError(f"unsupported {prefix} rope scaling {kind.value!r} for a Gemma model")
    return dict(rope_scaling=kind, rope_factor=float(rope.get("factor", 1.0)))


def fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The Gemma-specific ModelConfig fields of a transformers ``Gemma2Config`` /
    ``Gemma3TextConfig`` dict (``to_dict()`` or ``config.json``), read on top of the fields
    every family shares.

    Raises ValueError for what we do not implement (bidirectional attention, a non-default
    RoPE on local layers, an activation other than tanh-GELU).
    """
    family = Family(family)
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma hidden_activation {act!r}")
    if d.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=true (EmbeddingGemma) is not supported")
    n = int(d["num_hidden_layers"])
    period = 2 if family == Family.GEMMA2 else int(d.get("sliding_window_pattern", 6))
    types = tuple(LayerType(t) for t in (d.get("layer_types") or ())) or pattern_layer_types(
        n, period
    )
    out: dict[str, Any] = _common(family)
    out.update(
        layer_types=types,
        sliding_window=d.get("sliding_window"),
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or d["head_dim"]),
        attn_logit_softcap=d.get("attn_logit_softcapping"),
        final_logit_softcap=d.get("final_logit_softcapping"),
        tie_embeddings=bool(d.get("tie_word_embeddings", True)),
    )
    rope = d.get("rope_parameters") or {}
    if family == Family.GEMMA3 and _GLOBAL.value in rope:  # one dict per layer type
        glob, loc = rope[_GLOBAL.value] or {}, rope.get(_LOCAL.value) or {}
        if _rope_fields(loc, "local")["rope_scaling"] != RopeScaling.NONE:
            raise ValueError("a scaled RoPE on Gemma 3 local layers is not supported")
        out.update(_rope_fields(glob, "global"))
        out["rope_theta"] = float(glob.get("rope_theta", 1_000_000.0))
        out["rope_local_theta"] = float(loc.get("rope_theta", 10_000.0))
    else:  # Gemma 2, or an older Gemma 3 config.json (rope_theta, rope_local_base_freq)
        out.update(_rope_fields(d.get("rope_scaling") or rope, "global"))
        out["rope_theta"] = float(d.get("rope_theta") or rope.get("rope_theta") or 10_000.0)
        if family == Family.GEMMA3:
            out["rope_local_theta"] = float(d.get("rope_local_base_freq", 10_000.0))
    return out


def hf_config_kwargs(config: Any) -> dict[str, Any]:
    """Keyword arguments of transformers' ``Gemma2Config`` / ``Gemma3TextConfig`` for the
    Gemma-specific fields of ``config`` (the inverse of :func:`fields_from_hf`).

    Raises ValueError when the config is not expressible in transformers' Gemma (e.g. untied
    or without post-norms).
    """
    c = config
    want = _common(c.family)
    bad = [k for k, v in want.items() if k != "tie_embeddings" and getattr(c, k) != v]
    if bad:
        raise ValueError(f"transformers' {c.family.value} has fixed {bad}; this config differs")
    if c.query_pre_attn_scalar is not None and c.query_pre_attn_scalar % 1:
        raise ValueError(f"query_pre_attn_scalar={c.query_pre_attn_scalar} is not an integer")
    kw: dict[str, Any] = dict(
        hidden_activation=c.mlp_activation.value,
        layer_types=[t.value for t in c.layer_types] or None,
        sliding_window=c.sliding_window,
        # transformers' config type is int; Gemma's scalars are whole numbers.
        query_pre_attn_scalar=int(c.query_pre_attn_scalar or c.head_dim),
        attn_logit_softcapping=c.attn_logit_softcap,
        final_logit_softcapping=c.final_logit_softcap,
    )
    glob: dict[str, Any] = {"rope_type": c.rope_scaling.value, "rope_theta": c.rope_theta}
    if c.rope_scaling == RopeScaling.LINEAR:
        glob["factor"] = c.rope_factor
    elif c.rope_scaling != RopeScaling.NONE:
        raise ValueError(f"Gemma export supports default or linear RoPE, not {c.rope_scaling}")
    if c.family == Family.GEMMA3:
        local = c.rope_theta if c.rope_local_theta is None else c.rope_local_theta
        kw["rope_parameters"] = {
            _GLOBAL.value: glob,
            _LOCAL.value: {"rope_type": "default", "rope_theta": local},
        }
    else:
        if c.rope_local_theta not in (None, c.rope_theta):
            raise ValueError("transformers' Gemma 2 has one RoPE base for all layers")
        kw["rope_parameters"] = glob
    return kw

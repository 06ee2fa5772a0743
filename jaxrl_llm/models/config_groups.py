"""The groups a :class:`~jaxrl_llm.models.config.ModelConfig` is made of, and the table that
maps each of the old flat field names onto them.

Each group is a frozen, keyword-only dataclass that checks what it can check on its own
(``__post_init__``); what needs two groups (a window pattern against the number of layers, the
rotated dims against the head dim) is :class:`~jaxrl_llm.models.config.ModelConfig`'s check.

==========================  ================================================================
group (ModelConfig field)   what it holds
==========================  ================================================================
``attn``                    heads and head dims, the layer pattern, windows, soft-capping,
                            sinks, gates, Gemma 4's GLOBAL-layer geometry and KV sharing, and
                            ``impl`` (how attention is computed)
``rope``                    positions: the RoPE base(s), its scaling scheme and parameters,
                            the rotated fraction
``mlp``                     the dense gated MLP
``moe``                     the sparse mixture of experts (0 experts = none)
``linear``                  Qwen3.5's Gated DeltaNet (linear attention) layers
``norms``                   RMSNorm's ε and flavour, post-norms, Gemma 4's layer scalars
``tokens``                  the token side: special ids, the embedding's scale, Gemma 4's
                            per-layer embeddings, the output logits' soft cap
==========================  ================================================================

:data:`FLAT_NAMES` is the one table from an old flat name (``num_heads``, ``rope_theta``,
``moe_dispatch``, ...) to its ``(group, name)``; ModelConfig's constructor folds flat keywords
through it, and its flat attribute reads (``config.num_heads``) are aliases through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.errors import did_you_mean
from jaxrl_llm.models.options import (
    Activation,
    AttentionImpl,
    LayerType,
    MoeDispatch,
    RopeScaling,
)

__all__ = [
    "FLAT_NAMES",
    "GROUPS",
    "AttentionConfig",
    "LinearAttentionConfig",
    "MlpConfig",
    "MoeConfig",
    "NormConfig",
    "RopeConfig",
    "TokenConfig",
    "build_group",
]


def _positive_or_none(owner: str, **values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"{owner}.{name} must be positive or None, got {value}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AttentionConfig:
    """Softmax attention: heads, the layer pattern, windows and the per-family extras.

    Attributes:
      num_heads (H), num_kv_heads (K, grouped-query attention; H % K == 0), head_dim (E;
        None = hidden_size // H, filled in by ModelConfig).
      bias: q/k/v projections have a bias (Qwen2; flat ``attention_bias``). out_bias: the
        output projection has one too (gpt-oss; flat ``attention_out_bias``).
      qk_norm: per-head RMSNorm on q, k before RoPE (Qwen3).
      sliding_window: Mistral's local window (None = global).
      layer_types: per-layer :class:`LayerType` (Gemma 2/3/4, Qwen3.5's LINEAR layers); empty =
        every layer alike, windowed by ``sliding_window`` if set. LOCAL layers use the window
        and ``rope.local_theta``; GLOBAL layers no window and ``rope.theta``.
      query_pre_attn_scalar: scores are q·k / √s; None = head_dim.
      logit_softcap: Gemma 2's cap·tanh(x / cap) on the scores (flat ``attn_logit_softcap``).
      sinks: a learned logit per query head joins the softmax's denominator (gpt-oss; Xiao et
        al. 2023, https://arxiv.org/abs/2309.17453; flat ``attention_sinks``).
      output_gate: the output is multiplied by σ(h W_gate) per head (Qwen3.5; flat
        ``attn_output_gate``).
      global_head_dim, global_kv_heads: GLOBAL layers' head dim and KV heads (Gemma 4); None =
        ``head_dim`` / ``num_kv_heads``. global_k_eq_v: GLOBAL layers' values are their keys.
      value_norm: a scale-free RMSNorm on each value head (Gemma 4).
      kv_shared_layers: the last n layers attend over the keys/values of the last earlier
        layer of their type (Gemma 4's ``num_kv_shared_layers``); 0 = none.
      impl: :class:`AttentionImpl`, how attention is computed, not what (the old flat
        ``attention``, still a keyword and a read-only alias of ModelConfig, and YAML
        ``model.attention``).
    """

    num_heads: int
    num_kv_heads: int
    # None (the default) becomes hidden_size // num_heads in ModelConfig, so readers see an int.
    head_dim: int = None  # type: ignore[assignment]
    bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()
    query_pre_attn_scalar: float | None = None
    logit_softcap: float | None = None
    sinks: bool = False
    output_gate: bool = False
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    global_k_eq_v: bool = False
    value_norm: bool = False
    kv_shared_layers: int = 0
    impl: AttentionImpl = AttentionImpl.AUTO

    def __post_init__(self):
        object.__setattr__(self, "impl", AttentionImpl(self.impl))
        object.__setattr__(self, "layer_types", tuple(LayerType(t) for t in self.layer_types))
        for name in ("num_heads", "num_kv_heads"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.head_dim is not None and int(self.head_dim) <= 0:
            raise ValueError(f"ModelConfig.head_dim must be positive, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if LayerType.LOCAL in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has LOCAL layers but sliding_window is None")
        if LayerType.LINEAR in self.layer_types and LayerType.LOCAL in self.layer_types:
            raise ValueError("layer_types cannot mix LINEAR and LOCAL layers")
        _positive_or_none(
            "ModelConfig",
            query_pre_attn_scalar=self.query_pre_attn_scalar,
            attn_logit_softcap=self.logit_softcap,
        )
        if self.kv_shared_layers < 0:
            raise ValueError(f"kv_shared_layers must be >= 0, got {self.kv_shared_layers}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RopeConfig:
    """Positions: rotary embeddings (RoPE; Su et al. 2021, https://arxiv.org/abs/2104.09864).

    Attributes:
      max_position_embeddings: the longest sequence the checkpoint was trained for.
      theta: RoPE base. scaling: :class:`RopeScaling`; factor, low_freq_factor,
        high_freq_factor, original_max_position: its parameters (Llama 3).
      beta_fast, beta_slow, truncate, attention_factor: YaRN's (Peng et al. 2023,
        https://arxiv.org/abs/2309.00071): the rotation counts bounding the ramp between
        interpolated and kept frequencies, whether its ends are rounded to whole dims, and the
        factor q and k are multiplied by (None: 0.1 · ln(factor) + 1).
      local_theta: RoPE base of LOCAL layers (Gemma 3's ``rope_local_base_freq``); None = theta.
      partial_rotary_factor: the first ``int(head_dim · factor)`` dims of each head rotate
        (Qwen3.5: 0.25); 1 = all.
      global_proportion: GLOBAL layers rotate only the first ⌊p · E_g / 2⌋ pairs (Gemma 4's
        "proportional" RoPE; flat ``global_rope_proportion``); 1 = all.
    """

    max_position_embeddings: int = 8192
    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling.NONE
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    local_theta: float | None = None
    partial_rotary_factor: float = 1.0
    global_proportion: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "scaling", RopeScaling(self.scaling))
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1]"
            )
        if not 0 < self.global_proportion <= 1:
            raise ValueError(
                f"global_rope_proportion must be in (0, 1], got {self.global_proportion}"
            )
        if self.scaling == RopeScaling.YARN and not (
            self.factor > 0 and self.beta_fast > self.beta_slow > 0
        ):
            raise ValueError(
                f"YaRN needs rope_factor > 0 and rope_beta_fast > rope_beta_slow > 0, got "
                f"{self.factor}, {self.beta_fast}, {self.beta_slow}"
            )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MlpConfig:
    """The dense gated MLP.

    Attributes:
      intermediate_size: F, its hidden width (with ``double_wide``, the wide, stored width).
      activation: :class:`Activation` of the gate (flat ``mlp_activation``).
      swiglu_alpha, swiglu_limit: α and ℓ of :attr:`Activation.CLAMPED_SWIGLU` (gpt-oss).
      double_wide: the KV-shared layers' MLP is twice as wide as the others' (Gemma 4's
        ``use_double_wide_mlp``); the other layers use the first half (flat ``double_wide_mlp``).
    """

    intermediate_size: int
    activation: Activation = Activation.SILU
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    double_wide: bool = False

    def __post_init__(self):
        object.__setattr__(self, "activation", Activation(self.activation))
        if int(self.intermediate_size) <= 0:
            raise ValueError(
                f"ModelConfig.intermediate_size must be positive, got {self.intermediate_size}"
            )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MoeConfig:
    """The sparse mixture-of-experts block (:mod:`jaxrl_llm.models.moe`).

    Attributes:
      num_experts: X > 0 makes every layer's MLP a mixture of X experts (Qwen3-MoE, Mixtral);
        0 = a dense MLP.
      num_experts_per_tok: k, the experts each token is routed to (1 ≤ k ≤ X).
      intermediate_size: F_e, each expert's width; None = the MLP's (filled in by ModelConfig;
        flat ``moe_intermediate_size``).
      norm_topk_prob: renormalise the k routing weights to sum to 1.
      router_aux_loss_coef: the load-balancing loss's coefficient the checkpoint was trained
        with.
      dispatch: :class:`MoeDispatch`, how tokens reach experts (flat ``moe_dispatch``).
      beside_mlp: every layer has the dense MLP *and* the MoE block (Gemma 4's
        ``enable_moe_block``; flat ``moe_beside_mlp``).
      shared_expert_size: F_s > 0 adds a gated shared expert (Qwen3.5-MoE); 0 = none.
      expert_bias: the router and every expert's projections have biases (gpt-oss).
    """

    num_experts: int = 0
    num_experts_per_tok: int = 0
    # None (the default) becomes the MLP's intermediate_size in ModelConfig.
    intermediate_size: int = None  # type: ignore[assignment]
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    dispatch: MoeDispatch = MoeDispatch.SORTED
    beside_mlp: bool = False
    shared_expert_size: int = 0
    expert_bias: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dispatch", MoeDispatch(self.dispatch))
        if self.num_experts < 0:
            raise ValueError(f"num_experts must be >= 0, got {self.num_experts}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.intermediate_size is not None and self.intermediate_size <= 0:
            raise ValueError(
                f"moe_intermediate_size must be positive, got {self.intermediate_size}"
            )
        if self.shared_expert_size < 0 or (self.shared_expert_size and not self.num_experts):
            raise ValueError(
                f"shared_expert_size={self.shared_expert_size} must be >= 0, and > 0 only with "
                f"experts"
            )
        if self.beside_mlp and not self.num_experts:
            raise ValueError("moe_beside_mlp needs num_experts > 0")
        if not self.router_aux_loss_coef >= 0:
            raise ValueError(f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LinearAttentionConfig:
    """Gated DeltaNet layers (the LINEAR entries of ``attention.layer_types``, Qwen3.5;
    :mod:`jaxrl_llm.models.gated_deltanet`; Yang et al. 2024,
    https://arxiv.org/abs/2412.06464). All 0 = no such layers.

    Attributes:
      num_key_heads, num_value_heads: query/key heads H_k and value heads H_v (a multiple of
        H_k). key_head_dim, value_head_dim: their dims. conv_kernel: the causal conv's width W.
      chunk_size: chunk length of the chunked delta rule (how, not what; flat
        ``delta_chunk_size``).
    """

    num_key_heads: int = 0
    num_value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0
    conv_kernel: int = 0
    chunk_size: int = 64

    def __post_init__(self):
        if self.num_key_heads > 0 and self.num_value_heads % self.num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.num_value_heads} must be a multiple of "
                f"linear_num_key_heads={self.num_key_heads}"
            )

    @property
    def conv_channels(self) -> int:
        """Channels C of a layer's conv: queries, keys, values together."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * (
            self.value_head_dim
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NormConfig:
    """RMSNorm and what scales each layer's output.

    Attributes:
      eps: RMSNorm's ε (flat ``rms_norm_eps``).
      unit_offset: RMSNorm scales by (1 + w) in float32 before casting back (Gemma); False = w
        times the normalised input in the activation dtype (Llama; flat
        ``rms_norm_unit_offset``).
      post_norms: RMSNorm on the attention and MLP outputs before each residual add (Gemma 2/3).
      layer_scalars: each layer's output is multiplied by a stored per-layer scalar (Gemma 4;
        no gradient reaches it).
    """

    eps: float = 1e-5
    unit_offset: bool = False
    post_norms: bool = False
    layer_scalars: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TokenConfig:
    """The token side: special ids, the embedding's scale, per-layer embeddings, the logits' cap.

    Attributes:
      bos_id, eos_ids, pad_id: special tokens carried for export/sampling (flat
        ``bos_token_id``, ``eos_token_ids``, ``pad_token_id``).
      scale_embeddings: multiply the embedding by √D in the activation dtype (Gemma).
      final_logit_softcap: cap·tanh(x / cap) on the output logits (Gemma 2); None = no cap.
      per_layer_input_size: P > 0 gives every layer a ``[P]`` input per token from a second
        embedding (Gemma 4's ``hidden_size_per_layer_input``); 0 = none.
      per_layer_vocab_size: rows of that embedding; None = the vocab.
    """

    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    scale_embeddings: bool = False
    final_logit_softcap: float | None = None
    per_layer_input_size: int = 0
    per_layer_vocab_size: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "eos_ids", tuple(int(t) for t in self.eos_ids))
        _positive_or_none("ModelConfig", final_logit_softcap=self.final_logit_softcap)
        if self.per_layer_input_size < 0 or (
            self.per_layer_vocab_size is not None and self.per_layer_vocab_size < 1
        ):
            raise ValueError(
                f"per_layer_input_size={self.per_layer_input_size} must be >= 0 and "
                f"per_layer_vocab_size={self.per_layer_vocab_size} positive"
            )


#: ModelConfig's group fields and their classes.
GROUPS: dict[str, type] = {
    "attn": AttentionConfig,
    "rope": RopeConfig,
    "mlp": MlpConfig,
    "moe": MoeConfig,
    "linear": LinearAttentionConfig,
    "norms": NormConfig,
    "tokens": TokenConfig,
}

#: Old flat ModelConfig name -> (group, name in the group). The old flat ``attention`` (the
#: :class:`AttentionImpl`, YAML ``model.attention``) is ``attn.impl``.
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "attention": ("attn", "impl"),
    **{
        name: ("attn", name)
        for name in (
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "qk_norm",
            "sliding_window",
            "layer_types",
            "query_pre_attn_scalar",
            "global_head_dim",
            "global_kv_heads",
            "global_k_eq_v",
            "value_norm",
            "kv_shared_layers",
        )
    },
    "attention_bias": ("attn", "bias"),
    "attention_out_bias": ("attn", "out_bias"),
    "attn_logit_softcap": ("attn", "logit_softcap"),
    "attention_sinks": ("attn", "sinks"),
    "attn_output_gate": ("attn", "output_gate"),
    "max_position_embeddings": ("rope", "max_position_embeddings"),
    "rope_theta": ("rope", "theta"),
    "rope_scaling": ("rope", "scaling"),
    "rope_factor": ("rope", "factor"),
    "rope_low_freq_factor": ("rope", "low_freq_factor"),
    "rope_high_freq_factor": ("rope", "high_freq_factor"),
    "rope_original_max_position": ("rope", "original_max_position"),
    "rope_beta_fast": ("rope", "beta_fast"),
    "rope_beta_slow": ("rope", "beta_slow"),
    "rope_truncate": ("rope", "truncate"),
    "rope_attention_factor": ("rope", "attention_factor"),
    "rope_local_theta": ("rope", "local_theta"),
    "partial_rotary_factor": ("rope", "partial_rotary_factor"),
    "global_rope_proportion": ("rope", "global_proportion"),
    "intermediate_size": ("mlp", "intermediate_size"),
    "mlp_activation": ("mlp", "activation"),
    "swiglu_alpha": ("mlp", "swiglu_alpha"),
    "swiglu_limit": ("mlp", "swiglu_limit"),
    "double_wide_mlp": ("mlp", "double_wide"),
    "num_experts": ("moe", "num_experts"),
    "num_experts_per_tok": ("moe", "num_experts_per_tok"),
    "moe_intermediate_size": ("moe", "intermediate_size"),
    "norm_topk_prob": ("moe", "norm_topk_prob"),
    "router_aux_loss_coef": ("moe", "router_aux_loss_coef"),
    "moe_dispatch": ("moe", "dispatch"),
    "moe_beside_mlp": ("moe", "beside_mlp"),
    "shared_expert_size": ("moe", "shared_expert_size"),
    "expert_bias": ("moe", "expert_bias"),
    "linear_num_key_heads": ("linear", "num_key_heads"),
    "linear_num_value_heads": ("linear", "num_value_heads"),
    "linear_key_head_dim": ("linear", "key_head_dim"),
    "linear_value_head_dim": ("linear", "value_head_dim"),
    "linear_conv_kernel": ("linear", "conv_kernel"),
    "delta_chunk_size": ("linear", "chunk_size"),
    "rms_norm_eps": ("norms", "eps"),
    "rms_norm_unit_offset": ("norms", "unit_offset"),
    "post_norms": ("norms", "post_norms"),
    "layer_scalars": ("norms", "layer_scalars"),
    "bos_token_id": ("tokens", "bos_id"),
    "eos_token_ids": ("tokens", "eos_ids"),
    "pad_token_id": ("tokens", "pad_id"),
    "scale_embeddings": ("tokens", "scale_embeddings"),
    "final_logit_softcap": ("tokens", "final_logit_softcap"),
    "per_layer_input_size": ("tokens", "per_layer_input_size"),
    "per_layer_vocab_size": ("tokens", "per_layer_vocab_size"),
}


def build_group(name: str, value: Any, overrides: Mapping[str, Any]) -> Any:
    """The ``name`` group from ``value`` (its dataclass, a mapping of its fields as a
    checkpoint or YAML holds them, or None for its defaults) with ``overrides`` (its own field
    names) applied; an unknown key raises TypeError naming the closest one."""
    cls = GROUPS[name]
    if isinstance(value, Mapping):
        fields = dict(value)
    elif value is None:
        fields = {}
    elif isinstance(value, cls):
        if not overrides:
            return value
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}
    else:
        raise TypeError(f"ModelConfig.{name} must be a {cls.__name__} or a mapping, got {value!r}")
    fields.update(overrides)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in fields:
        if key not in names:
            raise TypeError(
                f"ModelConfig.{name} has no field {key!r}{did_you_mean(key, names)}; "
                f"allowed: {names}"
            )
    return cls(**fields)

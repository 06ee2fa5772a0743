"""Model configuration for the Llama, Gemma and mixture-of-experts families of decoder-only
transformers.

One frozen dataclass covers Llama (1/2/3, incl. SmolLM2 and Llama 3 rope scaling), Mistral,
Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Gemma 2, 3 and 4 (text), Qwen3-MoE
and Mixtral (sparse MoE MLPs), as Hugging Face transformers implements them. Every field that
only Gemma or the MoE families use defaults to the Llama behaviour, so a Llama-family config
computes exactly what it did before those fields existed; the Gemma presets' values live in
:mod:`jaxrl_llm.models.gemma`. The enumerated options (:class:`Family`, :class:`LayerType`,
...) are :mod:`jaxrl_llm.models.options`', imported here. Building a config from a transformers
config is :func:`jaxrl_llm.interop.model_config_from_hf` (``models/`` knows nothing of
transformers' field names).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from jaxrl_llm.models.families.facts import FLOAT32_NORM_FAMILIES, TINY_FIELDS
from jaxrl_llm.models.gemma import gemma3_270m_fields, tiny_fields
from jaxrl_llm.models.gemma4 import gemma4_tiny_fields
from jaxrl_llm.models.options import (
    Activation,
    AttentionImpl,
    Family,
    LayerType,
    MoeDispatch,
    RopeScaling,
)
from jaxrl_llm.models.qwen3_5 import qwen3_5_tiny_fields

__all__ = [
    "HF_ARCHITECTURES",
    "Activation",
    "AttentionImpl",
    "Family",
    "LayerType",
    "ModelConfig",
    "MoeDispatch",
    "RopeScaling",
    "dtype_from_name",
]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# transformers architecture names per family, used for export.
HF_ARCHITECTURES = {
    Family.LLAMA: ("LlamaForCausalLM", "LlamaForSequenceClassification"),
    Family.MISTRAL: ("MistralForCausalLM", "MistralForSequenceClassification"),
    Family.QWEN2: ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
    Family.QWEN3: ("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
    Family.GEMMA2: ("Gemma2ForCausalLM", "Gemma2ForSequenceClassification"),
    Family.GEMMA3: ("Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
    Family.QWEN3_MOE: ("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"),
    Family.MIXTRAL: ("MixtralForCausalLM", "MixtralForSequenceClassification"),
    Family.QWEN3_5: ("Qwen3_5ForCausalLM", "Qwen3_5TextForSequenceClassification"),
    # transformers has no Qwen3.5-MoE text sequence classifier; export refuses a scalar head.
    Family.QWEN3_5_MOE: ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForSequenceClassification"),
    # transformers has no Gemma 4 sequence classifier; export refuses a scalar head.
    Family.GEMMA4: ("Gemma4ForCausalLM", "Gemma4ForSequenceClassification"),
    Family.GPT_OSS: ("GptOssForCausalLM", "GptOssForSequenceClassification"),
}


def dtype_from_name(name: str | Any):
    """'float32' | 'bfloat16' | 'float16' (or a dtype) -> jnp dtype; clear error otherwise."""
    if not isinstance(name, str):
        return jnp.dtype(name)
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {sorted(_DTYPES)}") from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Hyperparameters of a Llama-family decoder.

    Attributes:
      family: which transformers implementation the weights follow.
      vocab_size, hidden_size (D), intermediate_size (F), num_layers (L), num_heads (H),
      num_kv_heads (K, grouped-query attention; H % K == 0), head_dim (defaults to D // H).
      rope_theta: RoPE base. rope_scaling: scheme; rope_factor, rope_low_freq_factor,
        rope_high_freq_factor, rope_original_max_position: its parameters (Llama 3).
      rope_beta_fast, rope_beta_slow, rope_truncate, rope_attention_factor: YaRN's
        (``rope_scaling`` YARN; Peng et al. 2023, https://arxiv.org/abs/2309.00071): the
        rotation counts bounding the ramp between interpolated and kept frequencies, whether
        its ends are rounded to whole dims, and the factor q and k are multiplied by (None:
        0.1 · ln(rope_factor) + 1, the paper's); :attr:`rope_attention_scaling`.
      rms_norm_eps: RMSNorm ε. tie_embeddings: the unembedding is the embedding's transpose.
      attention_bias: q/k/v projections have a bias (Qwen2). qk_norm: per-head RMSNorm on q, k
        before RoPE (Qwen3). sliding_window: Mistral's local attention window (None = global).
      layer_types: per-layer :class:`LayerType` (Gemma 2 / 3); empty (default) = every layer
        alike, windowed by ``sliding_window`` if set. With entries, LOCAL layers use
        ``sliding_window`` and ``rope_local_theta``, GLOBAL layers no window and ``rope_theta``
        (with ``rope_scaling``).
      rope_local_theta: RoPE base of LOCAL layers (Gemma 3's ``rope_local_base_freq``; no
        scaling); None = ``rope_theta``.
      rms_norm_unit_offset: RMSNorm scales by (1 + w) in float32 before casting back (Gemma);
        False = w times the normalised input cast to the activation dtype (Llama).
      post_norms: RMSNorm on the attention and MLP outputs before each residual add (Gemma 2/3).
      mlp_activation: :class:`Activation` of the gated MLP.
      scale_embeddings: multiply the embedding by √D in the activation dtype (Gemma).
      query_pre_attn_scalar: attention scores are q·k / √query_pre_attn_scalar; None = head_dim.
      attn_logit_softcap, final_logit_softcap: Gemma 2's cap·tanh(x / cap) on the attention
        scores and on the output logits; None = no cap.
      num_experts: X > 0 makes every layer's MLP a sparse mixture of X SwiGLU experts
        (Qwen3-MoE, Mixtral; :mod:`jaxrl_llm.models.moe`); 0 (default) = a dense MLP.
      num_experts_per_tok: k, the experts each token is routed to (1 ≤ k ≤ X).
      moe_intermediate_size: F_e, each expert's hidden width; None = ``intermediate_size``.
      norm_topk_prob: renormalise the k routing weights to sum to 1 (Mixtral; Qwen3-MoE's
        ``norm_topk_prob``).
      router_aux_loss_coef: the load-balancing loss's coefficient the checkpoint was trained
        with (transformers' ``router_aux_loss_coef``), the default of ``model.router_aux_loss_coef``.
      moe_dispatch: :class:`MoeDispatch`, how tokens reach experts (not what is computed).
      moe_beside_mlp: every layer has the dense MLP *and* the sparse MoE block, their outputs
        normed and added (Gemma 4's ``enable_moe_block``; the router reads the residual stream
        through a scale-free RMSNorm times ``router_norm`` and D^-1/2, and scales each routing
        weight by its expert's ``expert_scale``; GeGLU experts).
      shared_expert_size: F_s > 0 adds to every sparse MoE block a shared SwiGLU expert of
        width F_s, gated per token by σ(h W_sg) (Qwen3.5-MoE); 0 = none.
      linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
        linear_value_head_dim, linear_conv_kernel: the Gated DeltaNet layers (LINEAR entries
        of ``layer_types``, Qwen3.5; :mod:`jaxrl_llm.models.gated_deltanet`): query/key heads
        H_k, value heads H_v (a multiple of H_k), their dims, the causal conv's width W;
        0 = no such layers.
      delta_chunk_size: chunk length of the chunked delta rule (how, not what).
      partial_rotary_factor: RoPE rotates the first ``int(head_dim · factor)`` dims of each
        head (Qwen3.5: 0.25); 1 = all.
      attn_output_gate: attention's output is multiplied by σ(h W_gate) per head before the
        output projection (Qwen3.5's full-attention layers).
      global_head_dim, global_kv_heads: head dim and KV heads of the GLOBAL layers (Gemma 4's
        ``global_head_dim`` / ``num_global_key_value_heads``); None = ``head_dim`` /
        ``num_kv_heads``. Layers of both sizes are stored padded to the larger
        (:attr:`store_head_dim`, :attr:`store_kv_heads`; :mod:`jaxrl_llm.models.gemma4`).
      global_k_eq_v: GLOBAL layers' values are their key projection's output (Gemma 4's
        ``attention_k_eq_v``); their ``v_proj`` is unused and kept at zero.
      global_rope_proportion: GLOBAL layers rotate only the first ⌊p · E_g / 2⌋ RoPE pairs,
        with frequencies over the whole head dim (Gemma 4's "proportional" RoPE); 1 = all.
      value_norm: a scale-free RMSNorm on each value head (Gemma 4).
      layer_scalars: each layer's output is multiplied by a stored per-layer scalar
        (``params["layers"]["layer_scalar"]``, Gemma 4; no gradient reaches it).
      per_layer_input_size: P > 0 gives every layer a ``[P]`` input per token from a second
        embedding and a projection of the first, gated into its residual stream after the MLP
        (Gemma 4's per-layer embeddings, ``hidden_size_per_layer_input``); 0 = none.
      per_layer_vocab_size: rows of that embedding (``vocab_size_per_layer_input``); None =
        ``vocab_size``.
      kv_shared_layers: the last n layers compute no keys/values of their own: each attends
        over those of the last earlier layer of its type (Gemma 4's ``num_kv_shared_layers``,
        the E2B / E4B models; :class:`~jaxrl_llm.models.kv_stores.KVShared`). Their k/v
        weights are kept at zero; 0 = none.
      double_wide_mlp: the KV-shared layers' MLP is twice as wide as the others' (Gemma 4's
        ``use_double_wide_mlp``). ``intermediate_size`` is then the wide (stored) width; the
        other layers use its first half and keep the second half at zero.
      attention_sinks: every attention layer has a learned logit per query head that joins
        the softmax's denominator and carries no value (gpt-oss; ``params["layers"]["sinks"]``;
        Xiao et al. 2023, https://arxiv.org/abs/2309.17453).
      attention_out_bias: the output projection has a bias (gpt-oss's ``attention_bias``
        covers q/k/v and o; Qwen2's only q/k/v).
      expert_bias: the router and every expert's three projections have biases (gpt-oss).
      swiglu_alpha, swiglu_limit: α and ℓ of :attr:`Activation.CLAMPED_SWIGLU`.
      num_labels: 0 for a language model; 1 adds a scalar head (value / reward model).
      param_dtype, compute_dtype: 'float32' or 'bfloat16'.
      attention: :class:`AttentionImpl` (default 'auto'); how attention is computed, not what:
        every choice gives the same result up to float rounding.
      bos_token_id, eos_token_ids, pad_token_id: special tokens carried for export/sampling.
    """

    family: Family = Family.LLAMA
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    # None (the default) becomes hidden_size // num_heads in __post_init__, so readers see an int.
    head_dim: int = None  # type: ignore[assignment]
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling.NONE
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_attention_factor: float | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()
    rope_local_theta: float | None = None
    rms_norm_unit_offset: bool = False
    post_norms: bool = False
    mlp_activation: Activation = Activation.SILU
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    # None (the default) becomes intermediate_size in __post_init__.
    moe_intermediate_size: int = None  # type: ignore[assignment]
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    moe_dispatch: MoeDispatch = MoeDispatch.SORTED
    moe_beside_mlp: bool = False
    shared_expert_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    delta_chunk_size: int = 64
    partial_rotary_factor: float = 1.0
    attn_output_gate: bool = False
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    global_k_eq_v: bool = False
    global_rope_proportion: float = 1.0
    value_norm: bool = False
    layer_scalars: bool = False
    per_layer_input_size: int = 0
    per_layer_vocab_size: int | None = None
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    attention_sinks: bool = False
    attention_out_bias: bool = False
    expert_bias: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    num_labels: int = 0
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    attention: AttentionImpl = AttentionImpl.AUTO
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "family", Family(self.family))
        object.__setattr__(self, "rope_scaling", RopeScaling(self.rope_scaling))
        object.__setattr__(self, "attention", AttentionImpl(self.attention))
        object.__setattr__(self, "mlp_activation", Activation(self.mlp_activation))
        object.__setattr__(self, "layer_types", tuple(LayerType(t) for t in self.layer_types))
        object.__setattr__(self, "moe_dispatch", MoeDispatch(self.moe_dispatch))
        if self.moe_intermediate_size is None:
            object.__setattr__(self, "moe_intermediate_size", self.intermediate_size)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by num_heads="
                    f"{self.num_heads}; set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.num_labels not in (0, 1):
            raise ValueError(
                f"num_labels must be 0 (language model) or 1 (scalar head), got {self.num_labels}"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for num_layers={self.num_layers}"
            )
        if LayerType.LOCAL in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has LOCAL layers but sliding_window is None")
        for name in ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {value}")
        self._check_experts()
        self._check_linear()
        self._check_global_heads()
        self._check_yarn()
        dtype_from_name(self.param_dtype)
        dtype_from_name(self.compute_dtype)

    def _check_yarn(self) -> None:
        if self.rope_scaling != RopeScaling.YARN:
            return
        if self.rotary_dim != self.head_dim or self.global_head_dim is not None:
            raise ValueError("YaRN RoPE needs every head dim rotated (partial_rotary_factor=1)")
        if not self.rope_factor > 0 or not self.rope_beta_fast > self.rope_beta_slow > 0:
            raise ValueError(
                f"YaRN needs rope_factor > 0 and rope_beta_fast > rope_beta_slow > 0, got "
                f"{self.rope_factor}, {self.rope_beta_fast}, {self.rope_beta_slow}"
            )

    @property
    def rope_attention_scaling(self) -> float:
        """The factor RoPE multiplies q and k by (their dot products by its square): YaRN's
        ``rope_attention_factor``, by default 0.1 · ln(s) + 1 for a factor s > 1 (Peng et al.
        2023, https://arxiv.org/abs/2309.00071 eq. 22; transformers' ``get_mscale``); 1
        for every other scheme."""
        if self.rope_scaling != RopeScaling.YARN:
            return 1.0
        if self.rope_attention_factor is not None:
            return float(self.rope_attention_factor)
        return 1.0 if self.rope_factor <= 1 else 0.1 * math.log(self.rope_factor) + 1.0

    def _check_experts(self) -> None:
        moe_family = self.family in (
            Family.QWEN3_MOE,
            Family.MIXTRAL,
            Family.QWEN3_5_MOE,
            Family.GPT_OSS,
        )
        if moe_family and self.num_experts <= 0:
            raise ValueError(f"family {self.family.value!r} needs num_experts > 0")
        if self.num_experts < 0:
            raise ValueError(f"num_experts must be >= 0, got {self.num_experts}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.moe_intermediate_size <= 0:
            raise ValueError(
                f"moe_intermediate_size must be positive, got {self.moe_intermediate_size}"
            )
        if self.shared_expert_size < 0 or (self.shared_expert_size and not self.num_experts):
            raise ValueError(
                f"shared_expert_size={self.shared_expert_size} must be >= 0, and > 0 only with "
                f"experts"
            )
        if self.moe_beside_mlp and not self.num_experts:
            raise ValueError("moe_beside_mlp needs num_experts > 0")
        if not self.router_aux_loss_coef >= 0:
            raise ValueError(f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef}")

    def _check_linear(self) -> None:
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ValueError(
                f"partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1] and give "
                f"an even number of rotated dims (head_dim={self.head_dim})"
            )
        if self.family in (Family.QWEN3_5, Family.QWEN3_5_MOE) and not self.is_hybrid:
            raise ValueError(f"family {self.family.value!r} needs LINEAR entries in layer_types")
        if not self.is_hybrid:
            return
        if LayerType.LOCAL in self.layer_types:
            raise ValueError("layer_types cannot mix LINEAR and LOCAL layers")
        for name in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel",
            "delta_chunk_size",
        ):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"LINEAR layers need {name} > 0, got {getattr(self, name)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} must be a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        _ = self.layer_period  # raises when the pattern does not repeat

    def _check_global_heads(self) -> None:
        if not self.layer_types and (
            self.global_head_dim is not None
            or self.global_kv_heads is not None
            or self.global_k_eq_v
            or self.global_rope_proportion != 1.0
        ):
            raise ValueError("GLOBAL-layer geometry (global_*) needs layer_types")
        for e in {self.layer_heads(i)[1] for i in range(self.num_layers)}:
            if e % 2:
                raise ValueError(f"head dims must be even, got {e}")
        k_store = self.store_kv_heads
        for k, _ in {self.layer_heads(i) for i in range(self.num_layers)}:
            if k <= 0 or k_store % k or self.num_heads % k_store:
                raise ValueError(
                    f"KV heads {k} must divide the stored {k_store}, which must divide "
                    f"num_heads={self.num_heads}"
                )
        if self.per_layer_input_size < 0 or self.per_layer_vocab < 1:
            raise ValueError(
                f"per_layer_input_size={self.per_layer_input_size} must be >= 0 and "
                f"per_layer_vocab_size={self.per_layer_vocab_size} positive"
            )
        if not 0 < self.global_rope_proportion <= 1:
            raise ValueError(
                f"global_rope_proportion must be in (0, 1], got {self.global_rope_proportion}"
            )
        self._check_kv_sharing()

    def _check_kv_sharing(self) -> None:
        n = self.kv_shared_layers
        if self.double_wide_mlp and (not n or self.intermediate_size % 2):
            raise ValueError(
                "double_wide_mlp needs kv_shared_layers > 0 and an even intermediate_size "
                f"(the wide width), got {n} and {self.intermediate_size}"
            )
        if not n:
            return
        if not 0 < n < self.num_layers or not self.layer_types or self.is_hybrid:
            raise ValueError(
                f"kv_shared_layers={n} needs 0 < n < num_layers={self.num_layers} and attention "
                "layer_types (not a hybrid stack)"
            )
        first = self.num_layers - n
        missing = set(self.layer_types[first:]) - set(self.layer_types[:first])
        if missing:
            raise ValueError(
                f"kv_shared_layers={n}: no earlier layer of type "
                f"{sorted(t.value for t in missing)} to share keys/values with"
            )

    def kv_shared(self, layer: int) -> bool:
        """Layer ``layer`` reuses an earlier layer's keys/values (``kv_shared_layers``)."""
        return layer >= self.num_layers - self.kv_shared_layers

    def mlp_width(self, layer: int) -> int:
        """The MLP width layer ``layer`` uses: ``intermediate_size``, or its first half for a
        layer that is not KV-shared when ``double_wide_mlp``."""
        if self.double_wide_mlp and not self.kv_shared(layer):
            return self.intermediate_size // 2
        return self.intermediate_size

    def layer_heads(self, layer: int) -> tuple[int, int]:
        """(KV heads, head dim) of layer ``layer`` (the GLOBAL layers' own with
        ``global_kv_heads`` / ``global_head_dim``)."""
        if self.layer_types and self.layer_types[layer] == LayerType.GLOBAL:
            k = self.num_kv_heads if self.global_kv_heads is None else self.global_kv_heads
            e = self.head_dim if self.global_head_dim is None else self.global_head_dim
            return k, e
        return self.num_kv_heads, self.head_dim

    @property
    def per_layer_vocab(self) -> int:
        """Rows of Gemma 4's per-layer embedding (``per_layer_vocab_size`` or the vocab)."""
        return self.vocab_size if self.per_layer_vocab_size is None else self.per_layer_vocab_size

    @property
    def store_head_dim(self) -> int:
        """E*, the head dim every layer's q/k/v/o weights and KV cache are stored at: the
        largest layer's (smaller heads are zero-padded, :mod:`jaxrl_llm.models.gemma4`)."""
        return max(self.layer_heads(i)[1] for i in range(self.num_layers))

    @property
    def store_kv_heads(self) -> int:
        """K*, the KV heads every layer's k/v weights and KV cache are stored at: the largest
        layer's."""
        return max(self.layer_heads(i)[0] for i in range(self.num_layers))

    @property
    def has_padded_heads(self) -> bool:
        """Some layer's heads are smaller than the stored ones (:attr:`store_head_dim`,
        :attr:`store_kv_heads`)."""
        store = (self.store_kv_heads, self.store_head_dim)
        return any(self.layer_heads(i) != store for i in range(self.num_layers))

    @property
    def rms_norm_float32(self) -> bool:
        """RMSNorm multiplies by its weight in float32 before casting back (Gemma 2 / 3's
        (1 + w) and Gemma 4's plain w), not in the activation dtype (Llama)."""
        return self.rms_norm_unit_offset or self.family in FLOAT32_NORM_FAMILIES

    @property
    def is_hybrid(self) -> bool:
        """Some layers are Gated DeltaNet linear attention (LINEAR entries in ``layer_types``)."""
        return LayerType.LINEAR in self.layer_types

    @property
    def layer_period(self) -> tuple[LayerType, ...]:
        """The shortest run of layer types that ``layer_types`` repeats a whole number of times
        (a hybrid stack scans these periods); ValueError when none is shorter than the stack."""
        n = len(self.layer_types)
        for p in range(1, n + 1):
            if n % p == 0 and self.layer_types == self.layer_types[:p] * (n // p):
                return self.layer_types[:p]
        return self.layer_types

    @property
    def num_linear_layers(self) -> int:
        """Number of Gated DeltaNet (LINEAR) layers."""
        return sum(t == LayerType.LINEAR for t in self.layer_types)

    @property
    def num_attention_layers(self) -> int:
        """Number of softmax-attention layers (all of them unless the stack is hybrid)."""
        return self.num_layers - self.num_linear_layers

    @property
    def num_kv_layers(self) -> int:
        """Layers a KV cache holds keys/values for: the attention layers but the KV-shared
        ones (``kv_shared_layers``), which read their source layer's."""
        return self.num_attention_layers - self.kv_shared_layers

    @property
    def rotary_dim(self) -> int:
        """Dims of each head RoPE rotates: ``int(head_dim · partial_rotary_factor)``."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_conv_channels(self) -> int:
        """Channels C of a Gated DeltaNet layer's conv: queries, keys, values together."""
        return (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a sparse mixture of experts (``num_experts > 0``)."""
        return self.num_experts > 0

    @property
    def uses_window(self) -> bool:
        """Some layer attends through a sliding window (the masks then carry positions)."""
        if self.layer_types:
            return LayerType.LOCAL in self.layer_types
        return self.sliding_window is not None

    @property
    def param_jnp_dtype(self):
        """The parameter dtype as a jnp dtype."""
        return dtype_from_name(self.param_dtype)

    @property
    def compute_jnp_dtype(self):
        """The activation / matmul dtype as a jnp dtype."""
        return dtype_from_name(self.compute_dtype)

    def num_params(self, *, active: bool = False, stored: bool = False) -> int:
        """Parameter count (embedding counted once when tied). ``active=True`` counts, for a
        mixture of experts, only the k experts a token runs (and the router): the weights
        one token's forward touches. ``stored=True`` counts weights as stored: heads padded
        to the largest layer's (:attr:`has_padded_heads`, Gemma 4), KV-shared layers' unused
        k/v weights, every MLP at the wide width (``double_wide_mlp``): what memory holds,
        not what the model uses."""
        d, f = self.hidden_size, self.intermediate_size
        dense = not self.is_moe or self.moe_beside_mlp
        mlp = 3 * d * f if dense and (stored or not self.double_wide_mlp) else 0
        if self.is_moe:
            experts = self.num_experts_per_tok if active else self.num_experts
            mlp += experts * 3 * d * self.moe_intermediate_size + d * self.num_experts
            if self.expert_bias:  # each expert's gate, up and down biases; the router's
                mlp += experts * (2 * self.moe_intermediate_size + d) + self.num_experts
            if self.shared_expert_size:
                mlp += 3 * d * self.shared_expert_size + d
            if self.moe_beside_mlp:  # router norm, expert scales, three norms
                mlp += d + self.num_experts + 3 * d
        per_layer = mlp + 2 * d
        if self.post_norms:
            per_layer += 2 * d
        if self.layer_scalars:
            per_layer += 1
        p = self.per_layer_input_size
        if p:  # gate, projection, norm; the embedding, projection and norm beside the trunk
            per_layer += 2 * d * p + d
        hv, dv = self.linear_num_value_heads, self.linear_value_head_dim
        linear = (
            d * self.linear_conv_channels  # in_proj_qkv
            + self.linear_conv_kernel * self.linear_conv_channels  # conv
            + d * hv * dv  # in_proj_z
            + 2 * d * hv  # in_proj_b, in_proj_a
            + 2 * hv  # dt_bias, A_log
            + dv  # gated norm
            + hv * dv * d  # out_proj
        )
        n = (
            self.vocab_size * d
            + self.num_layers * per_layer
            + sum(self._attention_params(i, stored) for i in range(self.num_layers))
            + sum(3 * d * self.mlp_width(i) for i in range(self.num_layers) if dense and not mlp)
            + self.num_linear_layers * linear
            + d
        )
        if p:
            n += (self.per_layer_vocab + d) * self.num_layers * p + p
        if not self.tie_embeddings:
            n += d * self.vocab_size
        n += d * self.num_labels
        return n

    def _attention_params(self, layer: int, stored: bool = False) -> int:
        """Parameters of layer ``layer``'s attention (0 for a LINEAR layer), at its own size
        or (``stored``) at the stored one."""
        if self.layer_types and self.layer_types[layer] == LayerType.LINEAR:
            return 0
        d, h = self.hidden_size, self.num_heads
        k, e = self.layer_heads(layer)
        kv = 1 if self.global_k_eq_v and self.layer_types[layer] == LayerType.GLOBAL else 2
        norms = 2
        if self.kv_shared(layer):
            kv, norms = 0, 1
        if stored:
            k, e, kv, norms = self.store_kv_heads, self.store_head_dim, 2, 2
        n = d * h * e + kv * d * k * e + h * e * d
        if self.attn_output_gate:
            n += d * h * e
        if self.attention_bias:
            n += h * e + kv * k * e
        if self.qk_norm:
            n += norms * e
        if self.attention_sinks:
            n += h
        if self.attention_out_bias:
            n += d
        return n

    # ----- presets -------------------------------------------------------------------------
    @classmethod
    def tiny(cls, family: Family | str = Family.LLAMA, **overrides) -> ModelConfig:
        """A tiny random-init config with odd, distinct sizes for unit tests."""
        family = Family(family)
        if family in (Family.GEMMA2, Family.GEMMA3):
            return cls(**{**tiny_fields(family), **overrides})
        if family in (Family.QWEN3_5, Family.QWEN3_5_MOE):
            return cls(**{**qwen3_5_tiny_fields(family), **overrides})
        if family == Family.GEMMA4:
            return cls(**{**gemma4_tiny_fields(), **overrides})
        if family in TINY_FIELDS:  # a family folder's own preset (models/families/)
            return cls(**{**TINY_FIELDS[family](), **overrides})
        moe: dict[str, Any] = {}
        if family in (Family.QWEN3_MOE, Family.MIXTRAL):
            # 8 experts of width 40, top-2 (Qwen3-MoE without renormalisation, as its default).
            moe = dict(
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=40 if family == Family.QWEN3_MOE else None,
                norm_topk_prob=family == Family.MIXTRAL,
            )
        base: dict[str, Any] = dict(
            family=family,
            vocab_size=97,
            hidden_size=48,
            intermediate_size=80,
            num_layers=2,
            num_heads=3,
            num_kv_heads=1,
            head_dim=16,
            max_position_embeddings=256,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_embeddings=family == Family.LLAMA,
            attention_bias=family == Family.QWEN2,
            qk_norm=family in (Family.QWEN3, Family.QWEN3_MOE),
            **moe,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def smollm2_135m(cls, **overrides) -> ModelConfig:
        """SmolLM2-135M(-Instruct): 30 layers, D=576, 9 heads / 3 KV heads, tied, V=49152."""
        base: dict[str, Any] = dict(
            family=Family.LLAMA,
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_embeddings=True,
            bos_token_id=1,
            eos_token_ids=(2,),
            pad_token_id=2,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def gemma3_270m(cls, **overrides) -> ModelConfig:
        """Gemma 3 270M: 18 layers (5 local : 1 global), D=640, 4 heads / 1 KV head, E=256,
        window 512, tied, V=262144 (:func:`jaxrl_llm.models.gemma.gemma3_270m_fields`)."""
        return cls(**{**gemma3_270m_fields(), **overrides})

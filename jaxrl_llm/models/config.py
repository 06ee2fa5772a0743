"""Model configuration for the Llama, Gemma and mixture-of-experts families of decoder-only
transformers.

One frozen dataclass of groups (:mod:`jaxrl_llm.models.config_groups`: attn, rope, mlp,
moe, linear, norms, tokens) covers Llama (1/2/3, incl. SmolLM2 and Llama 3 rope scaling), Mistral,
Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Gemma 2, 3 and 4 (text), Qwen3-MoE
and Mixtral (sparse MoE MLPs), as Hugging Face transformers implements them. Every field that
only Gemma or the MoE families use defaults to the Llama behaviour, so a Llama-family config
computes exactly what it did before those fields existed; each family's presets live in its
folder (:mod:`jaxrl_llm.models.families`), asked through :mod:`jaxrl_llm.models.families.facts`. The enumerated options (:class:`Family`, :class:`LayerType`,
...) are :mod:`jaxrl_llm.models.options`', imported here. Building a config from a transformers
config is :func:`jaxrl_llm.interop.model_config_from_hf` (``models/`` knows nothing of
transformers' field names).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from jaxrl_llm.errors import did_you_mean
from jaxrl_llm.models.config_groups import (
    FLAT_NAMES,
    GROUPS,
    AttentionConfig,
    LinearAttentionConfig,
    MlpConfig,
    MoeConfig,
    NormConfig,
    RopeConfig,
    TokenConfig,
    build_group,
)
from jaxrl_llm.models.families.facts import (
    EXPERT_FAMILIES,
    FLOAT32_NORM_FAMILIES,
    HYBRID_FAMILIES,
    TINY_FIELDS,
)
from jaxrl_llm.models.families.gemma.presets import gemma3_270m_fields
from jaxrl_llm.models.families.llama.presets import smollm2_135m_fields
from jaxrl_llm.models.options import (
    Activation,
    AttentionImpl,
    Family,
    LayerType,
    MoeDispatch,
    RopeScaling,
)
from jaxrl_llm.models.param_count import count_params

__all__ = [
    "FLAT_NAMES",
    "Activation",
    "AttentionConfig",
    "AttentionImpl",
    "Family",
    "LayerType",
    "LinearAttentionConfig",
    "MlpConfig",
    "ModelConfig",
    "MoeConfig",
    "MoeDispatch",
    "NormConfig",
    "RopeConfig",
    "RopeScaling",
    "TokenConfig",
    "dtype_from_name",
    "known_keys",
]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_from_name(name: str | Any):
    """'float32' | 'bfloat16' | 'float16' (or a dtype) -> jnp dtype; clear error otherwise."""
    if not isinstance(name, str):
        return jnp.dtype(name)
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {sorted(_DTYPES)}") from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ModelConfig:
    """Hyperparameters of a decoder (Llama, Mistral, Qwen 2/3/3.5, Gemma 2/3/4, the MoE
    families, gpt-oss), in groups (:mod:`jaxrl_llm.models.config_groups`).

    Attributes:
      family: which transformers implementation the weights follow.
      vocab_size (V), hidden_size (D), num_layers (L).
      attn: :class:`~jaxrl_llm.models.config_groups.AttentionConfig`: heads, head dims,
        the layer pattern, windows, soft-capping, sinks, gates, KV sharing; ``impl`` is how
        attention is computed (:class:`AttentionImpl`).
      rope: :class:`~jaxrl_llm.models.config_groups.RopeConfig`: positions (RoPE base, scaling,
        the rotated fraction).
      mlp: :class:`~jaxrl_llm.models.config_groups.MlpConfig`: the dense gated MLP.
      moe: :class:`~jaxrl_llm.models.config_groups.MoeConfig`: the sparse mixture of experts
        (``num_experts`` 0 = none).
      linear: :class:`~jaxrl_llm.models.config_groups.LinearAttentionConfig`: Gated DeltaNet
        layers (Qwen3.5).
      norms: :class:`~jaxrl_llm.models.config_groups.NormConfig`: RMSNorm ε and flavour,
        post-norms, layer scalars.
      tokens: :class:`~jaxrl_llm.models.config_groups.TokenConfig`: special ids, embedding
        scale, per-layer embeddings, the output logits' soft cap.
      num_labels: 0 for a language model; 1 adds a scalar head (value / reward model).
      tie_embeddings: the unembedding is the embedding's transpose.
      param_dtype, compute_dtype: 'float32', 'bfloat16' or 'float16'.

    The constructor also takes every old flat keyword (``num_heads=4``, ``rope_theta=1e6``,
    ``moe_dispatch="dense"``, ``attention="splash"`` for ``attn.impl``; the table is
    :data:`~jaxrl_llm.models.config_groups.FLAT_NAMES`) and folds it into its group, over a
    group given beside it, so ``dataclasses.replace(config, num_heads=8)`` works; a group may
    be given as a mapping of its fields (a checkpoint's JSON). Flat reads (``config.num_heads``)
    are read-only aliases of the grouped names; :meth:`flat` is the whole flat view.
    """

    family: Family = Family.LLAMA
    vocab_size: int
    hidden_size: int
    num_layers: int
    attn: AttentionConfig
    rope: RopeConfig
    mlp: MlpConfig
    moe: MoeConfig
    linear: LinearAttentionConfig
    norms: NormConfig
    tokens: TokenConfig
    num_labels: int = 0
    tie_embeddings: bool = False
    param_dtype: str = "float32"
    compute_dtype: str = "float32"

    def __init__(self, **kwargs: Any) -> None:
        top: dict[str, Any] = {}
        groups: dict[str, Any] = {}
        flat: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        for key, value in kwargs.items():
            if key in GROUPS:
                groups[key] = value
            elif key in _TOP_FIELDS:
                top[key] = value
            elif key in FLAT_NAMES:
                group, name = FLAT_NAMES[key]
                flat[group][name] = value
            else:
                raise TypeError(
                    f"ModelConfig got an unknown field {key!r}{did_you_mean(key, known_keys())}"
                )
        for name, f in _TOP_FIELDS.items():
            if name in GROUPS:
                continue
            if name in top:
                value = top[name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                raise TypeError(f"ModelConfig needs {name}")
            object.__setattr__(self, name, value)
        for name in GROUPS:
            object.__setattr__(self, name, build_group(name, groups.get(name), flat[name]))
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        # Reached only when a slot lookup fails: the old flat names read through their group.
        if name in FLAT_NAMES:
            group, field = FLAT_NAMES[name]
            return getattr(object.__getattribute__(self, group), field)
        raise AttributeError(
            f"'ModelConfig' object has no attribute {name!r}{did_you_mean(name, known_keys())}"
        )

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes``, under flat or grouped names (``config.replace(num_heads=8,
        attention="splash")``): :func:`dataclasses.replace` does the same at run time, but
        mypy's dataclass plugin refuses its flat names."""
        return dataclasses.replace(self, **changes)

    def flat(self) -> dict[str, Any]:
        """The config under its old flat names (top-level fields and every name of
        :data:`~jaxrl_llm.models.config_groups.FLAT_NAMES`; ``attention`` is ``attn.impl``):
        ``ModelConfig(**config.flat()) == config``."""
        out = {name: getattr(self, name) for name in _TOP_FIELDS if name not in GROUPS}
        out.update({old: getattr(getattr(self, g), n) for old, (g, n) in FLAT_NAMES.items()})
        return out

    def __post_init__(self):
        object.__setattr__(self, "family", Family(self.family))
        att, mlp = self.attn, self.mlp
        if att.head_dim is None:
            if self.hidden_size % att.num_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by num_heads="
                    f"{att.num_heads}; set head_dim explicitly"
                )
            att = dataclasses.replace(att, head_dim=self.hidden_size // att.num_heads)
            object.__setattr__(self, "attn", att)
        if self.moe.intermediate_size is None:
            moe = dataclasses.replace(self.moe, intermediate_size=mlp.intermediate_size)
            object.__setattr__(self, "moe", moe)
        for name in ("vocab_size", "hidden_size", "num_layers"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_labels not in (0, 1):
            raise ValueError(
                f"num_labels must be 0 (language model) or 1 (scalar head), got {self.num_labels}"
            )
        if att.layer_types and len(att.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(att.layer_types)} entries for num_layers={self.num_layers}"
            )
        self._check_experts()
        self._check_linear()
        self._check_global_heads()
        self._check_yarn()
        dtype_from_name(self.param_dtype)
        dtype_from_name(self.compute_dtype)

    def _check_yarn(self) -> None:
        if self.rope.scaling != RopeScaling.YARN:
            return
        if self.rotary_dim != self.attn.head_dim or self.attn.global_head_dim is not None:
            raise ValueError("YaRN RoPE needs every head dim rotated (partial_rotary_factor=1)")

    @property
    def rope_attention_scaling(self) -> float:
        """The factor RoPE multiplies q and k by (their dot products by its square): YaRN's
        ``rope.attention_factor``, by default 0.1 · ln(s) + 1 for a factor s > 1 (Peng et al.
        2023, https://arxiv.org/abs/2309.00071 eq. 22; transformers' ``get_mscale``); 1
        for every other scheme."""
        rope = self.rope
        if rope.scaling != RopeScaling.YARN:
            return 1.0
        if rope.attention_factor is not None:
            return float(rope.attention_factor)
        return 1.0 if rope.factor <= 1 else 0.1 * math.log(rope.factor) + 1.0

    def _check_experts(self) -> None:
        if self.family in EXPERT_FAMILIES and self.moe.num_experts <= 0:
            raise ValueError(f"family {self.family.value!r} needs num_experts > 0")

    def _check_linear(self) -> None:
        if self.rotary_dim % 2:
            raise ValueError(
                f"partial_rotary_factor={self.rope.partial_rotary_factor} must be in (0, 1] and "
                f"give an even number of rotated dims (head_dim={self.attn.head_dim})"
            )
        if self.family in HYBRID_FAMILIES and not self.is_hybrid:
            raise ValueError(f"family {self.family.value!r} needs LINEAR entries in layer_types")
        if not self.is_hybrid:
            return
        for old, (_, name) in FLAT_NAMES.items():
            if old.startswith(("linear_", "delta_")) and int(getattr(self.linear, name)) <= 0:
                raise ValueError(f"LINEAR layers need {old} > 0, got {getattr(self.linear, name)}")
        _ = self.layer_period  # raises when the pattern does not repeat

    def _check_global_heads(self) -> None:
        att = self.attn
        if not att.layer_types and (
            att.global_head_dim is not None
            or att.global_kv_heads is not None
            or att.global_k_eq_v
            or self.rope.global_proportion != 1.0
        ):
            raise ValueError("GLOBAL-layer geometry (global_*) needs layer_types")
        for e in {self.layer_heads(i)[1] for i in range(self.num_layers)}:
            if e % 2:
                raise ValueError(f"head dims must be even, got {e}")
        k_store = self.store_kv_heads
        for k, _ in {self.layer_heads(i) for i in range(self.num_layers)}:
            if k <= 0 or k_store % k or att.num_heads % k_store:
                raise ValueError(
                    f"KV heads {k} must divide the stored {k_store}, which must divide "
                    f"num_heads={att.num_heads}"
                )
        self._check_kv_sharing()

    def _check_kv_sharing(self) -> None:
        n, layer_types = self.attn.kv_shared_layers, self.attn.layer_types
        if self.mlp.double_wide and (not n or self.mlp.intermediate_size % 2):
            raise ValueError(
                "double_wide_mlp needs kv_shared_layers > 0 and an even intermediate_size "
                f"(the wide width), got {n} and {self.mlp.intermediate_size}"
            )
        if not n:
            return
        if not 0 < n < self.num_layers or not layer_types or self.is_hybrid:
            raise ValueError(
                f"kv_shared_layers={n} needs 0 < n < num_layers={self.num_layers} and attention "
                "layer_types (not a hybrid stack)"
            )
        first = self.num_layers - n
        missing = set(layer_types[first:]) - set(layer_types[:first])
        if missing:
            raise ValueError(
                f"kv_shared_layers={n}: no earlier layer of type "
                f"{sorted(t.value for t in missing)} to share keys/values with"
            )

    def kv_shared(self, layer: int) -> bool:
        """Layer ``layer`` reuses an earlier layer's keys/values (``kv_shared_layers``)."""
        return layer >= self.num_layers - self.attn.kv_shared_layers

    def mlp_width(self, layer: int) -> int:
        """The MLP width layer ``layer`` uses: ``intermediate_size``, or its first half for a
        layer that is not KV-shared when ``double_wide_mlp``."""
        if self.mlp.double_wide and not self.kv_shared(layer):
            return self.mlp.intermediate_size // 2
        return self.mlp.intermediate_size

    def layer_heads(self, layer: int) -> tuple[int, int]:
        """(KV heads, head dim) of layer ``layer`` (the GLOBAL layers' own with
        ``global_kv_heads`` / ``global_head_dim``)."""
        att = self.attn
        if att.layer_types and att.layer_types[layer] == LayerType.GLOBAL:
            k = att.num_kv_heads if att.global_kv_heads is None else att.global_kv_heads
            e = att.head_dim if att.global_head_dim is None else att.global_head_dim
            return k, e
        return att.num_kv_heads, att.head_dim

    @property
    def per_layer_vocab(self) -> int:
        """Rows of Gemma 4's per-layer embedding (``per_layer_vocab_size`` or the vocab)."""
        rows = self.tokens.per_layer_vocab_size
        return self.vocab_size if rows is None else rows

    @property
    def store_head_dim(self) -> int:
        """E*, the head dim every layer's q/k/v/o weights and KV cache are stored at: the
        largest layer's (smaller heads are zero-padded, :mod:`jaxrl_llm.models.padded_heads`)."""
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
        return self.norms.unit_offset or self.family in FLOAT32_NORM_FAMILIES

    @property
    def is_hybrid(self) -> bool:
        """Some layers are Gated DeltaNet linear attention (LINEAR entries in ``layer_types``)."""
        return LayerType.LINEAR in self.attn.layer_types

    @property
    def layer_period(self) -> tuple[LayerType, ...]:
        """The shortest run of layer types that ``layer_types`` repeats a whole number of times
        (a hybrid stack scans these periods); ValueError when none is shorter than the stack."""
        n = len(self.attn.layer_types)
        for p in range(1, n + 1):
            if n % p == 0 and self.attn.layer_types == self.attn.layer_types[:p] * (n // p):
                return self.attn.layer_types[:p]
        return self.attn.layer_types

    @property
    def num_linear_layers(self) -> int:
        """Number of Gated DeltaNet (LINEAR) layers."""
        return sum(t == LayerType.LINEAR for t in self.attn.layer_types)

    @property
    def num_attention_layers(self) -> int:
        """Number of softmax-attention layers (all of them unless the stack is hybrid)."""
        return self.num_layers - self.num_linear_layers

    @property
    def num_kv_layers(self) -> int:
        """Layers a KV cache holds keys/values for: the attention layers but the KV-shared
        ones (``kv_shared_layers``), which read their source layer's."""
        return self.num_attention_layers - self.attn.kv_shared_layers

    @property
    def rotary_dim(self) -> int:
        """Dims of each head RoPE rotates: ``int(head_dim · partial_rotary_factor)``."""
        return int(self.attn.head_dim * self.rope.partial_rotary_factor)

    @property
    def linear_conv_channels(self) -> int:
        """Channels C of a Gated DeltaNet layer's conv: queries, keys, values together."""
        return self.linear.conv_channels

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a sparse mixture of experts (``num_experts > 0``)."""
        return self.moe.num_experts > 0

    @property
    def uses_window(self) -> bool:
        """Some layer attends through a sliding window (the masks then carry positions)."""
        if self.attn.layer_types:
            return LayerType.LOCAL in self.attn.layer_types
        return self.attn.sliding_window is not None

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
        return count_params(self, active=active, stored=stored)

    # ----- presets -------------------------------------------------------------------------
    @classmethod
    def tiny(cls, family: Family | str = Family.LLAMA, **overrides) -> ModelConfig:
        """A tiny random-init config with odd, distinct sizes for unit tests."""
        return cls(**{**TINY_FIELDS[Family(family)](), **overrides})

    @classmethod
    def smollm2_135m(cls, **overrides) -> ModelConfig:
        """SmolLM2-135M(-Instruct): 30 layers, D=576, 9 heads / 3 KV heads, tied, V=49152."""
        return cls(**{**smollm2_135m_fields(), **overrides})

    @classmethod
    def gemma3_270m(cls, **overrides) -> ModelConfig:
        """Gemma 3 270M: 18 layers (5 local : 1 global), D=640, 4 heads / 1 KV head, E=256,
        window 512, tied, V=262144 (:func:`jaxrl_llm.models.families.gemma.presets.gemma3_270m_fields`)."""
        return cls(**{**gemma3_270m_fields(), **overrides})


_TOP_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}


def known_keys() -> list[str]:
    """Every keyword :class:`ModelConfig` takes: its fields (the groups among them) and the old
    flat names (:data:`~jaxrl_llm.models.config_groups.FLAT_NAMES`), sorted."""
    return sorted({*_TOP_FIELDS, *FLAT_NAMES})

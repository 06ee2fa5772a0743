"""Gemma 4 (text) as :class:`~jaxrl_llm.models.ModelConfig` values, and the padded head layout
its mixed attention geometry is stored in.

What transformers' ``Gemma4ForCausalLM`` (transformers 5.23, ``models/gemma4/
modeling_gemma4.py`` and ``configuration_gemma4.py``) computes that Gemma 3 did not, and what
we do with each:

1. RMSNorm is ``x̂ · w`` (a plain weight, initialised at 1; ``Gemma4RMSNorm``), the product in
   float32 — Gemma 3's was ``x̂ · (1 + w)``. Done (``rms_norm_unit_offset=False``; the config's
   ``rms_norm_float32`` says the product is float32).
2. Attention scores are ``q·k`` unscaled (``self.scaling = 1.0``; the q/k RMSNorms set the
   scale) — Gemma 3 divided by √query_pre_attn_scalar. Done (``query_pre_attn_scalar=1``).
3. A scale-free RMSNorm on every value head (``v_norm``, ``with_scale=False``). Done
   (``value_norm``).
4. Full-attention layers have their own head dim (``global_head_dim``, default 512 against the
   sliding layers' 256) and, when ``attention_k_eq_v``, their own KV-head count
   (``num_global_key_value_heads``): transformers' ``per_layer_config``. Done
   (``global_head_dim``, ``global_kv_heads``), stored padded (below).
5. ``attention_k_eq_v``: full-attention layers have no ``v_proj``; the values are the key
   projection's output (before ``k_norm`` and RoPE), then ``v_norm``. Done (``global_k_eq_v``).
6. "Proportional" RoPE on full-attention layers: the first ``int(p · E_g / 2)`` frequency pairs
   rotate with ``1/θ^(2j/E_g)`` (the exponent over the whole head dim), the other pairs are
   position-free; rotate-half over the whole head (p = 0.25, θ = 1M by default; sliding layers
   plain RoPE with θ = 10k). Gemma 3 rotated every pair, with linear scaling on global layers.
   Done (``global_rope_proportion``; a ``factor`` is linear scaling of the rotated pairs).
7. ``layer_scalar``: a stored per-layer scalar (a buffer, not trained by transformers)
   multiplying each layer's output after both residual adds. Done (``layer_scalars``; our
   copy gets no gradient either).
8. Per-layer input embeddings (PLE, ``hidden_size_per_layer_input`` > 0; the E2B / E4B models):
   a second embedding ``[V_ple, L·P]`` (times √P) plus the normed projection of the input
   embedding (times D^-1/2), summed and divided by √2, give each layer a ``[P]`` input per
   token, gated into the residual stream after the MLP (``x + norm(down(act(x W_g) ⊙ p_l))``).
   Done (``per_layer_input_size``, ``per_layer_vocab_size``;
   :func:`jaxrl_llm.models.layer.per_layer_inputs`, ``TokenInfo.per_layer``).
9. KV sharing (``num_kv_shared_layers`` = n > 0; E2B / E4B): the last n layers have no k/v
   projections or k norm and attend over the keys and values of the last earlier layer of
   their type (transformers' ``kv_sharing_modes``: "store" on that layer, "reuse" on the
   shared ones; in a decode step the source layer's cache). Done (``kv_shared_layers``;
   :class:`jaxrl_llm.models.kv_stores.KVShared` around every store hands a shared layer its
   source's keys and points it at the source's cache slots, so caches hold the L − n layers
   that compute keys, ``num_kv_layers``; the shared layers' k/v weights are stored as zeros).
   transformers' shortcut that runs the shared layers on the last position only during
   prefill is an optimisation, not taken.
10. ``use_double_wide_mlp``: the KV-shared layers' MLP is 2·F wide. Done
    (``double_wide_mlp``: ``intermediate_size`` is stored as 2·F and the other layers' second
    half is zero; they compute it, 2× their MLP FLOPs).
11. A mixture-of-experts block beside the dense MLP (``enable_moe_block``; the 26B-A4B model):
    a router on the un-normed residual (scale-free RMSNorm, times a learned ``[D]`` scale and
    D^-1/2, softmax, top-k renormalised, times a per-expert scale), GeGLU experts with a fused
    gate/up tensor, their own pre-norm and post-norm, the two outputs added before the
    layer's post-feed-forward norm. Done (``moe_beside_mlp``,
    :func:`jaxrl_llm.models.layer.dense_and_moe_block`; transformers adds no load-balancing
    loss, so import sets ``router_aux_loss_coef`` to 0).
12. ``layer_types`` default to five sliding layers per full one, and the last layer is always
    full attention (transformers forces it). Done (:func:`default_layer_types`).
13. ``use_bidirectional_attention="all"`` (a non-causal encoder) is refused; ``"vision"`` only
    changes vision tokens, which a text model has none of.
14. Kept from Gemma 3: tanh-GELU GeGLU, √D embedding scale, the four norms per layer, q/k
    RMSNorm, tied embeddings, a sliding window that counts the query itself, the final-logit
    soft cap (``final_logit_softcapping``); Gemma 2's attention-logit cap is gone.

**The padded head layout.** Every layer of our stack runs one compiled body over stacked
weights, so layers must share shapes. A layer whose head dim E or KV-head count K is smaller
than the widest (E* = max(E_sliding, E_global), K* likewise) stores its q/k/v/o weights padded
with zeros to E* and K*: head dim i < E/2 at slot i, i ≥ E/2 at slot E*/2 + (i − E/2) (each
RoPE half padded at its end, so "rotate half" over E* pairs slot i with i + E*/2 as it paired
dim i with i + E/2); KV heads in the first K slots. In the forward, the per-head norms divide
by the layer's own E, the RoPE table of the layer holds zeros past its frequencies, and the K*
cache slots are filled from the layer's K heads (slot s ← head ⌊s·K / K*⌋; query head n then
reads slot ⌊n·K*/H⌋, i.e. head ⌊n·K/H⌋, as grouped-query attention wants). Zero padding stays
zero under training (its gradient is zero). The KV cache and pages are ``[.., K*, E*]`` for
every layer: up to (E*/E)·(K*/K) times what the smaller layers need.

The mapping from and to transformers' ``Gemma4TextConfig`` is
:mod:`jaxrl_llm.interop.hf_config_gemma4`'s; the weights' padding on import and export
:mod:`jaxrl_llm.interop.state_dict_gemma4`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_llm.models.options import Activation, Family, LayerType

#: Gemma 4's end-of-generation tokens: ``<eos>`` (1), ``<turn|>`` (106) and
#: ``<|tool_response>`` (50), as transformers' GGUF reader sets them for Gemma 4.
EOS_TOKEN_IDS = (1, 106, 50)


def default_layer_types(num_layers: int, period: int = 6) -> tuple[LayerType, ...]:
    """``period − 1`` LOCAL layers then one GLOBAL layer, repeated, and the last layer GLOBAL
    (transformers' default ``layer_types`` for Gemma 4, which forces the last one)."""
    types = [
        LayerType.GLOBAL if (i + 1) % period == 0 else LayerType.LOCAL for i in range(num_layers)
    ]
    types[-1] = LayerType.GLOBAL
    return tuple(types)


def common_fields() -> dict[str, Any]:
    """The ModelConfig fields every Gemma 4 text model shares (transformers' classes fix
    them)."""
    return dict(
        family=Family.GEMMA4,
        rms_norm_unit_offset=False,
        post_norms=True,
        mlp_activation=Activation.GELU_TANH,
        scale_embeddings=True,
        qk_norm=True,
        value_norm=True,
        layer_scalars=True,
        query_pre_attn_scalar=1.0,
    )


def gemma4_tiny_fields() -> dict[str, Any]:
    """A tiny random Gemma 4 for tests: 4 layers (sliding, sliding, sliding, full), window 5,
    sliding heads of E=16 with 2 KV heads, full-attention heads of E=24 with 1 KV head whose
    values are their keys, proportional RoPE on a quarter of the full-attention pairs."""
    return dict(
        common_fields(),
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        global_head_dim=24,
        global_kv_heads=1,
        global_k_eq_v=True,
        global_rope_proportion=0.25,
        layer_types=default_layer_types(4, 4),
        sliding_window=5,
        max_position_embeddings=256,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        final_logit_softcap=30.0,
        tie_embeddings=True,
    )


def gemma4_31b_fields() -> dict[str, Any]:
    """ModelConfig fields of Gemma 4 31B (google/gemma-4-31B, text decoder): 60 layers, five
    sliding (window 1024) per full one, D=5376, F=21504, 32 heads; sliding layers 16 KV heads
    of E=256, full layers 4 KV heads of E=512 whose values are their keys; V=262144, tied,
    final soft cap 30; 30.7B parameters. The sizes are those the model's published card and
    config describe (as quoted by third-party conversions: the Core AI port's model card,
    huggingface.co/mlboydaisuke/Gemma-4-31B-CoreAI, and apxml.com/models/gemma-4-31b); the
    RoPE values (θ 1M proportional with p = 0.25 on full layers, 10k on sliding ones) are
    transformers' ``Gemma4TextConfig`` defaults, assumed unchanged."""
    return dict(
        common_fields(),
        vocab_size=262144,
        hidden_size=5376,
        intermediate_size=21504,
        num_layers=60,
        num_heads=32,
        num_kv_heads=16,
        head_dim=256,
        global_head_dim=512,
        global_kv_heads=4,
        global_k_eq_v=True,
        global_rope_proportion=0.25,
        layer_types=default_layer_types(60),
        sliding_window=1024,
        max_position_embeddings=262144,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        final_logit_softcap=30.0,
        tie_embeddings=True,
        bos_token_id=2,
        eos_token_ids=EOS_TOKEN_IDS,
        pad_token_id=0,
    )


# ----- the padded head layout ------------------------------------------------------------------


def head_dim_slots(e: int, e_store: int) -> np.ndarray:
    """``[E]`` int: the slot of each of a head's E dims in a head of E* = ``e_store`` slots
    (each RoPE half padded at its end)."""
    if e % 2 or e_store % 2 or e > e_store:
        raise ValueError(f"head dims must be even with E={e} <= E*={e_store}")
    half = np.arange(e // 2)
    return np.concatenate([half, e_store // 2 + half])


def pad_heads(w: np.ndarray, heads_axis: int | None, dim_axis: int, n_store: int, e_store: int):
    """``w`` with its heads axis (None: no heads axis) padded with zero heads to ``n_store``
    and its head-dim axis spread into ``e_store`` slots (:func:`head_dim_slots`)."""
    w = np.asarray(w)
    shape = list(w.shape)
    slots = head_dim_slots(shape[dim_axis], e_store)
    shape[dim_axis] = e_store
    if heads_axis is not None:
        shape[heads_axis] = n_store
    out = np.zeros(shape, w.dtype)
    index: list[Any] = [slice(None)] * w.ndim
    index[dim_axis] = slots
    if heads_axis is not None:
        index[heads_axis] = slice(0, w.shape[heads_axis])
    out[tuple(index)] = w
    return out


def unpad_heads(w: np.ndarray, heads_axis: int | None, dim_axis: int, n: int, e: int):
    """Inverse of :func:`pad_heads`: the first ``n`` heads and the ``e`` dims of each."""
    w = np.asarray(w)
    w = np.take(w, head_dim_slots(e, w.shape[dim_axis]), axis=dim_axis)
    if heads_axis is not None:
        w = np.take(w, np.arange(n), axis=heads_axis)
    return w


def kv_slot_heads(k: int, k_store: int) -> np.ndarray:
    """``[K*]`` int: the KV head of a layer with ``k`` heads that fills each of the
    ``k_store`` cache slots (``⌊s·k / K*⌋``)."""
    if k_store % k:
        raise ValueError(f"KV heads {k} must divide the stored {k_store}")
    return np.arange(k_store) * k // k_store

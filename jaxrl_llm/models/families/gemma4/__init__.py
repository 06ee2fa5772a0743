"""Gemma 4 (text), as transformers' ``Gemma4ForCausalLM`` implements it.

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
    full attention (transformers forces it). Done (:func:`.presets.default_layer_types`).
13. ``use_bidirectional_attention="all"`` (a non-causal encoder) is refused; ``"vision"`` only
    changes vision tokens, which a text model has none of.
14. Kept from Gemma 3: tanh-GELU GeGLU, √D embedding scale, the four norms per layer, q/k
    RMSNorm, tied embeddings, a sliding window that counts the query itself, the final-logit
    soft cap (``final_logit_softcapping``); Gemma 2's attention-logit cap is gone.

Those are features of the shared layer; this folder holds only what is Gemma 4's own:

- :mod:`.presets`: the fields every Gemma 4 shares, the tiny test size and Gemma 4 31B;
- :mod:`.hf_config`: transformers' ``Gemma4TextConfig`` keys both ways;
- :mod:`.weights`: the names and layouts of its fused experts and of the router scales and
  norms of its MoE block beside the MLP, both ways.

Its mixed head sizes are stored in the shared padded layout (:mod:`jaxrl_llm.models.padded_heads`);
the padding on import and export, its per-layer-input tensors and the k/v tensors that
KV-shared layers lack are :mod:`jaxrl_llm.interop.state_dict_gemma4`'s (the shared mapping
asks the config's features, not the family).
"""

"""Qwen3.5 and Qwen3.5-MoE (text), as transformers' ``Qwen3_5ForCausalLM`` /
``Qwen3_5MoeForCausalLM`` implement them.

Qwen3.5's decoder is a hybrid (Qwen Team 2026, the Qwen3-Next / Qwen3.5 model cards): of every
four layers, three mix tokens with Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh
2024, https://arxiv.org/abs/2412.06464; :mod:`jaxrl_llm.models.gated_deltanet`) and the fourth
with softmax attention whose output is gated per head by σ(h W_gate), with q/k RMSNorm and RoPE
on the first quarter of each head's dims (``partial_rotary_factor`` 0.25). Every RMSNorm outside
the linear layers is ``x / rms(x) · (1 + w)`` in float32 (weights stored as w, initialised at
zero; :func:`jaxrl_llm.models.layer.rms_norm` with ``unit_offset``); the linear layers' output
norm is a plain-weight RMSNorm gated by SiLU(z). Qwen3.5-MoE (``qwen3_5_moe_text``) replaces
every layer's MLP by a sparse mixture of experts (softmax router, top-k renormalised) plus a
shared expert gated by σ(h W_sg).

Those are features of the shared layer (``LayerType.LINEAR``, ``ModelConfig.attn_output_gate``,
``rms_norm_unit_offset``, ``shared_expert_size``); this folder holds only what is Qwen3.5's own:

- :mod:`.presets`: the fields every Qwen3.5 shares, the tiny test sizes and the published
  Qwen3.5-9B / -35B-A3B sizes;
- :mod:`.hf_config`: transformers' ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` keys both
  ways;
- :mod:`.weights`: its weight names and layouts both ways (the Gated DeltaNet layers, the
  output gate inside ``q_proj``, the shared expert).
"""

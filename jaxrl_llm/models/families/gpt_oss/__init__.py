"""gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card",
https://arxiv.org/abs/2508.10925), as transformers' ``GptOssForCausalLM`` implements it.

Every layer: attention with a learned sink logit per head, q/k/v/o biases, YaRN RoPE, sliding
(128) and full attention alternating by ``layer_types``; then a sparse MoE block whose router has
a bias and takes the softmax over its top-k logits, and whose experts have biases and compute
the clamped SwiGLU ``(clip(up, ±7) + 1) · g·σ(1.702 g)``, ``g = min(gate, 7)``. Those are
features of the shared layer (``ModelConfig.attention_sinks``, ``attention_out_bias``,
``expert_bias``, ``Activation.CLAMPED_SWIGLU``, ``RopeScaling.YARN``); this folder holds only
what is gpt-oss's own:

- :mod:`.presets`: tiny, gpt-oss-20b and gpt-oss-120b sizes;
- :mod:`.hf_config`: transformers' ``GptOssConfig`` keys both ways;
- :mod:`.weights`: its weight names and layouts both ways, and the MXFP4 expert weights of the
  released checkpoints, dequantised on import (:func:`.weights.dequantize_mxfp4`).
"""

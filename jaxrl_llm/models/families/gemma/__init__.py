"""Gemma 2 and Gemma 3 (text), as transformers' ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM``
implement them.

The decoder in :mod:`jaxrl_llm.models.transformer` runs Gemma through config fields whose
defaults are the Llama behaviour; this folder says which values make a Gemma:

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
at zero), which :func:`jaxrl_llm.models.layer.rms_norm` does with ``unit_offset``.

This folder holds only what is Gemma 2 / 3's own:

- :mod:`.presets`: the fields that make a Gemma, the tiny test sizes and Gemma 3 270M;
- :mod:`.hf_config`: transformers' ``Gemma2Config`` / ``Gemma3TextConfig`` keys both ways;
- :mod:`.chat`: the chat template a Gemma tokenizer without one gets;
- :mod:`.vision` (with :mod:`.vision_config` and :mod:`.vision_weights`): Gemma 3's image
  encoder (SigLIP), projector and soft-token insertion, its config and weight names.

Their weights have Llama's names plus the four norms around attention and the MLP, which the
shared mapping (:mod:`jaxrl_llm.interop.state_dict`) names by the ``post_norms`` feature
(Gemma 4 has them too).
"""

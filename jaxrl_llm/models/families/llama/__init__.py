"""Llama (1 / 2 / 3, SmolLM2), Mistral, Qwen2 / 2.5 and Qwen3, as transformers'
``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM``
implement them: the layout every other family starts from.

One folder for four families, because they share everything but a few config facts: the same
weight names (``model.layers.{i}.self_attn.q_proj.weight``, ... : the shared mapping in
:mod:`jaxrl_llm.interop.state_dict` is exactly theirs, so they have no ``weights.py``), the
same ``config.json`` keys, and the same layer. What tells them apart is a row each here:

- Qwen2 has q/k/v biases (``attention_bias`` defaults to true, and transformers' class always
  has them); Qwen3 a per-head q/k RMSNorm;
- Mistral reads ``sliding_window`` as given; Qwen2 / 3 only when ``use_sliding_window``;
- Llama 3's RoPE scaling and linear scaling are read and written for all four.

- :mod:`.presets`: the tiny test sizes (shared with the MoE families of :mod:`..llama_moe`) and
  SmolLM2-135M;
- :mod:`.hf_config`: transformers' config keys both ways, the architecture names, and the
  checks of what the shared layer does not implement (a non-SiLU MLP, MLP biases, mixed
  per-layer attention types, a classifier with more than one label).
"""

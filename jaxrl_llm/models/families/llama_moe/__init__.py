"""Qwen3-MoE and Mixtral, as transformers' ``Qwen3MoeForCausalLM`` and
``MixtralForCausalLM`` implement them: the Llama layout (:mod:`..llama`: Qwen3-MoE is Qwen3's,
with its q/k norm; Mixtral is Mistral's) with a sparse mixture of experts in every layer's MLP
(:mod:`jaxrl_llm.models.moe`).

One folder for both, because they differ only in their expert keys and names:

- :mod:`.presets`: their tiny test sizes (8 experts, top-2);
- :mod:`.hf_config`: the expert keys of ``Qwen3MoeConfig`` / ``MixtralConfig`` both ways (the
  rest are the Llama layout's, :mod:`..llama.hf_config`), and the architecture names;
- :mod:`.weights`: the per-expert checkpoint names (``mlp.experts.{j}.gate_proj`` or
  ``block_sparse_moe.experts.{j}.w1``), which the shared expert mapping
  (:mod:`jaxrl_llm.interop.state_dict_moe`) asks through the family's entry.
"""

"""Qwen3-MoE and Mixtral's per-expert checkpoint names, which the shared expert mapping
(:mod:`jaxrl_llm.interop.state_dict_moe`) asks through the family's entry
(:attr:`~jaxrl_llm.models.families.registry.FamilyEntry.expert_names`); every other tensor has
the Llama layout's name (:mod:`jaxrl_llm.interop.state_dict`).

transformers' ``save_pretrained`` writes one ``nn.Linear`` per expert, inside
``model.layers.{i}.``: ``mlp.experts.{j}.{gate,up,down}_proj`` with the router ``mlp.gate``
(Qwen3-MoE), ``block_sparse_moe.experts.{j}.w1 / w3 / w2`` (gate / up / down) with the router
``block_sparse_moe.gate`` (Mixtral). Plain strings: it imports only the options."""

from __future__ import annotations

from jaxrl_llm.models.options import Family

#: Family -> (block prefix, gate, up, down) of its per-expert checkpoint names.
EXPERT_NAMES: dict[Family, tuple[str, str, str, str]] = {
    Family.QWEN3_MOE: ("mlp", "gate_proj", "up_proj", "down_proj"),
    Family.MIXTRAL: ("block_sparse_moe", "w1", "w3", "w2"),
}

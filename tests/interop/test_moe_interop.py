"""Qwen3-MoE and Mixtral import / export (jaxrl_llm.interop): transformers' in-memory (fused
experts) and on-disk (one tensor per expert) state dicts both import to the same params, and
an export loads in transformers with the same logits and comes back bit for bit."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.errors import ModelLoadError
from tests.interop._tiny import tiny_tokenizer, tokens_and_mask, torch_logits
from tests.models.test_moe import tiny_moe_hf

# variant -> (a per-expert checkpoint name of layer 1, expert 7)
ON_DISK = {
    "qwen3_moe": "model.layers.1.mlp.experts.7.down_proj.weight",
    "mixtral": "model.layers.1.block_sparse_moe.experts.7.w2.weight",
}


def _positions(mask):
    return np.asarray(M.default_positions(jnp.asarray(mask)))


def _logits(params, config, toks, mask):
    fn = jax.jit(M.forward, static_argnames=("config",))
    logits, _ = fn(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    return np.asarray(logits)


@pytest.mark.parametrize("variant", sorted(ON_DISK))
def test_import_export_round_trip(tmp_path, variant):
    hf = tiny_moe_hf(variant, seed=5)
    in_memory = interop.from_hf_model(hf)  # transformers >= 5: experts fused per layer
    assert "model.layers.0.mlp.experts.gate_up_proj" in hf.state_dict()
    hf.save_pretrained(tmp_path / "hf")  # one tensor per expert, as the Hub stores them
    on_disk = interop.load_model(tmp_path / "hf")
    assert on_disk.config == in_memory.config
    jax.tree.map(np.testing.assert_array_equal, on_disk.params, in_memory.params)

    # Our own weights (not transformers' init) out and back.
    config = in_memory.config
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape),
        in_memory.params,
    )
    state_dict = interop.params_to_hf_state_dict(params, config)
    assert ON_DISK[variant] in state_dict
    out = tmp_path / "export"
    interop.export_hf(out, config=config, params=params, tokenizer=tiny_tokenizer())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [M.HF_ARCHITECTURES[config.family][0]]
    back_hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    toks, mask = tokens_and_mask(seed=6)
    ref = torch_logits(back_hf.eval(), toks, mask, _positions(mask))
    got = _logits(params, config, toks, mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=1e-4, rtol=0)
    back = interop.load_model(out)
    assert back.config == config
    jax.tree.map(np.testing.assert_array_equal, back.params, params)


def test_missing_expert_names_the_tensor():
    hf = tiny_moe_hf("mixtral")
    sd = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.experts.down_proj" not in k}
    with pytest.raises(ModelLoadError, match="layers.1.mlp.experts.down_proj"):
        interop.params_from_hf_state_dict(sd, interop.from_hf_model(hf).config)

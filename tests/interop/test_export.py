import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from tests.interop._tiny import (
    VARIANTS,
    tiny_hf_model,
    tiny_tokenizer,
    tokens_and_mask,
    torch_logits,
)


def _positions(mask):
    return np.asarray(M.default_positions(jnp.asarray(mask)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_loads_in_transformers_with_identical_logits(tmp_path, variant):
    # our own random init (not transformers'), so export is tested on its own
    config = interop.from_hf_model(tiny_hf_model(variant)).config
    params = M.init_params(config, jax.random.PRNGKey(11))
    params = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
    )  # norms away from 1, biases away from 0
    interop.export_hf(tmp_path, config=config, params=params, tokenizer=tiny_tokenizer())
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "float32"
    assert cfg["architectures"] == [M.HF_ARCHITECTURES[config.family][0]]
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == cfg["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    toks, mask = tokens_and_mask(seed=6)
    ref = torch_logits(hf.eval(), toks, mask, _positions(mask))
    got, _ = M.forward(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got)[mask], ref[mask], atol=1e-4, rtol=0)
    # and back into jaxrl_llm: bit-identical params, same config
    back = interop.load_model(tmp_path)
    assert back.config == config
    jax.tree.map(np.testing.assert_array_equal, back.params, params)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 2)


@pytest.mark.parametrize("variant", ["llama_untied", "qwen2", "qwen3"])
def test_scalar_head_exports_as_sequence_classifier(tmp_path, variant):
    base = interop.from_hf_model(tiny_hf_model(variant)).config
    import dataclasses

    config = dataclasses.replace(base, num_labels=1, tie_embeddings=True)
    params = M.init_params(config, jax.random.PRNGKey(3))
    params["score_head"]["kernel"] = params["score_head"]["kernel"] * 20.0
    interop.export_hf(tmp_path, config=config, params=params)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [M.HF_ARCHITECTURES[config.family][1]]
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    toks, mask = tokens_and_mask(seed=8)
    with torch.no_grad():
        ref = hf.eval()(
            input_ids=torch.tensor(toks),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(_positions(mask)),
        ).logits.numpy()
    assert ref.shape == (3, 1)
    out = M.apply(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    got = np.asarray(out.scalar)[:, -1]  # right-aligned rows: the last token is real
    assert np.abs(got).max() > 1e-2
    np.testing.assert_allclose(got, ref[:, 0], atol=1e-4, rtol=0)
    back = interop.load_model(tmp_path)
    assert back.config.num_labels == 1
    np.testing.assert_array_equal(
        back.params["score_head"]["kernel"], params["score_head"]["kernel"]
    )


def test_bfloat16_export(tmp_path):
    config = interop.from_hf_model(tiny_hf_model("qwen3")).config
    params = M.init_params(config, jax.random.PRNGKey(0))
    interop.export_hf(tmp_path, config=config, params=params, dtype="bfloat16")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto")
    assert next(hf.parameters()).dtype == torch.bfloat16
    back = interop.load_model(tmp_path)
    np.testing.assert_array_equal(
        back.params["embed"]["embedding"],
        np.asarray(params["embed"]["embedding"].astype(jnp.bfloat16).astype(jnp.float32)),
    )


def test_tokenizer_and_chat_template_round_trip(tmp_path):
    tok = tiny_tokenizer()
    config = interop.from_hf_model(tiny_hf_model("llama_tied")).config
    params = M.init_params(config, jax.random.PRNGKey(0))
    interop.export_hf(tmp_path, config=config, params=params, tokenizer=tok)
    back = interop.load_model(tmp_path).tokenizer
    msgs = [{"role": "user", "content": "w3 w4 w5"}]
    a = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert back.chat_template == tok.chat_template
    assert back.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == a
    assert back(a)["input_ids"] == tok(a)["input_ids"] == [3, 9, 10, 11, 2, 4]


def test_export_rejects_inexpressible_configs(tmp_path):
    from jaxrl_llm.errors import ModelLoadError

    config = M.ModelConfig.tiny("llama", qk_norm=True)
    with pytest.raises(ModelLoadError, match="Llama has no q/k norm"):
        interop.export_hf(
            tmp_path, config=config, params=M.init_params(config, jax.random.PRNGKey(0))
        )
    config = M.ModelConfig.tiny("qwen2", attention_bias=False)
    with pytest.raises(ModelLoadError, match="Qwen2 always has q/k/v biases"):
        interop.export_hf(
            tmp_path, config=config, params=M.init_params(config, jax.random.PRNGKey(0))
        )

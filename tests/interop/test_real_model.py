"""SmolLM2-135M-Instruct through the alias, against transformers' own GGUF loading."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPTS = [
    "What is 17 + 25? Reply with just the number.",
    "Name the capital of France.",
    "Write one short sentence about the sea.",
    "hi",
]


def _batch(tok):
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in PROMPTS
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="np", padding=True)
    return enc["input_ids"], enc["attention_mask"].astype(bool)


def _torch_logits(model, ids, mask):
    pos = np.asarray(M.default_positions(jnp.asarray(mask)))
    with torch.no_grad():
        return (
            model(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask.astype(np.int64)),
                position_ids=torch.tensor(pos),
            )
            .logits.float()
            .numpy()
        )


@pytest.fixture(scope="module")
def ours_and_ref(real_model):
    config, params, tok = real_model.loaded
    ids, mask = _batch(tok)
    ours, _ = jax.jit(lambda p, t, m: M.forward(p, t, config=config, attention_mask=m))(
        params, jnp.asarray(ids), jnp.asarray(mask)
    )
    return ids, mask, np.asarray(ours), _torch_logits(real_model.torch_model, ids, mask)


def test_alias_config_params_and_cache(real_model):
    config, params, tok = real_model.loaded
    assert config == M.ModelConfig.smollm2_135m(rms_norm_eps=config.rms_norm_eps)
    assert abs(config.rms_norm_eps - 1e-5) < 1e-9
    assert config.num_params() == sum(x.size for x in jax.tree.leaves(params))
    # the converted params equal transformers' de-quantised GGUF weights exactly
    direct = interop.from_hf_model(real_model.torch_model).params
    jax.tree.map(np.testing.assert_array_equal, params, direct)
    # the cache: one HF directory, no temp leftovers, no quantization_config, fast second load
    entries = list((real_model.cache_root / "gguf").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".")
    names = {p.name for p in entries[0].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    cfg = json.loads((entries[0] / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    assert real_model.second_s < real_model.first_s
    assert real_model.second_s < 20.0, real_model.second_s


def test_logits_match_transformers_on_chat_prompts(ours_and_ref):
    ids, mask, ours, ref = ours_and_ref
    assert ids.shape[0] == 4 and not mask.all()  # a padded batch
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-3, rtol=0)
    last = ours[:, -1].argmax(-1)
    assert np.array_equal(last, ref[:, -1].argmax(-1))


def test_tokenizer_has_chat_template(real_model):
    tok = real_model.loaded.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text


def test_export_reload_same_logits_and_tokenizer(real_model, ours_and_ref, tmp_path):
    config, params, tok = real_model.loaded
    ids, mask, ours, _ = ours_and_ref
    interop.export_hf(tmp_path, config=config, params=params, tokenizer=tok)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in cfg
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    np.testing.assert_allclose(
        _torch_logits(hf.eval(), ids, mask)[mask], ours[mask], atol=1e-3, rtol=0
    )
    tok2 = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tok2.chat_template == tok.chat_template
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    assert tok2.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    ) == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok2(PROMPTS[1])["input_ids"] == tok(PROMPTS[1])["input_ids"]

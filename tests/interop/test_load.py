import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.errors import ModelLoadError
from tests.interop._tiny import tiny_hf_model, tiny_tokenizer, tokens_and_mask, torch_logits


def _save(tmp_path, variant="qwen3", *, shard=False, tokenizer=True, seed=0, **kw):
    """A Hugging Face directory written by transformers itself (independent of our export)."""
    hf = tiny_hf_model(variant, seed=seed, **kw)
    d = tmp_path / variant
    hf.save_pretrained(d, max_shard_size="20KB" if shard else "5GB")
    if tokenizer:
        tiny_tokenizer().save_pretrained(d)
    return hf, d


@pytest.mark.parametrize("shard", [False, True])
def test_load_hf_dir_matches_transformers(tmp_path, shard):
    hf, d = _save(tmp_path, "qwen3", shard=shard)
    assert (d / "model.safetensors.index.json").is_file() == shard
    config, params, tok = interop.load_model(d)
    assert config.family == M.Family.QWEN3 and config.qk_norm
    toks, mask = tokens_and_mask(seed=3)
    ref = torch_logits(hf, toks, mask, np.asarray(M.default_positions(jnp.asarray(mask))))
    got, _ = M.forward(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got)[mask], ref[mask], atol=1e-4, rtol=0)
    assert tok is not None and "assistant" in tok.chat_template


def test_param_dtype_and_compute_dtype(tmp_path):
    _, d = _save(tmp_path, "llama_tied", tokenizer=False)
    config, params, tok = interop.load_model(str(d), param_dtype="bfloat16")
    assert tok is None
    assert config.param_dtype == config.compute_dtype == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    config, params, _ = interop.load_model(d, compute_dtype="bfloat16")
    assert (config.param_dtype, config.compute_dtype) == ("float32", "bfloat16")
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}


def test_load_transformers_object_including_sequence_classifier():
    hf = tiny_hf_model("mistral", seq_cls=True, seed=7)
    config, params, tok = interop.load_model(hf)
    assert config.num_labels == 1 and tok is None
    toks, mask = tokens_and_mask(seed=4)
    import torch

    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(toks),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(np.asarray(M.default_positions(jnp.asarray(mask)))),
        ).logits.numpy()[:, 0]
    out = M.apply(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out.scalar)[:, -1], ref, atol=1e-4, rtol=0)


# ----- bad inputs: one clear ModelLoadError each ------------------------------------------------


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match=r"nope: no such file or directory"):
        interop.load_model(tmp_path / "nope")


def test_config_without_weights(tmp_path):
    hf, d = _save(tmp_path, "llama_tied", tokenizer=False)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"llama_tied: no \*\.safetensors weights"):
        interop.load_model(d)
    (d / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match="pickle files are never loaded"):
        interop.load_model(d)


def test_directory_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"empty: no config\.json"):
        interop.load_model(tmp_path / "empty")


def test_unsupported_architecture(tmp_path):
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2})
    )
    with pytest.raises(
        ModelLoadError,
        match=r"gpt2/config\.json: unsupported architecture "
        r"model_type='gpt2'",
    ):
        interop.load_model(d)


def test_invalid_json_config(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: invalid JSON"):
        interop.load_model(d)


def test_gguf_of_an_architecture_transformers_does_not_convert(tmp_path):
    """Qwen3.5 GGUF files exist (the gguf package names the architecture ``qwen35``), but
    transformers 5.23, through which GGUF files are read, does not convert them: one line that
    names the architecture and what to use instead."""
    import gguf

    f = tmp_path / "q35.gguf"
    w = gguf.GGUFWriter(str(f), "qwen35")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert interop.load.gguf_architecture(f) == "qwen35"
    with pytest.raises(ModelLoadError, match=r"GGUF architecture 'qwen35' is not one that"):
        interop.load_model(f)


def test_file_that_is_not_gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(ModelLoadError, match=r"model\.gguf: not a GGUF file"):
        interop.load_model(f)
    g = tmp_path / "notes.txt"
    g.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"notes\.txt: not a model source"):
        interop.load_model(g)


def test_truncated_safetensors(tmp_path):
    _, d = _save(tmp_path, "qwen2", tokenizer=False)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(
        ModelLoadError,
        match=r"model\.safetensors: not a readable safetensors "
        r"file \(truncated or corrupt\?\)",
    ):
        interop.load_model(d)


def test_sharded_index_pointing_to_missing_shard(tmp_path):
    _, d = _save(tmp_path, "qwen2", shard=True, tokenizer=False)
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(
        ModelLoadError,
        match=rf"{shard.name}: listed in model\.safetensors\."
        r"index\.json but missing",
    ):
        interop.load_model(d)


def test_alias_typo_says_did_you_mean():
    """Issue 42: a typo of an alias names the closest one, both as a model source and as an
    alias."""
    with pytest.raises(ModelLoadError, match=r"did you mean 'smollm2-135m-instruct'\?"):
        interop.load_model("smollm2-135m")
    with pytest.raises(ModelLoadError, match=r"did you mean 'gemma3-270m'\?"):
        interop.resolve_alias("gemma-270m")
    with pytest.raises(ModelLoadError) as far:  # nothing close: no guess
        interop.load_model("no-such-model-here")
    assert "did you mean" not in str(far.value)


def test_alias_errors(monkeypatch):
    with pytest.raises(ModelLoadError, match="unknown model alias 'nope'"):
        interop.resolve_alias("nope")
    monkeypatch.setitem(
        interop.MODEL_ALIASES,
        "fake-alias",
        ("jaxrl_no_such_package_xyz", "m.gguf", "pip install --no-deps fake"),
    )
    with pytest.raises(
        ModelLoadError,
        match=r"needs the 'jaxrl_no_such_package_xyz' package: "
        r"run `pip install --no-deps fake`",
    ):
        interop.load_model("fake-alias")


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXRL_LLM_CACHE", str(tmp_path / "c"))
    assert interop.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("JAXRL_LLM_CACHE")
    assert interop.cache_dir().parts[-2:] == (".cache", "jaxrl_llm")

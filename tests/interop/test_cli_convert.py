"""``jaxrl-llm convert`` end to end through jaxrl_llm.cli.main.main."""

import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.cli.main import main
from tests.interop._tiny import tiny_hf_model, tiny_tokenizer, tokens_and_mask, torch_logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_convert_hf_dir(tmp_path, capsys, dtype):
    hf = tiny_hf_model("qwen2", seed=9)
    src = tmp_path / "src"
    hf.save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--to", "hf", "--dtype", dtype]) == 0
    printed = capsys.readouterr().out
    assert f"-> {out}" in printed and "model.safetensors" in printed and "config.json" in printed
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["torch_dtype"] == dtype and cfg["architectures"] == ["Qwen2ForCausalLM"]
    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype="float32"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    toks, mask = tokens_and_mask(seed=2)
    pos = np.asarray(M.default_positions(jnp.asarray(mask)))
    tol = 1e-4 if dtype == "float32" else 0.1
    np.testing.assert_allclose(
        torch_logits(reloaded, toks, mask, pos)[mask],
        torch_logits(hf, toks, mask, pos)[mask],
        atol=tol,
        rtol=0,
    )
    assert (
        transformers.AutoTokenizer.from_pretrained(out).chat_template
        == tiny_tokenizer().chat_template
    )


def test_convert_errors_are_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxrl-llm convert: error:") and "missing: no such file" in err
    assert "\n" not in err
    with pytest.raises(SystemExit):
        main(["convert", "a", "b", "--to", "gguf"])


def test_checkpoint_dir_uses_restore_model(tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "run" / "checkpoints"
    (ckpt / "100").mkdir(parents=True)
    config = M.ModelConfig.tiny("qwen3")
    params = M.init_params(config, jax.random.PRNGKey(0))
    calls = []

    def restore_model(path):
        calls.append(path)
        return config, params, None

    fake = types.ModuleType("jaxrl_llm.train.run.checkpoint")
    fake.restore_model = restore_model
    monkeypatch.setitem(sys.modules, "jaxrl_llm.train.run.checkpoint", fake)
    out = tmp_path / "hf"
    assert main(["convert", str(ckpt), str(out)]) == 0
    assert calls == [str(ckpt)]
    back = interop.load_model(out)
    assert back.config == config
    jax.tree.map(np.testing.assert_array_equal, back.params, params)


def test_checkpoint_dir_without_restore_support_is_a_clear_error(tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt"
    (ckpt / "_CHECKPOINT_METADATA").parent.mkdir(parents=True)
    (ckpt / "_CHECKPOINT_METADATA").write_text("{}")
    monkeypatch.setitem(
        sys.modules,
        "jaxrl_llm.train.run.checkpoint",
        types.ModuleType("jaxrl_llm.train.run.checkpoint"),
    )
    assert main(["convert", str(ckpt), str(tmp_path / "o")]) == 2
    assert "restore_model is missing" in capsys.readouterr().err

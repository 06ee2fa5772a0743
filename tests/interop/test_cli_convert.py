"""``jaxrl-llm convert`` end to end through jaxrl_llm.cli.main.main."""

import json

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


def _full_checkpoint(root, step=3):
    """A full-weights checkpoint root written by the trainer's CheckpointManager."""
    from jaxrl_llm.train import CheckpointManager, TrainState

    config = M.ModelConfig.tiny("qwen3")
    params = M.init_params(config, jax.random.PRNGKey(0))
    state = TrainState(
        params=params, opt_state=params, step=jnp.asarray(step), rng=jax.random.PRNGKey(1)
    )
    with CheckpointManager(root, model_config=config, async_save=False) as mgr:
        mgr.save(step, state, force=True)
    return config, params


@pytest.mark.parametrize("layout", ["run", "checkpoints", "step"])
def test_run_and_checkpoint_dirs_of_full_weights(tmp_path, capsys, layout):
    run = tmp_path / "run"
    config, params = _full_checkpoint(run / "checkpoints")
    src = {"run": run, "checkpoints": run / "checkpoints", "step": run / "checkpoints" / "3"}
    out = tmp_path / "hf"
    assert main(["convert", str(src[layout]), str(out)]) == 0
    printed = capsys.readouterr().out
    kind = "run directory" if layout == "run" else "checkpoint directory"
    assert f"found {kind}" in printed and "checkpoint step 3" in printed
    back = interop.load_model(out)
    assert back.config.num_layers == config.num_layers
    jax.tree.map(np.testing.assert_array_equal, back.params, params)


def test_run_dir_without_checkpoints_names_what_to_do(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "5.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save
    assert main(["convert", str(run), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no finalised checkpoint under checkpoints/" in err and "jaxrl-llm convert" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["convert", str(empty), str(tmp_path / "o2")]) == 2
    assert "not a model: no config.json" in capsys.readouterr().err


def test_int_weights_are_refused_and_nan_weights_counted(tmp_path, capsys):
    """Issue 31 item 7: an int32 tensor is refused by name; NaN weights are a warning with
    their count."""
    from safetensors.numpy import load_file, save_file

    hf = tiny_hf_model("qwen3", seed=2)
    src = tmp_path / "src"
    hf.save_pretrained(src)
    weights = load_file(src / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    good = dict(weights)
    weights[name] = weights[name].astype(np.int32)
    save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    assert main(["convert", str(src), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert name in err and "int32" in err and "floating point" in err
    good[name] = good[name].copy()
    good[name][0, :5] = np.nan
    good["model.norm.weight"] = good["model.norm.weight"].copy()
    good["model.norm.weight"][:2] = np.nan
    save_file(good, src / "model.safetensors", metadata={"format": "pt"})
    assert main(["convert", str(src), str(tmp_path / "o3")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "7 NaN weight value(s) in 2 tensor(s)" in err and name in err


def test_adapter_only_on_full_weights_says_why(tmp_path, capsys):
    _full_checkpoint(tmp_path / "run" / "checkpoints")
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "o"), "--adapter-only"]) == 2
    err = capsys.readouterr().err
    assert "holds full weights, not LoRA adapters" in err and len(err.strip().splitlines()) == 1

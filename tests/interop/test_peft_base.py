"""A PEFT adapter names a base peft can load (interop/peft.py): a model alias is written as the
hub id it was made from, with the alias noted beside it for this package's own reader; and
``AutoPeftModelForCausalLM`` loads the adapter from a local hub cache (a temporary HF_HOME)."""

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.interop.peft import BASE_NOTE, peft_base_model, read_peft_adapter

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _adapter(tmp_path, base):
    config = M.ModelConfig.tiny("llama")
    lora = M.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    adapters = jax.tree.map(lambda x: x + 0.01, M.init_lora(config, lora, jax.random.PRNGKey(0)))
    out = tmp_path / "adapter"
    written = interop.export_peft_adapter(
        out, config=config, adapters=adapters, lora=lora, base_model=base
    )
    return config, out, written


def test_an_alias_base_is_written_as_its_hub_id_and_read_back_as_the_alias(tmp_path):
    assert peft_base_model("smollm2-135m-instruct") == HF_ID
    assert peft_base_model("/some/dir") == "/some/dir" and peft_base_model(None) is None
    _, out, written = _adapter(tmp_path, "smollm2-135m-instruct")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == HF_ID
    assert out / BASE_NOTE in written
    assert read_peft_adapter(out).base_model == "smollm2-135m-instruct"
    # a path base is written as it is, and a stale note goes
    _, out, written = _adapter(tmp_path, str(tmp_path / "base"))
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tmp_path / "base"
    )
    assert not (out / BASE_NOTE).exists() and len(written) == 2
    assert read_peft_adapter(out).base_model == str(tmp_path / "base")


def test_auto_peft_model_loads_the_adapter_from_a_local_hub_cache(tmp_path):
    pytest.importorskip("peft")
    config, out, _ = _adapter(tmp_path, "smollm2-135m-instruct")
    # the base in a hub cache: models--<org>--<name>/snapshots/<rev>/ and refs/main
    repo = tmp_path / "hf" / "hub" / ("models--" + HF_ID.replace("/", "--"))
    interop.export_hf(
        repo / "snapshots" / ("0" * 40),
        config=config,
        params=M.init_params(config, jax.random.PRNGKey(1)),
    )
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    # huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when imported: a fresh process
    script = (
        "import sys, peft\n"
        "m = peft.AutoPeftModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print(m.peft_config['default'].base_model_name_or_path)\n"
        "print(sum('lora_A' in n for n, _ in m.named_parameters()))\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [HF_ID, str(2 * config.num_layers)]


def test_a_relative_base_is_found_next_to_the_adapter_past_an_unrelated_folder(
    tmp_path, monkeypatch
):
    # "../base" from the working directory is an empty folder; next to the adapter it is the
    # model: the model wins (a worktree named base beside the checkout broke this once)
    from pathlib import Path

    from jaxrl_llm.interop.load import peft_base_dir
    from jaxrl_llm.interop.peft import PeftAdapter

    (tmp_path / "model" / "base").mkdir(parents=True)
    (tmp_path / "model" / "base" / "config.json").write_text("{}")
    adapter_dir = tmp_path / "model" / "adapter"
    adapter_dir.mkdir()
    (tmp_path / "here" / "cwd").mkdir(parents=True)
    (tmp_path / "here" / "base").mkdir()  # the shadow: no config.json
    monkeypatch.chdir(tmp_path / "here" / "cwd")
    adapter = PeftAdapter(path=adapter_dir, base_model="../base", scale=1.0, weights={})
    assert peft_base_dir(adapter).resolve() == (tmp_path / "model" / "base").resolve()
    # with no model anywhere, the folder that exists is returned (loading it says what is
    # missing)
    (tmp_path / "model" / "base" / "config.json").unlink()
    assert Path(peft_base_dir(adapter)).resolve() == (tmp_path / "here" / "base").resolve()

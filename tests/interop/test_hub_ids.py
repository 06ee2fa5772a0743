"""Hub ids: ``model.source: org/name`` and ``data.train: hf:org/name`` resolve through the
Hugging Face cache (a cache built here, in a temporary ``HF_HOME``, in huggingface_hub's
layout: ``models--org--name/snapshots/<rev>/...`` with ``refs/main``); offline and not cached
is one line saying so."""

import json

import jax
import numpy as np
import pytest

from jaxrl_llm import interop
from jaxrl_llm.cli.main import main
from jaxrl_llm.data import load_examples, read_records
from jaxrl_llm.errors import DataError, ModelLoadError
from tests.interop._tiny import tiny_hf_model, tiny_tokenizer

REV = "0123456789abcdef0123456789abcdef01234567"


def _cached_repo(home, kind: str, repo: str):
    """An empty snapshot of ``repo`` in the hub cache under ``home``; returns its folder."""
    folder = home / "hub" / f"{kind}s--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / REV
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REV)
    return snap


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def test_model_hub_id_loads_from_the_cache(hf_home, capsys):
    snap = _cached_repo(hf_home, "model", "tiny-org/tiny-qwen3")
    tiny_hf_model("qwen3", seed=1).save_pretrained(snap)
    tiny_tokenizer().save_pretrained(snap)
    loaded = interop.load_model("tiny-org/tiny-qwen3")
    direct = interop.load_model(snap)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, direct.params)
    assert loaded.tokenizer is not None
    out = hf_home.parent / "out"
    assert main(["convert", "tiny-org/tiny-qwen3", str(out)]) == 0
    assert "found Hugging Face hub id tiny-org/tiny-qwen3" in capsys.readouterr().out


def test_offline_and_not_cached_is_one_line(hf_home, capsys):
    with pytest.raises(ModelLoadError) as e:
        interop.load_model("tiny-org/absent")
    msg = str(e.value)
    assert "not in the Hugging Face cache" in msg and "HF_HUB_OFFLINE is set" in msg
    assert str(hf_home / "hub") in msg and "\n" not in msg
    assert main(["generate", "--model", "tiny-org/absent", "--prompt", "w3"]) == 2
    err = capsys.readouterr().err
    assert "tiny-org/absent: no such local path" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DataError, match="hf:tiny-org/absent: no such local path.*dataset"):
        read_records("hf:tiny-org/absent")


def test_peft_adapter_base_may_be_a_hub_id(hf_home, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    snap = _cached_repo(hf_home, "model", "tiny-org/base")
    hf = tiny_hf_model("qwen3", seed=2)
    hf.save_pretrained(snap)
    model = peft.get_peft_model(hf, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"]))
    model.save_pretrained(tmp_path / "ad")
    cfg_path = tmp_path / "ad" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = "tiny-org/base"
    cfg_path.write_text(json.dumps(cfg))
    loaded = interop.load_model(tmp_path / "ad")  # B = 0 at init: the base exactly
    base = interop.load_model(snap)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, base.params)


def test_dataset_hub_id_reads_the_cached_files(hf_home):
    snap = _cached_repo(hf_home, "dataset", "tiny-org/prefs")
    (snap / "data").mkdir()
    rows = [{"chosen": "The sky is blue.", "rejected": "The sky is green."}] * 3
    (snap / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (snap / "data" / "test.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (snap / "README.md").write_text("# a dataset card\n")
    examples, locations = load_examples("hf:tiny-org/prefs", "preference")
    assert len(examples) == 3 and examples[0].prompt == "The sky is"
    assert locations[0].endswith("data/train.jsonl line 1")
    assert len(read_records("hf:tiny-org/prefs:test")) == 1
    with pytest.raises(DataError, match="no data file of split 'dev'"):
        read_records("hf:tiny-org/prefs:dev")

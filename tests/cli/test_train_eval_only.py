"""``jaxrl-llm train CONFIG --eval-only``: the held-out metrics of ``model.source``, written to
``output_dir/eval.json`` and nothing else (issue 42: it left a ``checkpoints/`` folder)."""

import json
import os

import pytest

from tests.train.harness import TINY_MODEL, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(ROOT, "configs", "grpo.yaml")
SFT = os.path.join(ROOT, "configs", "sft.yaml")
# TINY_MODEL drops data.eval: --eval-only needs the config's held-out prompts back
EVAL_ONLY = [
    *(o for o in TINY_MODEL if o != "data.eval=null"),
    "data.max_length=32",
    "rollout.max_new_tokens=3",
    "eval.num_examples=4",
    "eval.batch_size=4",
    "--eval-only",
]


@pytest.mark.slow
def test_eval_only_writes_eval_json_and_no_checkpoints(tmp_path, capsys):
    out = tmp_path / "fresh"
    rc, stdout, err = run_cli(["train", GRPO, f"output_dir={out}", *EVAL_ONLY], capsys)
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["eval.json"]
    result = json.loads((out / "eval.json").read_text())
    assert result["model"] == "tiny" and result["eval/num_examples"] == 4
    assert "eval/math_answer: " in stdout
    # a checkpoints/ folder that was there before is the user's: left as it was
    kept = tmp_path / "kept"
    (kept / "checkpoints").mkdir(parents=True)
    (kept / "checkpoints" / "note.txt").write_text("mine")
    rc, _, err = run_cli(["train", GRPO, f"output_dir={kept}", *EVAL_ONLY], capsys)
    assert rc == 0, err
    assert (kept / "checkpoints" / "note.txt").read_text() == "mine"


def test_eval_only_of_an_offline_config_names_jaxrl_llm_eval(tmp_path, capsys):
    rc, _, err = run_cli(["train", SFT, f"output_dir={tmp_path / 'o'}", *EVAL_ONLY], capsys)
    assert rc == 2
    assert "--eval-only needs an online config" in err
    assert "jaxrl-llm eval MODEL --data FILE --reward NAME" in err
    assert not (tmp_path / "o").exists()

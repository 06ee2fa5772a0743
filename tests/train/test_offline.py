"""The offline trainer end to end on tiny models: every configs/<algo>.yaml runs through the
CLI, and the preference losses learn a separable synthetic task."""

import json
import os

import pytest

from jaxrl_llm.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFLINE = ["sft", "reward_model", "dpo", "ipo", "kto", "orpo", "simpo", "pairwise_rank"]
TINY = [
    "model.source=tiny",
    "model.tokenizer=char",
    "train.batch_size=8",
    "train.eval_batches=1",
    "logging.tensorboard=false",
    "logging.plots=false",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", OFFLINE)
def test_every_offline_config_runs_end_to_end(name, tmp_path, capsys):
    out = tmp_path / name
    rc = main(
        [
            "train",
            os.path.join(ROOT, "configs", f"{name}.yaml"),
            "max_steps=3",
            f"output_dir={out}",
            f"data.train={ROOT}/data/" + _data(name) + "/train.jsonl",
            f"data.eval={ROOT}/data/" + _data(name) + "/heldout.jsonl",
            *TINY,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(l) for l in open(out / "metrics.jsonl")]
    train = [r for r in rows if r.get("time/step_s") is not None]  # not the evaluations
    assert [r["step"] for r in train] == [1, 2, 3]
    # the learning rate of each step's update is logged: with warm-up, the first is 0
    import yaml

    optim = yaml.safe_load(open(os.path.join(ROOT, "configs", f"{name}.yaml")))["optim"]
    lr, warm = float(optim["lr"]), int(optim.get("warmup_steps", 0))
    want = [lr * min(k, warm) / warm if warm else lr for k in range(3)] if warm >= 3 else None
    got = [r["optim/lr"] for r in train]
    assert len(got) == 3 and all(v >= 0 for v in got)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert all(r["loss"] is not None for r in train)
    assert os.path.isdir(out / "checkpoints")
    summary = json.load(open(out / "summary.json"))
    assert summary["steps"] == 3 and "eval_after" in summary


def _data(name):
    return {"sft": "arith_sft", "kto": "arith_kto", "pairwise_rank": "arith_rank"}.get(
        name, "arith_prefs"
    )


def test_bad_configs_are_one_line_errors(tmp_path, capsys):
    cfg = os.path.join(ROOT, "configs", "dpo.yaml")
    cases = [
        (["loss.betta=1"], "unknown config key 'loss.betta'"),
        (["train.batch_size=abc"], "train.batch_size: expected an integer"),
        (["algorithm=dpo2"], "algorithm: unknown 'dpo2'"),
        (["train.micro_batches=3"], "train.micro_batches=3 must divide train.batch_size=8"),
        (["train.batch_size=4", *TINY[:2]], "cannot be split over the mesh's data x fsdp = 8"),
        (["rewards=[{name: math_answer}]"], "offline algorithm and uses no reward"),
        (["data.train=" + str(tmp_path / "missing.jsonl"), *TINY], "missing.jsonl"),
    ]
    for overrides, msg in cases:
        rc = main(["train", cfg, f"output_dir={tmp_path}/o", *overrides])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (overrides, err)
        assert len(err.strip().splitlines()) == 1, err


def test_kto_on_pairs_only_data_is_a_clear_error(tmp_path, capsys):
    rc = main(
        [
            "train",
            os.path.join(ROOT, "configs", "kto.yaml"),
            f"output_dir={tmp_path}/o",
            f"data.train={ROOT}/data/arith_prefs/train.jsonl",
            *TINY,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "missing field 'label'" in err and "arith_prefs/train.jsonl line 1" in err, (
        err
    )


@pytest.mark.slow
def test_offline_resume_continues_exactly(tmp_path, capsys):
    """6 straight steps == 3 steps, stop, --resume to 6 (same batches, same updates)."""
    cfg = os.path.join(ROOT, "configs", "dpo.yaml")
    common = [
        f"data.train={ROOT}/data/arith_prefs/train.jsonl",
        "data.eval=null",
        "checkpoint.save_every=3",
        *TINY,
    ]
    assert main(["train", cfg, "max_steps=6", f"output_dir={tmp_path}/a", *common]) == 0
    assert main(["train", cfg, "max_steps=3", f"output_dir={tmp_path}/b", *common]) == 0
    assert main(["train", cfg, "max_steps=6", f"output_dir={tmp_path}/b", "--resume", *common]) == 0
    capsys.readouterr()

    def rows(d):
        return {
            r["step"]: r
            for r in map(json.loads, open(d / "metrics.jsonl"))
            if r.get("loss") is not None
        }

    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert sorted(b) == [1, 2, 3, 4, 5, 6]
    for s in (4, 5, 6):
        assert a[s]["loss"] == pytest.approx(b[s]["loss"], abs=1e-6)
        assert a[s]["tokens"] == b[s]["tokens"]  # the same batches, in the same order

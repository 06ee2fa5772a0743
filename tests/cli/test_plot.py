import json
import os
import re

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.train.run.logging import MetricsLogger, read_metrics


def test_logger_writes_jsonl_and_plot_writes_pngs(tmp_path, capsys):
    run = str(tmp_path / "run")
    log = MetricsLogger(run, total_steps=5, progress_keys=("loss", "acc"))
    for s in range(1, 6):
        log.log(s, {"loss": 1.0 / s, "acc": s / 5, "name": "x", "nan_metric": float("nan")})
    log.close()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[1]["loss"] == pytest.approx(0.5) and rows[0]["nan_metric"] is None
    assert os.listdir(os.path.join(run, "tb"))
    err = capsys.readouterr().err
    assert "step 5/5" in err and "loss 0.2" in err
    assert main(["plot", run, "--smooth", "0.5"]) == 0
    out = capsys.readouterr().out.split()
    # loss and acc have no "/": one figure, "training"
    assert sorted(os.path.basename(p) for p in out) == ["overview.png", "training.png"]
    with open([p for p in out if p.endswith("training.png")][0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_torn_last_line_is_skipped(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + '\n{"step": 2, "lo')
    assert read_metrics(str(run)) == [{"step": 1, "loss": 2.0}]


def test_plot_errors_are_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    assert main(["plot", str(run), "--keys", "nope"]) == 2
    assert "available: ['loss']" in capsys.readouterr().err


def test_overview_shows_the_panels_a_user_reads_and_no_constant_series():
    from jaxrl_llm.train.run.plots import overview_panels

    steps = [1, 2, 3]
    series = {
        k: (steps, ys)
        for k, ys in {
            "reward/mean": [0.1, 0.3, 0.5],
            "eval/math_answer": [0.2, 0.4, 0.6],
            "eval/num_examples": [200, 200, 200],
            "data/prompts_crc32": [7, 7, 7],
            "loss": [1.0, 0.5, 0.2],
            "pg/clipfrac": [0.0, 0.1, 0.2],
            "entropy": [2.0, 1.5, 1.2],
            "completion/length_mean": [9.0, 8.0, 7.0],
            "time/rollout_s": [3.0, 2.0, 2.5],
            "time/update_s": [6.0, 1.0, 2.0],
            "kl": [0.0, 0.0, 0.0],
        }.items()
    }
    panels = dict(overview_panels(series))
    assert list(panels) == [
        "reward (training)",
        "held-out",
        "loss",
        "KL and clipping",
        "entropy",
        "completion length (tokens)",
        "step time split (s)",
    ]
    assert panels["held-out"] == ["eval/math_answer"]  # the example count is not a curve
    assert panels["KL and clipping"] == ["pg/clipfrac"]  # a constant kl is left out
    drawn = {k for names in panels.values() for k in names}
    assert "data/prompts_crc32" not in drawn
    # a run with none of the known metrics: one panel per varying metric
    other = {"acc": (steps, [0.1, 0.2, 0.3]), "const": (steps, [1, 1, 1])}
    assert overview_panels(other) == [("acc", ["acc"])]


# The keys of a 2-step tiny GRPO run (configs/grpo.yaml, model.source=tiny), with a reward
# given as module:function and a pass@k: what varied there varies here, the rest is constant.
GRPO_VARYING = (
    "data/epoch",
    "entropy",
    "eval/pass@4",
    "grad_norm",
    "kl",
    "loss",
    "pg/approx_kl",
    "pg/ratio_mean",
    "rewards/my_rewards:brevity/mean",
    "rollout/tokens_per_s",
    "time/step_s",
    "time/rollout_s",
)
GRPO_CONSTANT = (
    "advantage/mean",
    "completion/length_max",
    "data/prompts_crc32",
    "dynamic/groups_kept",
    "eval/num_examples",
    "loss_tokens",
    "nonfinite_steps_total",
    "optim/lr",
    "pg/clipfrac",
    "reward/mean",
    "rewards/my_rewards:brevity/failures",
)


def test_one_png_per_group_with_portable_names_and_no_constants(tmp_path, capsys):
    """Issue 42: a GRPO run wrote 61 PNGs, with ':' in their names and constants drawn. Now:
    one figure per metric group, names of [A-Za-z0-9._-] only, and a constant metric is in
    no figure (a group of constants gets none)."""
    from jaxrl_llm.train.run.plots import file_stem, metric_groups

    run = tmp_path / "run"
    run.mkdir()
    lines = [
        {"step": s, **{k: 0.5 * s for k in GRPO_VARYING}, **{k: 3 for k in GRPO_CONSTANT}}
        for s in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["plot", str(run)]) == 0
    names = sorted(os.listdir(run / "plots"))
    assert names == [
        "data.png",
        "eval.png",
        "overview.png",
        "pg.png",
        "rewards.png",
        "rollout.png",
        "time.png",
        "training.png",
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.png", n) for n in names)
    series = {k: ([1, 2, 3], [r[k] for r in lines]) for k in lines[0] if k != "step"}
    drawn = {k for ks in metric_groups(series).values() for k in ks}
    assert drawn == set(GRPO_VARYING)
    assert metric_groups(series)["training"] == ["entropy", "grad_norm", "kl", "loss"]
    assert file_stem("rewards/my_rewards:brevity") == "rewards_my_rewards_brevity"
    assert file_stem("eval/pass@4 x") == "eval_pass_4_x"
    # named with --keys, a constant is drawn: the user asked for it
    capsys.readouterr()
    assert main(["plot", str(run), "--keys", "optim/lr", "--out", str(tmp_path / "k")]) == 0
    assert sorted(os.listdir(tmp_path / "k")) == ["optim.png", "overview.png"]


@pytest.mark.slow
def test_a_tiny_grpo_run_writes_a_handful_of_portable_pngs(tmp_path, capsys):
    """A 2-step tiny GRPO run with plots on, one reward named module:function: a figure per
    group that varies, none named with ':'."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "run"
    argv = [
        "train",
        os.path.join(root, "configs", "grpo.yaml"),
        f"output_dir={out}",
        "model.source=tiny",
        "model.tokenizer=char",
        "model.tiny.num_layers=1",
        "logging.tensorboard=false",
        "checkpoint.export_hf=false",
        "max_steps=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "data.max_length=32",
        "eval.num_examples=4",
        "eval.batch_size=4",
        "rewards=[{name: math_answer}, {name: 'tests.train.toy_rewards:larger_digit'}]",
    ]
    assert main(argv) == 0
    capsys.readouterr()
    names = sorted(os.listdir(out / "plots"))
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.png", n) for n in names), names
    assert "overview.png" in names and "training.png" in names
    # one figure per group of a GRPO run's metrics (it wrote one per metric, 56, before)
    groups = "advantage completion data dynamic eval optim pg reward rewards rollout time training"
    assert set(names) <= {f"{g}.png" for g in [*groups.split(), "overview"]}, names

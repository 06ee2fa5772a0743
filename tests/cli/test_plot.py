import json
import os

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
    assert any(p.endswith("loss.png") for p in out) and any(p.endswith("overview.png") for p in out)
    with open([p for p in out if p.endswith("loss.png")][0], "rb") as f:
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

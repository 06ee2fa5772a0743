import json
import os

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.train.logging import MetricsLogger, read_metrics


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
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n{\"step\": 2, \"lo")
    assert read_metrics(str(run)) == [{"step": 1, "loss": 2.0}]


def test_plot_errors_are_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    assert main(["plot", str(run), "--keys", "nope"]) == 2
    assert "available: ['loss']" in capsys.readouterr().err

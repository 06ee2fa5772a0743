"""metrics.jsonl on resume: rows logged after the checkpoint being resumed are dropped (the
resumed run logs those steps again), a torn last line is dropped, a fresh run starts over."""

import io
import json

from jaxrl_llm.train.logging import MetricsLogger, read_metrics


def _lines(d):
    return (d / "metrics.jsonl").read_text().splitlines()


def test_resume_keeps_the_rows_of_the_checkpoint(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False, stream=io.StringIO())
    for step in range(1, 6):
        log.log(step, {"loss": float(step)}, progress=False)
    assert log.rows == 5
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # killed mid-write
    # the checkpoint being resumed was saved after row 3 (step 3)
    log = MetricsLogger(str(tmp_path), tensorboard=False, resume=True, keep_rows=3)
    assert log.rows == 3
    log.log(4, {"loss": 40.0}, progress=False)
    log.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
    assert json.loads(_lines(tmp_path)[-1]) == {"step": 4, "loss": 40.0}
    assert not [p for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]  # no temporaries


def test_resume_without_a_row_count_keeps_complete_rows(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"st')
    log = MetricsLogger(str(tmp_path), tensorboard=False, resume=True)
    assert log.rows == 2
    log.log(3, {}, progress=False)
    log.close()
    assert _lines(tmp_path) == ['{"step": 1}', '{"step": 2}', '{"step": 3}']


def test_fresh_run_starts_over(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log.log(1, {"loss": 2.0}, progress=False)
    log.close()
    assert _lines(tmp_path) == ['{"step": 1, "loss": 2.0}']

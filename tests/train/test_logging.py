"""metrics.jsonl on resume: rows logged after the checkpoint being resumed are dropped (the
resumed run logs those steps again), a torn last line is dropped, a fresh run starts over;
TensorBoard points logged after the checkpoint are purged. samples.jsonl likewise: later
steps' lines dropped on resume, the file started over by a fresh run."""

import io
import json

from jaxrl_llm.train.run.logging import MetricsLogger, SamplesLog, read_metrics


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


def _tensorboard_points(tb_dir):
    """[(tag, step, value)] as TensorBoard shows them: every event file in order (a point
    logged twice shows twice), an event ``SessionLog.START`` at step s hides the points
    already read at steps >= s."""
    import struct

    from tensorboardX.proto import event_pb2

    points = []
    for path in sorted(tb_dir.iterdir()):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            ev = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
                points = [p for p in points if p[1] < ev.step]
            points += [(val.tag, ev.step, val.simple_value) for val in ev.summary.value]
    return points


def test_resume_purges_the_tensorboard_points_logged_after_the_checkpoint(tmp_path):
    import time

    log = MetricsLogger(str(tmp_path), stream=io.StringIO())
    for step in range(1, 6):
        log.log(step, {"loss": float(step)}, progress=False)
    log.close()
    time.sleep(1.1)  # event file names carry a time stamp in seconds
    # Resumed from the checkpoint of step 3: steps 4 and 5 are logged again, with new values.
    log = MetricsLogger(
        str(tmp_path), stream=io.StringIO(), resume=True, keep_rows=3, resume_step=3
    )
    for step in (4, 5):
        log.log(step, {"loss": 10.0 * step}, progress=False)
    log.close()
    pts = _tensorboard_points(tmp_path / "tb")
    assert pts == [
        ("loss", 1, 1.0),
        ("loss", 2, 2.0),
        ("loss", 3, 3.0),
        ("loss", 4, 40.0),
        ("loss", 5, 50.0),
    ]
    assert [r["loss"] for r in read_metrics(str(tmp_path))] == [1.0, 2.0, 3.0, 40.0, 50.0]


def _sample_steps(d):
    return [json.loads(x)["step"] for x in (d / "samples.jsonl").read_text().splitlines()]


def test_samples_log_resumes_at_the_checkpoint_and_a_fresh_run_starts_over(tmp_path):
    ep = {"prompt_id": 0, "sample": 0, "messages": [], "reward": 1.0}
    log = SamplesLog(str(tmp_path), 1, resume_step=None)
    for step in (1, 2, 3):
        log.write(step, [ep, ep])
    assert _sample_steps(tmp_path) == [1, 1, 2, 2, 3, 3]
    SamplesLog(str(tmp_path), 1, resume_step=2).write(3, [ep])  # resumed at step 2
    assert _sample_steps(tmp_path) == [1, 1, 2, 2, 3]
    # killed before its first checkpoint and started again: no resume, the old lines go
    SamplesLog(str(tmp_path), 1, resume_step=None).write(1, [ep])
    assert _sample_steps(tmp_path) == [1]
    assert not [p for p in tmp_path.iterdir() if p.name != "samples.jsonl"]  # no temporaries


def test_every_metrics_line_is_strict_json(tmp_path):
    """NaN and ±Inf (an overflowed reward, a diverged loss) are logged as null and counted:
    strict JSON readers (RFC 8259 has no NaN / Infinity) read every line."""
    import math

    import numpy as np

    log = MetricsLogger(str(tmp_path), tensorboard=False, stream=io.StringIO())
    log.log(1, {"loss": math.inf, "a": np.float32("nan"), "b": [1.0, -math.inf], "c": 2.0})
    log.close()
    line = _lines(tmp_path)[0]

    def refuse(token):
        raise ValueError(token)

    row = json.loads(line, parse_constant=refuse)  # NaN / Infinity would raise here
    assert row == {
        "step": 1,
        "loss": None,
        "a": None,
        "b": [1.0, None],
        "c": 2.0,
        "log/nonfinite_values": 3,
    }


def test_every_line_has_the_run_key_set(tmp_path):
    """Keys a step does not produce (eval/* between evaluations, a feature's keys) are null,
    not missing: each line carries every key of the lines before it, and once the logger is
    closed the lines written before a key first appeared carry it too."""
    log = MetricsLogger(str(tmp_path), tensorboard=False, stream=io.StringIO())
    log.log(0, {"eval/loss": 3.0}, progress=False)  # the evaluation before training
    log.log(1, {"loss": 2.0}, progress=False)
    log.log(2, {"loss": 1.0, "eval/loss": 2.5, "dynamic/rounds": 2}, progress=False)
    log.log(3, {"loss": 0.5}, progress=False)
    written = [json.loads(line) for line in _lines(tmp_path)]
    assert written[1] == {"step": 1, "eval/loss": None, "loss": 2.0}
    assert written[3] == {"step": 3, "eval/loss": None, "loss": 0.5, "dynamic/rounds": None}
    log.close()
    rows = [json.loads(line) for line in _lines(tmp_path)]
    keys = ["step", "eval/loss", "loss", "dynamic/rounds"]
    assert [list(r) for r in rows] == [keys] * 4
    assert [r["loss"] for r in rows] == [None, 2.0, 1.0, 0.5]
    assert [r["eval/loss"] for r in rows] == [3.0, None, 2.5, None]
    assert [r["dynamic/rounds"] for r in rows] == [None, None, 2, None]
    assert not [p for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]  # no temporaries


def test_a_resumed_run_keeps_the_key_set_of_the_rows_it_keeps(tmp_path):
    # a killed run's rows: never closed, so the first lacks the key the second brought
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0, "eval/loss": 3.0}\n{"step": 3}\n'
    )
    log = MetricsLogger(str(tmp_path), tensorboard=False, resume=True, keep_rows=2)
    log.log(3, {"loss": 0.5}, progress=False)
    log.close()
    assert [json.loads(line) for line in _lines(tmp_path)] == [
        {"step": 1, "loss": 2.0, "eval/loss": None},
        {"step": 2, "loss": 1.0, "eval/loss": 3.0},
        {"step": 3, "loss": 0.5, "eval/loss": None},
    ]

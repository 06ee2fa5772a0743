"""Experiment trackers (train/run/trackers.py), offline: W&B in offline mode and an MLflow file
store, each read back and compared with metrics.jsonl; the config keys that choose them, and a
missing package refused when the config is checked; a short SFT run through the trainer with
every tracker on."""

import glob
import importlib.util
import io
import json
import math
import struct
import time

import pytest

import jaxrl_llm
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.api import build_config, check_run
from jaxrl_llm.train.config.sections import LoggingSection
from jaxrl_llm.train.run.logging import MetricsLogger, read_metrics
from jaxrl_llm.train.run.trackers import flat_params, mlflow_key


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_dir").mkdir()
    yield tmp_path / "wandb_dir"
    import wandb

    wandb.teardown()  # wandb keeps its settings (read from the environment) per process


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}/mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def wandb_records(wandb_dir, timeout_s: float = 60.0):
    """[(record type, record)] of the one offline run under ``wandb_dir``, once its ``exit``
    record is on disk: ``finish()`` can return before wandb's writer process has flushed the
    file (seen once under a loaded test run: the file held no records yet), so this waits up
    to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _read_wandb_records(wandb_dir)
        if any(kind == "exit" for kind, _ in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_wandb_records(wandb_dir):
    """The records of the offline run's ``.wandb`` file: a LevelDB-style log (7-byte file
    header, 32 KiB blocks, each chunk with a 7-byte header: crc32, length, type 1 = full,
    2 = first, 3 = middle, 4 = last) of ``Record`` protos."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, i, chunk, out = 32768, 7, b"", []
    while i + 7 <= len(data):
        if block - i % block < 7:  # a block's tail too short for a header is padding
            i += block - i % block
            continue
        _, n, kind = struct.unpack("<IHB", data[i : i + 7])
        chunk += data[i + 7 : i + 7 + n]
        i += 7 + n
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(chunk)
            out.append((rec.WhichOneof("record_type"), rec))
            chunk = b""
    return out


def wandb_history(records):
    """{step: {key: value}} of the history records (W&B's own ``_`` keys left out)."""
    out = {}
    for kind, rec in records:
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            out[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    return out


ROWS = [
    (1, {"loss": 2.0, "grad_norm": 1.5}),
    (2, {"loss": math.nan, "grad_norm": 1.0, "eval/pass@4": 0.25}),
    (3, {"loss": 1.0, "grad_norm": 0.5}),
]
CONFIG = {"optim": {"lr": 0.001, "name": "adamw"}, "seed": 7, "rewards": [{"name": "r"}]}


def _log_rows(run_dir, names, **kw):
    log = MetricsLogger(str(run_dir), trackers=names, config=CONFIG, stream=io.StringIO(), **kw)
    for step, m in ROWS:
        log.log(step, m, progress=False)
    log.close()
    return read_metrics(str(run_dir))


def test_wandb_offline_gets_every_row_and_the_config(tmp_path, offline_wandb):
    rows = _log_rows(tmp_path / "run", ["wandb"], project="proj", run_name="r1")
    records = wandb_records(offline_wandb)
    (run,) = [rec.run for kind, rec in records if kind == "run"]
    assert (run.project, run.display_name) == ("proj", "r1")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["optim"] == {"lr": 0.001, "name": "adamw"} and config["seed"] == 7
    # the values of metrics.jsonl, step-indexed, each step's own keys; NaN (null there) as null
    own = {step: set(m) for step, m in ROWS}
    own[2].add("log/nonfinite_values")
    want = {r["step"]: {k: v for k, v in r.items() if k in own[r["step"]]} for r in rows}
    assert wandb_history(records) == want
    assert want[2]["loss"] is None and want[2]["log/nonfinite_values"] == 1
    (exit_rec,) = [rec for kind, rec in records if kind == "exit"]
    assert exit_rec.exit.exit_code == 0
    ids = json.loads((tmp_path / "run" / "trackers.json").read_text())
    assert ids["wandb"] == run.run_id


def _mlflow_run(project, run_name):
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name(project)
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == run_name
    return client, run


def test_mlflow_file_store_gets_every_number_and_the_config(tmp_path, mlflow_store):
    rows = _log_rows(tmp_path / "run", ["mlflow"], project="proj")
    client, run = _mlflow_run("proj", "run")  # the run name defaults to output_dir's name
    assert run.info.status == "FINISHED"
    for key in ("loss", "grad_norm", "eval/pass@4"):
        history = client.get_metric_history(run.info.run_id, mlflow_key(key))
        want = [(r["step"], r[key]) for r in rows if r[key] is not None]  # nulls skipped
        assert sorted((m.step, m.value) for m in history) == want
    assert mlflow_key("eval/pass@4") == "eval/pass_4"
    params = run.data.params
    assert params["optim.lr"] == "0.001" and params["seed"] == "7"
    assert params == flat_params(CONFIG)
    local = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    import yaml

    assert yaml.safe_load(open(local)) == CONFIG


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path, mlflow_store):
    run_dir = tmp_path / "run"
    log = MetricsLogger(str(run_dir), trackers=["mlflow"], config=CONFIG, stream=io.StringIO())
    log.log(1, {"loss": 3.0}, progress=False)
    log.close("stopped")
    client, run = _mlflow_run("jaxrl_llm", "run")
    assert run.info.status == "KILLED"
    log = MetricsLogger(
        str(run_dir), trackers=["mlflow"], config=CONFIG, stream=io.StringIO(), resume=True
    )
    log.log(2, {"loss": 2.0}, progress=False)
    log.close()
    client, again = _mlflow_run("jaxrl_llm", "run")  # still one run
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 3.0), (2, 2.0)]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    log = MetricsLogger(str(run_dir), trackers=["wandb"], stream=io.StringIO())
    log.log(1, {"loss": 3.0}, progress=False)
    log.close("stopped")
    time.sleep(1.1)  # offline run directory names carry a time stamp in seconds
    log = MetricsLogger(str(run_dir), trackers=["wandb"], stream=io.StringIO(), resume=True)
    log.log(2, {"loss": 2.0}, progress=False)
    log.close()
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    # offline, each session writes its own directory, both for the one run (wandb sync joins them)
    dirs = sorted(glob.glob(str(offline_wandb / "wandb" / "offline-run-*")))
    assert len(dirs) == 2 and all(d.endswith(f"-{run_id}") for d in dirs)


def test_tracker_keys_and_the_older_keys():
    assert LoggingSection().active_trackers() == ("tensorboard",)
    assert LoggingSection().required_trackers() == ()  # the default TensorBoard is optional
    old = LoggingSection(tensorboard=False, wandb_project="p")
    assert old.active_trackers() == ("wandb",) and old.required_trackers() == ("wandb",)
    new = LoggingSection(trackers=("mlflow", "tensorboard"))
    assert new.active_trackers() == new.required_trackers() == ("mlflow", "tensorboard")
    assert LoggingSection(trackers=()).active_trackers() == ()
    with pytest.raises(ConfigError, match="lists tensorboard; drop one"):
        LoggingSection(tensorboard=False, trackers=("tensorboard",))
    with pytest.raises(ConfigError, match="does not list wandb"):
        LoggingSection(wandb_project="p", trackers=("mlflow",))
    with pytest.raises(ConfigError, match="names one twice"):
        LoggingSection(trackers=("mlflow", "mlflow"))
    with pytest.raises(ConfigError, match="older name of project"):
        LoggingSection(project="a", wandb_project="b", trackers=("wandb",))


def _sft(out, **logging):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{b}"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(4)
        for b in range(4)
    ]
    cfg = dict(
        algorithm="sft",
        output_dir=str(out),
        max_steps=2,
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        data=dict(max_length=32),
        train=dict(batch_size=8, eval_every=1, eval_batches=1),
        logging=dict(plots=False, **logging),
    )
    return cfg, rows


def test_a_missing_tracker_package_is_refused_when_the_config_is_checked(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("mlflow", "tensorboardX") else real(name, *a),
    )
    cfg, rows = _sft(tmp_path / "run", trackers=["tensorboard", "mlflow"])
    with pytest.raises(
        ConfigError, match=r"tensorboard needs the tensorboardX package: pip install tensorboardX"
    ):
        check_run(build_config(cfg, train_dataset=rows))
    cfg, rows = _sft(tmp_path / "run", trackers=["mlflow"])
    with pytest.raises(
        ConfigError, match=r"mlflow needs the mlflow-skinny package: pip install mlflow-skinny"
    ):
        check_run(build_config(cfg, train_dataset=rows))
    # the default TensorBoard, not asked for by name, is skipped with a note instead
    cfg, rows = _sft(tmp_path / "run")
    check_run(build_config(cfg, train_dataset=rows))
    note = io.StringIO()
    MetricsLogger(str(tmp_path / "logs"), stream=note).close()
    assert "tensorboardX not installed; skipping tensorboard" in note.getvalue()
    assert not (tmp_path / "logs" / "tb").exists()


def test_mlflow_without_a_store_it_can_write_is_refused(tmp_path, monkeypatch):
    cfg, rows = _sft(tmp_path / "run", trackers=["mlflow"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        check_run(build_config(cfg, train_dataset=rows))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check_run(build_config(cfg, train_dataset=rows))


@pytest.mark.slow
def test_an_sft_run_logs_to_every_tracker(tmp_path, offline_wandb, mlflow_store):
    cfg, rows = _sft(tmp_path / "run", trackers=["tensorboard", "wandb", "mlflow"], project="p")
    summary = jaxrl_llm.train(cfg, train_dataset=rows, eval_dataset=rows[:8])
    assert summary["steps"] == 2
    lines = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in lines] == [0, 1, 2, 2]  # eval before, 2 steps, eval after
    keys = list(lines[1])
    assert all(list(r) == keys for r in lines)  # one key set, in one order
    assert "eval/loss" in keys and "loss" in keys and lines[0]["loss"] is None
    client, run = _mlflow_run("p", "run")
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm"] == "sft" and run.data.params["max_steps"] == "2"
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in loss) == [(r["step"], r["loss"]) for r in lines[1:3]]
    history = wandb_history(wandb_records(offline_wandb))
    assert sorted(history) == [0, 1, 2]  # W&B keeps one row per step: the last one
    assert history[1]["loss"] == lines[1]["loss"]
    # the train row and the final evaluation's row of step 2, merged by W&B
    assert (
        history[2]["loss"] == lines[2]["loss"] and history[2]["eval/loss"] == lines[3]["eval/loss"]
    )
    assert list((tmp_path / "run" / "tb").iterdir())


@pytest.mark.slow
def test_a_stopped_run_closes_its_trackers_as_stopped(
    tmp_path, offline_wandb, mlflow_store, monkeypatch
):
    """Ctrl-C inside step 2: the run saves step 1 and stops; the trackers are closed (MLflow's
    run KILLED, W&B's exit code 1) and metrics.jsonl's lines have one key set."""
    from jaxrl_llm.train.offline.trainer import OfflineTrainer
    from jaxrl_llm.train.run.signals import Interrupted, RunStopped

    train_step = OfflineTrainer.train_step

    def interrupted_at_2(self, step):
        if step == 2:
            raise Interrupted()
        return train_step(self, step)

    monkeypatch.setattr(OfflineTrainer, "train_step", interrupted_at_2)
    cfg, rows = _sft(tmp_path / "run", trackers=["wandb", "mlflow"])
    with pytest.raises(RunStopped):
        jaxrl_llm.train(cfg, train_dataset=rows, eval_dataset=rows[:8])
    lines = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in lines] == [0, 1]
    assert list(lines[0]) == list(lines[1]) and lines[0]["loss"] is None
    _, run = _mlflow_run("jaxrl_llm", "run")
    assert run.info.status == "KILLED"
    (exit_rec,) = [rec for kind, rec in wandb_records(offline_wandb) if kind == "exit"]
    assert exit_rec.exit.exit_code == 1

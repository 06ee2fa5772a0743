"""Checkpoint paths beyond local disk (issue 40 item 7): ``output_dir`` as a URI goes to orbax
as an :class:`etils.epath.Path`; logs and metrics stay local (``logging.dir``).

No bucket is reachable here and ``gcsfs`` is not installed, so the URI tests run against
:mod:`tests.train.fake_bucket` (``gs://`` redirected to a local folder, for epath and for
TensorStore alike) and against the missing package itself."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import numpy as np
import optax
import pytest
from etils import epath

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import make_mesh
from jaxrl_llm.train import abstract_train_state, create_train_state
from jaxrl_llm.train.config.sections import LoggingSection
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.checkpoint import CheckpointManager, restore_model
from jaxrl_llm.train.run.checkpoint_steps import complete_steps, last_checkpoint_words
from tests.train.common import axes, init_fn, tiny_config
from tests.train.fake_bucket import fake_bucket
from tests.train.harness import CHECKPOINTED, ROOT, SFT, run_cli

CFG = tiny_config()
OPT = optax.adamw(1e-2)


def test_uri_or_local_path():
    assert paths.is_remote("gs://bucket/run") and paths.is_remote("s3://b/r")
    assert not paths.is_remote("runs/a") and not paths.is_remote("file:///tmp/a")
    assert not paths.is_remote("/odd://name")
    assert paths.resolve("gs://bucket/run/") == "gs://bucket/run"
    assert paths.resolve("file:///tmp/a") == "/tmp/a"
    assert paths.resolve("runs/a") == os.path.abspath("runs/a")
    assert paths.join("gs://bucket/run", "checkpoints", "3") == "gs://bucket/run/checkpoints/3"
    assert isinstance(paths.as_epath("gs://bucket/run"), epath.Path)
    assert os.fspath(paths.as_epath("gs://bucket/run")) == "gs://bucket/run"


def test_logging_dir_must_be_local():
    with pytest.raises(ConfigError, match="logging.dir 'gs://b/logs'"):
        LoggingSection(dir="gs://b/logs")
    assert LoggingSection(dir="file:///tmp/logs").dir == "file:///tmp/logs"


def _state():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    state, _ = create_train_state(
        init_fn(CFG), OPT, mesh, param_axes=axes(CFG), rng=jax.random.PRNGKey(3)
    )
    return mesh, state


def _tokenizer():
    """A three-word fast tokenizer (what CheckpointManager saves and restore_model reads)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_checkpoints_in_a_fake_bucket(tmp_path, monkeypatch):
    """Save, list and restore (onto another mesh) with a ``gs://`` directory: every access goes
    through epath or TensorStore (the working directory, where ``os`` would look for
    ``gs:/...``, stays empty), nothing lands outside the bucket's folder, and orbax's
    temporary step folder is never listed as complete."""
    bucket, cwd = tmp_path / "bucket", tmp_path / "cwd"
    bucket.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    mesh, state = _state()
    uri = "gs://my-bucket/run/checkpoints"
    with fake_bucket(str(bucket)):
        mgr = CheckpointManager(uri, save_every=1, keep=2, model_config=CFG, tokenizer=_tokenizer())
        assert mgr.directory == uri and mgr.remote
        assert mgr.save(1, state, extra={"data": 5})
        assert mgr.save(2, state, extra={"data": 6})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 2]
        assert complete_steps(uri) == [1, 2]
        assert complete_steps("gs://my-bucket/run") == []
        assert last_checkpoint_words(uri) == f"the last complete checkpoint is step 2 in {uri}"
        # a step that a killed process left half-written in a bucket: in place, no commit file
        partial = bucket / "my-bucket" / "run" / "checkpoints" / "3" / "params"
        partial.mkdir(parents=True)
        (partial / "_METADATA").write_text("{}")
        assert complete_steps(uri) == [1, 2]
        small = make_mesh(data=1, fsdp=4, devices=jax.devices()[:4])
        abstract, _ = abstract_train_state(init_fn(CFG), OPT, small, param_axes=axes(CFG))
        restored, extra = CheckpointManager(uri).restore(abstract)
        assert extra == {"data": 6} and int(restored.step) == int(state.step)
        for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        config, params, tok = restore_model(uri, step=1)
        assert config == CFG and tok("a b c")["input_ids"] == [1, 2, 0]
        np.testing.assert_array_equal(
            np.asarray(jax.tree.leaves(params)[0]), np.asarray(jax.tree.leaves(state.params)[0])
        )
        mgr.close()
    assert os.listdir(cwd) == []
    root = bucket / "my-bucket" / "run" / "checkpoints"
    # the next manager (the restore's) removed the unfinished step 3, and kept the tokenizer
    assert sorted(os.listdir(root)) == ["1", "2", "tokenizer"]
    assert "commit_success.txt" in os.listdir(root / "tokenizer")
    assert "commit_success.txt" in os.listdir(root / "2")  # orbax's own finalisation on gs://
    with open(root / "2" / "extra" / "metadata", encoding="utf-8") as f:
        assert json.load(f) == {"data": 6}


TINY = [
    *CHECKPOINTED,
    f"data.train={os.path.join(ROOT, 'data', 'arith_sft', 'train.jsonl')}",  # tests change cwd
]


def _cfg(*overrides):
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig

    return load_config(RunConfig, SFT, [*TINY, *overrides])


def test_log_dir_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = _cfg("output_dir=runs/a")
    assert paths.log_dir(local) == paths.lock_dir(local) == str(tmp_path / "runs" / "a")
    assert paths.where_words(local) is None
    bucket = _cfg("output_dir=gs://bkt/exp/run7/")
    assert paths.log_dir(bucket) == str(tmp_path / "jaxrl-llm-logs" / "run7")
    assert paths.lock_dir(bucket) == paths.log_dir(bucket)
    assert paths.where_words(bucket) == (
        f"checkpoints go to gs://bkt/exp/run7; logs and metrics to {tmp_path}/jaxrl-llm-logs/run7"
    )
    named = _cfg("output_dir=gs://bkt/run", "logging.run_name=mine")
    assert paths.log_dir(named) == str(tmp_path / "jaxrl-llm-logs" / "mine")
    mine = _cfg("output_dir=runs/a", "logging.dir=logs/x")
    assert paths.log_dir(mine) == str(tmp_path / "logs" / "x")
    assert paths.lock_dir(mine) == str(tmp_path / "runs" / "a")


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_bucket_without_its_filesystem_package_is_one_line(tmp_path, monkeypatch):
    """Without ``gcsfs`` a ``gs://`` output_dir stops before the model loads, in one line that
    names the package; nothing is written locally under a ``gs:`` folder."""
    from jaxrl_llm.train.api import check_run

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"output_dir 'gs://bkt/run': .*gcsfs") as e:
        check_run(_cfg("output_dir=gs://bkt/run"))
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []


def _train(capsys, *args) -> tuple[int, str]:
    rc, _, err = run_cli(["train", SFT, *TINY, *args], capsys)
    return rc, err


def _metrics(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_run_on_a_fake_bucket_resumes_with_logs_kept_locally(tmp_path, monkeypatch, capsys):
    """``output_dir=gs://...``: checkpoints land in the bucket, logs and
    metrics in ``jaxrl-llm-logs/<run>`` (said at the start), ``--resume`` continues from the
    bucket's newest step, and a fresh start over its checkpoints is refused."""
    bucket, cwd = tmp_path / "bucket", tmp_path / "cwd"
    bucket.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    uri = "gs://bkt/exp/run1"
    logs = cwd / "jaxrl-llm-logs" / "run1"
    with fake_bucket(str(bucket)):
        rc, err = _train(capsys, f"output_dir={uri}", "max_steps=2")
        assert rc == 0, err[-2000:]
        assert f"checkpoints go to {uri}; logs and metrics to {logs}" in err
        rc, err = _train(capsys, f"output_dir={uri}", "max_steps=4")
        assert rc != 0 and "already holds checkpoints" in err, err[-2000:]
        rc, err = _train(capsys, f"output_dir={uri}", "max_steps=4", "--resume")
        assert rc == 0, err[-2000:]
        assert "resumed from step 2" in err, err[-2000:]
        assert complete_steps(f"{uri}/checkpoints") == [2, 4]
    assert os.listdir(cwd) == ["jaxrl-llm-logs"]  # nothing under ./gs:
    assert {"metrics.jsonl", "config.yaml", "summary.json", ".lock"} <= set(os.listdir(logs))
    assert [r["step"] for r in _metrics(logs / "metrics.jsonl")] == [1, 2, 3, 4]
    run = bucket / "bkt" / "exp" / "run1"
    assert sorted(os.listdir(run)) == ["checkpoints"]
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]  # the char tokenizer: not saved


@pytest.mark.slow
def test_logging_dir_takes_the_logs_of_a_local_run(tmp_path, capsys):
    out, logs = tmp_path / "run", tmp_path / "logs"
    rc, err = _train(capsys, f"output_dir={out}", f"logging.dir={logs}", "max_steps=2")
    assert rc == 0, err[-2000:]
    assert f"logs and metrics to {logs}" in err
    assert {"metrics.jsonl", "config.yaml", "summary.json"} <= set(os.listdir(logs))
    assert not {"metrics.jsonl", "config.yaml", "summary.json"} & set(os.listdir(out))
    assert complete_steps(out / "checkpoints") == [2]
    assert [r["step"] for r in _metrics(logs / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize(
    "uri, words",
    [
        ("gs://", "output_dir 'gs://': no bucket name; expected gs://BUCKET/path"),
        ("gs:///run", "no bucket name"),
        ("s3://", "output_dir 's3://': no bucket name; expected s3://BUCKET/path"),
        ("gs:/bucket/run", "a gs:// URI takes two slashes"),
        ("gs://My_Bucket/run", "'My_Bucket' is not a valid gs:// bucket name"),
        ("s3://b/run", "'b' is not a valid s3:// bucket name"),
    ],
)
def test_a_malformed_bucket_uri_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys, uri, words
):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["train", SFT, *CHECKPOINTED, f"output_dir={uri}"], capsys)
    assert rc == 2 and words in err, err[-2000:]
    assert len([x for x in err.splitlines() if "error" in x]) == 1, err[-2000:]
    assert "Traceback" not in err and os.listdir(tmp_path) == []  # no ./gs: folder, no logs
    assert paths.resolve("gs://bucket/run") == "gs://bucket/run"

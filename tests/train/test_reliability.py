"""Reliability (issue 43): no silent wrong training, checkpoints that fall back, bounded inputs,
one line per fault. Each case asserts the exit status or the exception, the one line, and that
nothing was lost.

- The Python API writes nothing before its checks pass; a resume over other rows is refused; a
  second ``train()`` is refused (a run that ended) or continues (a run that stopped).
"""

from __future__ import annotations

import json
import os

import pytest

import jaxrl_llm
from jaxrl_llm.cli.main import main
from jaxrl_llm.errors import ConfigError
from tests.train.harness import (
    CHAT_ROWS,
    CHECKPOINTED,
    SFT,
    TINY,
    one_error_line,
    run_cli,
    tiny_online_args,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = CHAT_ROWS
OTHER_ROWS = [{**r, "answer": "0"} for r in ROWS]


def digit_reward(prompts, completions, answer, **kwargs):
    """1 when the completion holds the answer."""
    return [float(answer[i] in c[0]["content"]) for i, c in enumerate(completions)]


def _args(out, **over):
    return tiny_online_args(out, **{"checkpoint": dict(export_hf=False), **over})


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and text, text
    return text


def _cli(capsys, argv) -> tuple[int, str]:
    rc, _, err = run_cli(argv, capsys)
    return rc, err


# ----- 1. the Python API ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    """A 1-step GRPO run from the Python API, and the trainer that ran it."""
    out = tmp_path_factory.mktemp("api") / "run"
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=[digit_reward], train_dataset=ROWS, args=_args(out)
    )
    trainer.train()
    return out, trainer


def _snapshot(out) -> dict[str, bytes]:
    """The bytes of every file of a run besides the lock."""
    got = {}
    for root, _, files in os.walk(out):
        for name in files:
            if name != ".lock":
                p = os.path.join(root, name)
                got[os.path.relpath(p, out)] = open(p, "rb").read()
    return got


def test_a_refused_trainer_leaves_the_saved_rows_unchanged(api_run):
    out, _ = api_run
    before = _snapshot(out)
    with pytest.raises(ConfigError) as e:
        jaxrl_llm.GRPOTrainer(
            reward_funcs=[digit_reward], train_dataset=OTHER_ROWS, args=_args(out)
        )
    assert "already holds checkpoints" in _one_line(e.value)
    # a resume with other rows is refused before it writes them
    with pytest.raises(ConfigError) as e:
        jaxrl_llm.GRPOTrainer(
            reward_funcs=[digit_reward],
            train_dataset=OTHER_ROWS,
            args=_args(out, resume=True, max_steps=2),
        )
    line = _one_line(e.value)
    assert "train_dataset: these rows differ from the rows saved in" in line, line
    assert _snapshot(out) == before


def test_a_resume_over_changed_rows_is_refused(api_run, tmp_path, capsys):
    import shutil

    import yaml

    out = tmp_path / "run"
    shutil.copytree(api_run[0], out)
    rows = out / "data" / "train.jsonl"
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["output_dir"], config["data"]["train"] = str(out), str(rows)  # the copy's own
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    rows.write_text("".join(json.dumps(r) + "\n" for r in OTHER_ROWS), encoding="utf-8")
    before = _snapshot(out)
    rc, err = _cli(capsys, ["train", str(out / "config.yaml"), "max_steps=2", "--resume"])
    assert rc == 2, err
    line = one_error_line(err)
    assert f"data.train '{rows}' differs from the rows the checkpoint of step 1" in line, line
    assert _snapshot(out) == before  # nothing trained, logged or checkpointed


def test_a_second_train_call_after_the_run_ended_is_refused(api_run):
    out, trainer = api_run
    before = _snapshot(out)
    with pytest.raises(ConfigError) as e:
        trainer.train()
    assert "this trainer's run already ended (max_steps=1" in _one_line(e.value)
    assert _snapshot(out) == before


def test_a_second_train_call_after_a_stop_continues_as_resume(tmp_path, monkeypatch):
    """The first call stops (Ctrl-C) after step 2 is saved; the second resumes from it."""
    from jaxrl_llm.train.online.trainer import OnlineTrainer
    from jaxrl_llm.train.run.signals import RunStopped

    out = tmp_path / "run"
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=[digit_reward],
        train_dataset=ROWS,
        args=_args(out, max_steps=3, checkpoint=dict(save_every=2, export_hf=False)),
    )
    real = OnlineTrainer.train_step

    def stop_at_3(self, step):
        if step == 3:
            raise KeyboardInterrupt
        return real(self, step)

    monkeypatch.setattr(OnlineTrainer, "train_step", stop_at_3)
    with pytest.raises((RunStopped, KeyboardInterrupt)):
        trainer.train()
    rows = [json.loads(r) for r in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    monkeypatch.setattr(OnlineTrainer, "train_step", real)
    summary = trainer.train()
    assert summary["steps"] == 3 and trainer.config.resume
    rows = [json.loads(r) for r in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # steps 1-2 kept, not rerun


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(model=3), "GRPOTrainer: model: expected a model source"),
        (dict(args=7), "GRPOTrainer: args: expected a dict, a YAML path, a RunConfig or a"),
        (dict(algorithm=1), "GRPOTrainer: algorithm: expected a string, got int"),
        (dict(reward_funcs=5), "reward_funcs: expected a list of functions"),
        (dict(reward_funcs=["digit_reward"]), "reward_funcs[0]: expected a function"),
        (dict(reward_funcs=[(digit_reward, "2")]), "reward_funcs[0]: the weight must be a number"),
        (
            dict(reward_funcs=[(digit_reward, float("nan"))]),
            "reward_funcs[0]: the weight must be finite",
        ),
        (dict(environment="tools"), "environment: expected a class"),
        (dict(train_dataset="rows.jsonl"), "train_dataset: expected a non-empty list of dicts"),
        (dict(train_dataset=12), "got int"),
        (dict(eval_dataset={"prompt": "a"}), "eval_dataset: expected a non-empty list of dicts"),
        (dict(train_dataset=[{"x": {1, 2}}]), "train_dataset: a row cannot be written as JSON"),
    ],
)
def test_arguments_of_the_wrong_type_are_one_line(kwargs, needle, tmp_path):
    full = dict(reward_funcs=[digit_reward], train_dataset=ROWS, args=_args(tmp_path / "run"))
    full.update(kwargs)
    with pytest.raises(ConfigError) as e:
        jaxrl_llm.GRPOTrainer(**full)
    assert needle in _one_line(e.value), e.value
    assert not (tmp_path / "run").exists()  # nothing written


def test_one_reward_function_is_taken_as_trl_takes_it(tmp_path):
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=digit_reward, train_dataset=ROWS, args=_args(tmp_path / "run")
    )
    assert [r.name for r in trainer.config.rewards] == [f"{__name__}:digit_reward"]


# ----- 2. failed episodes carry no gradient ----------------------------------------------------


class StepFails:
    """An environment whose every episode fails after the policy's first turn: ``step`` raises
    on the policy's text (the start-up check's ``step('')`` passes). The episodes hold sampled
    tokens, which the update must leave alone."""

    def reset(self, item):
        return [{"role": "user", "content": "2+2="}]

    def step(self, text):
        from jaxrl_llm.envs import Step

        if text:
            raise RuntimeError("the service is down")
        return Step(messages=[], reward=0.0, done=True)


ALGORITHM_CONFIGS = {
    name: os.path.join(ROOT, "configs", f"{name}.yaml")
    for name in ("grpo", "ppo", "online_dpo", "distill")
}


def unscored(prompts, completions, **kwargs):
    """A reward function that scores no row (None: this row cannot be scored)."""
    return [None] * len(completions)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CONFIGS))
def test_failed_episodes_carry_no_gradient(algorithm, tmp_path, capsys):
    """Every episode fails (its environment raises after the first turn; online DPO, which
    runs no environment: every reward fails): the update moves nothing, and
    ``rewards/valid_frac`` says no row was scored."""
    out = tmp_path / "run"
    prompts = 8 if algorithm == "online_dpo" else 4  # online DPO's pairs split over 8 devices
    argv = [
        "train",
        ALGORITHM_CONFIGS[algorithm],
        f"output_dir={out}",
        "max_steps=1",
        f"data.train={ROOT}/data/addition/train.jsonl",
        "data.eval=null",
        f"rollout.prompts_per_step={prompts}",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "model.source=tiny",
        "model.tokenizer=char",
        "model.tiny={num_layers: 1}",
        "logging.tensorboard=false",
        "logging.plots=false",
        "checkpoint.export_hf=false",
    ]
    if algorithm == "online_dpo":
        argv.append(f"rewards=[{{name: {__name__}:unscored}}]")
    else:
        argv.append(f"env={{name: {__name__}:StepFails, max_failures: 5}}")
    if algorithm == "distill":
        argv += ["teacher.source=tiny", "teacher.tokenizer=char", "teacher.tiny={num_layers: 2}"]
    rc, err = _cli(capsys, argv)
    assert rc == 0, err
    (row,) = [r for r in map(json.loads, open(out / "metrics.jsonl")) if "grad_norm" in r]
    if algorithm == "online_dpo":
        assert row["reward/failed"] == 16 and row["dpo/pairs"] == 0, row
    else:
        assert row["env/failed"] == 8 and row["completion/length_mean"] > 0, row
    assert row["rewards/valid_frac"] == 0.0, row
    assert row["grad_norm"] < 1e-6 and row.get("critic/grad_norm", 0.0) < 1e-6, row


# ----- 3. resume falls back past a damaged checkpoint ------------------------------------------

SFT_TINY = CHECKPOINTED


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A 4-step SFT run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("fallback") / "run"
    assert main(["train", SFT, f"output_dir={out}", *SFT_TINY, "max_steps=4"]) == 0
    return out


def _damage(step_dir, kind) -> None:
    import shutil

    if kind == "params-deleted":
        shutil.rmtree(step_dir / "params")
    elif kind == "zero-byte-files":
        for root, _, files in os.walk(step_dir):
            for name in files:
                open(os.path.join(root, name), "w").close()
    elif kind == "garbage-metadata":
        for root, _, files in os.walk(step_dir):
            for name in files:
                if name in ("_CHECKPOINT_METADATA", "_METADATA", "metadata"):
                    with open(os.path.join(root, name), "wb") as f:
                        f.write(b"\x00\xff garbage {{")
    else:  # an empty step folder
        shutil.rmtree(step_dir)
        step_dir.mkdir()


@pytest.mark.parametrize(
    "kind,said",
    [
        ("params-deleted", "params/ is missing"),
        ("zero-byte-files", "_CHECKPOINT_METADATA is empty (0 bytes)"),
        ("garbage-metadata", "_CHECKPOINT_METADATA is not valid JSON"),
        ("empty-step", "the step folder is empty"),
    ],
)
def test_resume_falls_back_past_a_damaged_newest_step(kind, said, sft_run, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(sft_run, out)
    _damage(out / "checkpoints" / "4", kind)
    rc, err = _cli(
        capsys, ["train", SFT, f"output_dir={out}", *SFT_TINY, "max_steps=6", "--resume"]
    )
    assert rc == 0, err
    assert "Traceback" not in err and "ERROR" not in err, err
    (line,) = [ln for ln in err.splitlines() if "is unreadable" in ln]
    assert f"step 4 is unreadable, its files truncated or corrupt ({said}); trying step 2" in line
    assert "resumed from step 2" in err
    steps = [json.loads(r)["step"] for r in open(out / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6], steps  # steps 3-4 logged once, again
    assert sorted(int(s) for s in os.listdir(out / "checkpoints") if s.isdigit()) == [2, 4, 6]


def test_a_damaged_step_named_explicitly_is_one_line(sft_run, tmp_path):
    """Only the newest step is fallen back past; every step damaged is one CheckpointError."""
    import shutil

    from jaxrl_llm.errors import CheckpointError
    from jaxrl_llm.train.run.checkpoint import restore_model

    out = tmp_path / "run"
    shutil.copytree(sft_run, out)
    for step in ("2", "4"):
        _damage(out / "checkpoints" / step, "params-deleted")
    with pytest.raises(CheckpointError) as e:
        restore_model(out / "checkpoints")
    assert "no readable checkpoint" in _one_line(e.value)
    assert "step 4 (params/ is missing); step 2 (params/ is missing)" in str(e.value)


# ----- 3b. metrics.jsonl restored from the checkpoint's row count -------------------------------


def _rows_file(path, n) -> list[str]:
    lines = [json.dumps({"step": i, "loss": float(i)}) for i in range(1, n + 1)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


@pytest.mark.parametrize(
    "damage,kept,said",
    [
        (
            "truncated",
            [1, 2],
            "2 of the 4 rows logged up to the checkpoint are missing or damaged (rows 3-4)",
        ),
        (
            "corrupt-middle",
            [1, 3, 4],
            "1 of the 4 rows logged up to the checkpoint are missing or damaged (rows 2)",
        ),
        (
            "random-bytes",
            [],
            "4 of the 4 rows logged up to the checkpoint are missing or damaged (rows 1-4)",
        ),
        (
            "deleted",
            [],
            "4 of the 4 rows logged up to the checkpoint are missing or damaged (rows 1-4)",
        ),
    ],
)
def test_a_damaged_metrics_file_is_rewritten_from_its_intact_rows(damage, kept, said, tmp_path):
    """The checkpoint counted 4 rows (a killed run logged a 5th after it): the file keeps the
    intact ones among those 4, never the 5th, and one line says the gap."""
    import io

    from jaxrl_llm.train.run.logging import MetricsLogger, read_metrics

    path = tmp_path / "metrics.jsonl"
    lines = _rows_file(path, 5)
    if damage == "truncated":
        path.write_text("".join(line + "\n" for line in lines[:2]) + lines[2][:7])
    elif damage == "corrupt-middle":
        lines[1] = '{"step": 2, "lo'
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    elif damage == "random-bytes":
        path.write_bytes(os.urandom(4096))
    else:
        path.unlink()
    note = io.StringIO()
    logger = MetricsLogger(str(tmp_path), resume=True, keep_rows=4, stream=note, trackers=[])
    assert logger.rows == len(kept)
    logger.log(5, {"loss": 5.0}, progress=False)
    logger.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == kept + [5]
    (line,) = note.getvalue().strip().splitlines()
    assert said in line, line


# ----- 4. a non-finite teacher or reference is named as such ------------------------------------


def test_a_non_finite_reference_is_named_in_the_stop_line():
    """A reference whose log-probs are NaN stops the step in one line naming the reference
    (the non-finite guard would have blamed optim.lr)."""
    import numpy as np

    from jaxrl_llm.errors import TrainingError
    from jaxrl_llm.train.online.algorithms import GroupPolicyGradient
    from tests.train.test_algorithms import experience, plan

    p = plan("grpo", loss=dict(kl_coef=0.1))
    exp = experience([1.0, 0.0, 3.0, 3.0], group_size=2)

    def nan_reference(batch):
        out = np.full(batch["input_ids"].shape, -0.75, np.float32)
        out[1, -2] = np.nan  # a completion token the loss reads
        return {"ref_logp": out}

    with pytest.raises(TrainingError) as e:
        GroupPolicyGradient(p, None, None).prepare(exp, nan_reference)
    line = _one_line(e.value)
    assert "the reference model's log-probs are non-finite (NaN or inf) on 1 of" in line
    assert "model.source='tiny'" in line and "optim.lr and the data are not the cause" in line

    def nan_on_padding(batch):  # NaN only where the loss reads nothing: no stop
        out = np.full(batch["input_ids"].shape, -0.75, np.float32)
        out[:, 0] = np.nan
        return {"ref_logp": out}

    GroupPolicyGradient(p, None, None).prepare(exp, nan_on_padding)


def test_a_teacher_with_non_finite_weights_is_refused_before_its_first_step():
    import jax.numpy as jnp

    from jaxrl_llm.errors import ModelLoadError
    from jaxrl_llm.train.online.advantages import check_finite_weights

    params = {"embed": {"embedding": jnp.ones((3, 2))}, "layers": {"w": jnp.zeros((2, 2))}}
    check_finite_weights(params, "teacher.source='t'")  # finite: nothing
    params["layers"]["w"] = params["layers"]["w"].at[0, 1].set(jnp.inf)
    with pytest.raises(ModelLoadError) as e:
        check_finite_weights(params, "teacher.source='t'")
    line = _one_line(e.value)
    assert (
        "teacher.source='t': its weights hold NaN or inf in 1 tensor(s) (first: layers/w)" in line
    )


# ----- 5. one line per fault -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_that_cannot_start_is_one_line(name, tmp_path, monkeypatch):
    """Whatever a tracker's client raises when it starts (a refused login, a server that does
    not answer) is one line naming the tracker and what to check; the trackers opened before
    it are closed."""
    from jaxrl_llm.errors import TrainingError
    from jaxrl_llm.train.run import trackers

    closed = []

    class Opened:
        def __init__(self, *a, **k):
            pass

        def close(self, status):
            closed.append(status)

    def refuse(*a, **k):
        raise ConnectionError("HTTPConnectionPool(host='x', port=1): Max retries\nexceeded ...")

    monkeypatch.setattr(trackers, "TensorBoardTracker", Opened)
    monkeypatch.setattr(trackers, "WandbTracker" if name == "wandb" else "MlflowTracker", refuse)
    monkeypatch.setattr(trackers, "missing_package", lambda n: None)
    with pytest.raises(TrainingError) as e:
        trackers.open_trackers(
            ["tensorboard", name], str(tmp_path), project="p", run_name="r", config={}
        )
    line = _one_line(e.value)
    assert f"logging.trackers: {name} could not start (ConnectionError: HTTPConnectionPool" in line
    assert ("WANDB_MODE=offline" if name == "wandb" else "MLFLOW_TRACKING_URI") in line
    assert closed == ["failed"]


def test_a_full_disk_at_a_checkpoint_is_one_line_and_loses_no_metrics(
    tmp_path, capsys, monkeypatch
):
    """The disk cannot hold the checkpoint of step 1: the run stops in one line saying how
    much was needed, how much is free and where; the step's metrics row is kept."""
    import collections
    import shutil as shutil_module

    out = tmp_path / "run"
    usage = collections.namedtuple("usage", "total used free")
    real = shutil_module.disk_usage

    def small_disk(path):
        if str(path).startswith(str(out)):
            return usage(2**30, 2**30 - 2**20, 2**20)  # 1 MiB free
        return real(path)

    monkeypatch.setattr(shutil_module, "disk_usage", small_disk)
    rc, err = _cli(
        capsys,
        ["train", SFT, f"output_dir={out}", *SFT_TINY, "max_steps=2", "checkpoint.save_every=1"],
    )
    assert rc == 2, err
    line = one_error_line(err, progress=("step 1/2 ",))
    assert "the checkpoint of step 1 needs about" in line and "which has 1.0 MB free" in line
    assert f"in {out}/checkpoints" in line and "lower checkpoint.keep" in line
    assert [json.loads(r)["step"] for r in open(out / "metrics.jsonl")] == [1]
    assert not [s for s in os.listdir(out / "checkpoints") if s[0].isdigit()]


def test_a_disk_filled_during_a_write_is_one_line(tmp_path, monkeypatch):
    """Another writer takes the space while orbax writes: its RESOURCE_EXHAUSTED error is one
    CheckpointError line (other errors pass unchanged)."""
    from jaxrl_llm.errors import CheckpointError
    from jaxrl_llm.train.run.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path / "ck", save_every=1)

    def full(*a, **k):
        raise ValueError(
            'RESOURCE_EXHAUSTED: Error writing local file "x/_sharding": Failed to write 9785 '
            "bytes to file 6: No space left on device [OS error: No space left on device]"
        )

    monkeypatch.setattr(mgr._mgr, "wait_until_finished", full)
    with pytest.raises(CheckpointError) as e:
        mgr.wait_until_finished()
    line = _one_line(e.value)
    assert f"a checkpoint ran out of space in {tmp_path / 'ck'}" in line
    assert "(no space left on device)" in line

    def other(*a, **k):
        raise ValueError("something else")

    monkeypatch.setattr(mgr._mgr, "wait_until_finished", other)
    with pytest.raises(ValueError, match="something else"):
        mgr.wait_until_finished()


def test_convert_warns_of_inf_weights_in_one_line(tmp_path, capsys):
    import jax

    from jaxrl_llm.interop import export_hf
    from jaxrl_llm.models import ModelConfig, init_params

    config = ModelConfig.tiny(num_layers=1)
    params = init_params(config, jax.random.PRNGKey(0))
    params["embed"]["embedding"] = params["embed"]["embedding"].at[3, 5].set(float("inf"))
    export_hf(str(tmp_path / "hf"), config=config, params=params)
    rc, err = _cli(capsys, ["convert", str(tmp_path / "hf"), str(tmp_path / "out")])
    assert rc == 0, err
    (line,) = [ln for ln in err.splitlines() if "inf weight" in ln]
    assert line.startswith(f"warning: {tmp_path / 'out'}: 1 inf weight value(s) in float32")
    assert "embed/embedding (1)" in line


def test_a_truncated_metrics_file_is_resumed_with_its_gap_said(sft_run, tmp_path, capsys):
    """``--resume`` over a metrics.jsonl cut after step 2 (the checkpoint of step 4 counted 4
    rows): one line names the gap, the file keeps steps 1-2 and the run goes on from step 4."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(sft_run, out)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:9])
    rc, err = _cli(
        capsys, ["train", SFT, f"output_dir={out}", *SFT_TINY, "max_steps=6", "--resume"]
    )
    assert rc == 0, err
    (line,) = [ln for ln in err.splitlines() if "missing or damaged" in ln]
    assert "2 of the 4 rows logged up to the checkpoint are missing or damaged (rows 3-4)" in line
    assert [json.loads(r)["step"] for r in open(out / "metrics.jsonl")] == [1, 2, 5, 6]


@pytest.mark.slow
def test_ppo_falls_back_past_a_damaged_critic_step(tmp_path, capsys):
    """PPO's critic checkpoint of step 4 is damaged (an empty step folder): the policy and the
    critic both resume from step 2, with one line naming the damaged step."""
    out = tmp_path / "ppo"
    ppo = [
        os.path.join(ROOT, "configs", "ppo.yaml"),
        f"output_dir={out}",
        *SFT_TINY,
        "rollout.prompts_per_step=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "data.max_length=32",
    ]
    rc, err = _cli(capsys, ["train", *ppo, "max_steps=4"])
    assert rc == 0, err
    _damage(out / "critic_checkpoints" / "4", "empty-step")
    rc, err = _cli(capsys, ["train", *ppo, "max_steps=6", "--resume"])
    assert rc == 0, err
    (line,) = [ln for ln in err.splitlines() if "is unreadable" in ln]
    assert "critic_checkpoints: step 4 is unreadable" in line and "trying step 2" in line
    assert "resumed from step 2" in err
    for sub in ("checkpoints", "critic_checkpoints"):
        assert sorted(int(s) for s in os.listdir(out / sub) if s.isdigit()) == [2, 4, 6]


# ----- 4b. a stop during a long device computation is bounded -----------------------------------

_LONG_STEP = """
import sys, time
import jax, jax.numpy as jnp
from jaxrl_llm.train.run.signals import stop_signals

@jax.jit
def long_step(x):  # one device computation of many seconds: the host waits in C++
    return jax.lax.fori_loop(0, 2_000_000_000, lambda i, v: v * 1.0000001 + 1e-9, x)

x = jnp.ones(())
with stop_signals():
    long_step.lower(x).compile()
    print("ready", flush=True)
    t = time.time()
    long_step(x).block_until_ready()
    print(f"finished after {time.time() - t:.0f} s", flush=True)
"""


@pytest.mark.parametrize("signum", [15, 2])
def test_a_stop_signal_in_a_long_device_computation_ends_within_the_grace(signum, tmp_path):
    """SIGTERM / SIGINT while the host waits on one long computation: the handler cannot run
    until it returns, so the watchdog exits after the grace (here 2 s) with one line and
    128 + the signal number."""
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "JAXRL_LLM_STOP_GRACE_S": "2", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.Popen(
        [sys.executable, "-c", _LONG_STEP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # inside the computation
        t = time.time()
        proc.send_signal(signum)
        rc = proc.wait(timeout=60)
        waited = time.time() - t
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert rc == 128 + signum, (rc, err)
    name = signal.Signals(signum).name
    (line,) = [ln for ln in err.splitlines() if ln.startswith("jaxrl-llm train:")]
    assert line == (
        f"jaxrl-llm train: stopped by {name}: the step did not reach a host boundary within 2 s "
        "(a device computation was running); exited without saving: resume from the newest "
        "checkpoint"
    )
    assert "Traceback" not in err
    assert 2 <= waited < 30, waited


# ----- 4c. a stop inside an update saves that step ----------------------------------------------

GRPO_CONFIG = os.path.join(ROOT, "configs", "grpo.yaml")
STOP_IN_UPDATE = {
    # offline: the step's one update; online: after the first of two minibatch updates
    "sft": (SFT, []),
    "grpo": (
        GRPO_CONFIG,
        [
            f"data.train={ROOT}/data/addition/train.jsonl",
            "rollout.prompts_per_step=8",
            "rollout.group_size=2",
            "rollout.max_new_tokens=3",
            "rollout.minibatches=2",
            "eval.before=false",
        ],
    ),
}


def _steps_of(out) -> dict[int, dict]:
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return {r["step"]: r for r in rows if "loss" in r}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STOP_IN_UPDATE))
def test_a_stop_inside_an_update_saves_that_step_and_resumes_exactly(
    kind, tmp_path, capsys, monkeypatch
):
    """SIGTERM while step 3's update runs (``JAXRL_LLM_FAULT=update:3:TERM``), one process,
    no checkpoint due: the update finishes, step 3 is logged and saved, exit 143. Before, the
    stop found the state replaced mid-step and saved nothing (a newcomer's SFT run lost every
    step). ``--resume`` then gives steps 4-5 as an uninterrupted run does."""
    config, extra = STOP_IN_UPDATE[kind]
    args = [*TINY, *extra, "max_steps=5", "checkpoint.save_every=100"]
    ref = tmp_path / "ref"
    rc, err = _cli(capsys, ["train", config, f"output_dir={ref}", *args])
    assert rc == 0, err
    out = tmp_path / "run"
    monkeypatch.setenv("JAXRL_LLM_FAULT", "update:3:TERM")
    rc, err = _cli(capsys, ["train", config, f"output_dir={out}", *args])
    assert rc == 143, err
    assert "Traceback" not in err, err
    assert f"saved step 3 in {out / 'checkpoints'}" in err, err
    assert sorted(int(s) for s in os.listdir(out / "checkpoints") if s.isdigit()) == [3]
    assert sorted(_steps_of(out)) == [1, 2, 3]
    monkeypatch.delenv("JAXRL_LLM_FAULT")
    rc, err = _cli(capsys, ["train", config, f"output_dir={out}", *args, "--resume"])
    assert rc == 0, err
    want, got = _steps_of(ref), _steps_of(out)
    assert sorted(got) == [1, 2, 3, 4, 5]
    for step in (4, 5):
        for key in ("loss", "grad_norm"):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-5), (step, key)

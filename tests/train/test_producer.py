"""Asynchronous rollouts (``rollout.max_staleness``), on the main job's config with a tiny
random model: k = 0 is the synchronous run bit for bit; k = 1 trains step t on a rollout
sampled one step earlier, never older; decoupled PPO corrects for it."""

import json
import os
import time
import types

import jax
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import load_config
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.trainer import OnlineTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN_JOB = os.path.join(ROOT, "configs", "grpo_smollm2_addition.yaml")


def main_job(out, *overrides, steps=3):
    """The main job's config, tiny: a random 1-layer model, 4 prompts × G = 4, 4 new tokens."""
    return load_config(
        RunConfig,
        MAIN_JOB,
        [
            f"output_dir={out}",
            f"max_steps={steps}",
            "model.source=tiny",
            "model.tokenizer=char",
            "model.tiny={num_layers: 1}",
            f"data.train={ROOT}/data/addition/train.jsonl",
            "data.eval=null",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=4",
            "eval.every=0",
            "checkpoint.export_hf=false",
            "logging.tensorboard=false",
            "logging.plots=false",
            *overrides,
        ],
    )


def run(cfg):
    """Per-step metrics and the final params of ``cfg``'s run, step by step."""
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        rows = [trainer.train_step(s) for s in range(1, cfg.max_steps + 1)]
        return rows, jax.device_get(trainer.policy.state.params)
    finally:
        trainer.close()


def test_max_staleness_0_is_the_synchronous_run_bit_for_bit_and_1_runs_one_step_behind(tmp_path):
    sync, p_sync = run(main_job(tmp_path / "default"))
    zero, p_zero = run(main_job(tmp_path / "k0", "rollout.max_staleness=0"))
    for a, b in zip(sync, zero):
        for k in ("loss", "grad_norm", "reward/mean", "pg/loss", "data/prompts_crc32"):
            assert a[k] == b[k], k
    assert all(not any(k.startswith("async/") for k in r) for r in zero)
    jax.tree.map(np.testing.assert_array_equal, p_sync, p_zero)

    one, _ = run(main_job(tmp_path / "k1", "rollout.max_staleness=1"))
    # the same prompts in the same order, the batch trained on at step t sampled at t − 1
    assert [r["data/prompts_crc32"] for r in one] == [r["data/prompts_crc32"] for r in sync]
    assert one[0]["async/staleness_0"] == 1.0 and one[0]["async/staleness_max"] == 0
    for r in one[1:]:
        assert r["async/staleness_1"] == 1.0 and r["async/staleness_max"] == 1
        assert r["async/dropped"] == 0
    # step 1 samples with the initial weights either way: the same update, bit for bit
    for k in ("loss", "grad_norm", "reward/mean"):
        assert one[0][k] == sync[0][k], k


def test_max_staleness_with_decoupled_ppo_and_drop_mode(tmp_path):
    rows, _ = run(
        main_job(
            tmp_path / "dec",
            "rollout.max_staleness=2",
            "rollout.staleness=drop",
            "rollout.correction={decoupled: true}",
            # an entropy bonus: every step updates the weights (a random model's additions
            # all score 0, so the advantages alone would leave it unchanged)
            "loss.entropy_coef=0.01",
            "optim.lr=1e-2",
            steps=4,
        )
    )
    for r in rows:
        assert r["async/staleness_max"] <= 2  # never trained on anything older than k
        assert sum(r[f"async/staleness_{i}"] for i in range(3)) == pytest.approx(1.0)
        assert np.isfinite(r["loss"]) and np.isfinite(r["correction/mismatch_kl"])
    # from step 2 on the behaviour weights are older than the learner's: a real mismatch,
    # well above the float noise between the sampler and the learner on the same weights
    # (measured: ~1e-14 on fresh batches, 5e-3 and 1e-2 one and two steps behind)
    assert rows[0]["correction/mismatch_kl"] < 1e-8
    stale = [r["correction/mismatch_kl"] for r in rows if r["async/staleness_max"] > 0]
    assert stale and min(stale) > 1e-5
    assert "pg/behav_weight_mean" in rows[-1]


def test_max_staleness_is_checked_and_recorded_in_metrics(tmp_path):
    with pytest.raises(ConfigError, match="max_staleness"):
        main_job(tmp_path / "bad", "rollout.max_staleness=-1")
    cfg = main_job(tmp_path / "log", "rollout.max_staleness=1", steps=2)
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in open(tmp_path / "log" / "metrics.jsonl")]
    steps = [r for r in rows if r.get("reward/mean") is not None]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(
        r.get("async/wait_s") is not None and r.get("async/staleness_1") is not None for r in steps
    )


@pytest.mark.slow
def test_resume_of_an_asynchronous_run_neither_loses_nor_repeats_prompts(tmp_path):
    # 4 straight steps vs 2 steps, stop, resume to 4, both with k = 1. The checkpoint holds the
    # data position after the last batch the learner took (the producer had drawn one batch
    # further): the resumed run draws that batch again, so every step trains on the same
    # prompts. Its first batch is sampled with the restored weights (staleness 0), where the
    # straight run's was one step old: the updates differ from there, by design.
    from jaxrl_llm.train.online.trainer import train_online

    def cfg(out, steps, *extra):
        return main_job(
            out, "rollout.max_staleness=1", "checkpoint.save_every=2", *extra, steps=steps
        )

    train_online(cfg(tmp_path / "a", 4), log_stream=open(os.devnull, "w"))
    train_online(cfg(tmp_path / "b", 2), log_stream=open(os.devnull, "w"))
    train_online(cfg(tmp_path / "b", 4, "resume=true"), log_stream=open(os.devnull, "w"))

    def rows(d):
        return {
            r["step"]: r
            for r in map(json.loads, open(d / "metrics.jsonl"))
            if r.get("loss") is not None
        }

    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert sorted(b) == [1, 2, 3, 4]
    assert [a[s]["data/prompts_crc32"] for s in a] == [b[s]["data/prompts_crc32"] for s in b]
    assert b[3]["async/staleness_max"] == 0 and b[4]["async/staleness_max"] == 1
    assert a[3]["async/staleness_max"] == 1


class _FastSampler:
    """A rollout side much faster than the learner: each batch records the weights' version
    it started with (as Rollouts does through weights_fn)."""

    can_defer_scoring = False  # scored where sampled (Rollouts.collect)

    def __init__(self, box):
        self.box = box

    def collect(self, iterator, step):
        _, version = self.box.get()
        next(iterator)
        exp = types.SimpleNamespace(policy_version=np.full(2, version), token_version=None)
        return exp, {"data/prompts_crc32": step}


class _Prompts:
    def __init__(self):
        self.position, self.steps_per_epoch = 0, 100

    def __next__(self):
        self.position += 1

    def state(self):
        return {"epoch": 0, "position": self.position}


@pytest.mark.parametrize("mode", ["wait", "drop"])
def test_producer_bounds_staleness_by_waiting_or_dropping(mode):
    # The learner takes 200 ms per update, so the fast producer starts every job it may start
    # before the next weights are published. wait: queued k ahead, nothing is ever too old.
    # drop: one more ahead, that batch arrives k + 1 old and is dropped (and replaced).
    from jaxrl_llm.train.online.producer import Producer, WeightBox

    k, updates, steps = 1, 2, 6
    box = WeightBox(None, 0)
    prod = Producer(
        _FastSampler(box),
        _Prompts(),
        box,
        max_staleness=k,
        updates_per_step=updates,
        staleness=mode,
        first_step=1,
        last_step=steps,
    )
    version, rows = 0, []
    try:
        for step in range(1, steps + 1):
            exp, info = prod.next_batch(step, version)
            assert (version - exp.policy_version.min()) // updates <= k
            rows.append(info)
            time.sleep(0.2)  # the update
            version += updates
            box.publish(None, version)
    finally:
        prod.close()
    assert max(r["async/staleness_max"] for r in rows) == k
    dropped = rows[-1]["async/dropped_total"]
    assert dropped == sum(r["async/dropped"] for r in rows)
    assert (dropped == 0) if mode == "wait" else (dropped > 0)
    # the checkpointed data position is after the batches taken, dropped ones included
    assert prod.position.state()["position"] == steps + dropped

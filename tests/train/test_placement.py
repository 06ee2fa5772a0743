"""The disaggregated placement (``rollout.devices: n``): rollouts sample on the last n of the 8
forced CPU devices, the learner trains on the others, and the weights move after each update.
"""

import threading

import jax
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import split_devices
from jaxrl_llm.parallel.placement import plan_placement
from jaxrl_llm.train.online.trainer import OnlineTrainer
from tests.train.test_producer import main_job, run


def _devices(tree) -> set:
    return {d for x in jax.tree.leaves(tree) for d in x.sharding.device_set}


def test_split_devices_and_refusals():
    devs = jax.devices()
    assert split_devices(0) == (devs, [])
    learner, rollout = split_devices(3)
    assert learner == devs[:5] and rollout == devs[5:]
    for bad in (8, 9, -1):
        with pytest.raises(ConfigError, match="rollout.devices"):
            split_devices(bad)
    with pytest.raises(
        ConfigError, match=r"rollout.tensor=3 must divide the sampler's devices per process \(4\)"
    ):
        plan_placement({"data": 4}, num_devices=8, rollout_devices=4, tensor=3)


def test_synchronous_split_run_samples_what_the_colocated_run_samples(tmp_path):
    """k = 0 with rollouts on devices 4–7: step 1 samples the same tokens from the same
    initial weights (so the same rewards); the learner's update runs over 4 devices instead
    of 8 (another reduction order), so its numbers agree to float rounding."""
    colocated, p_col = run(main_job(tmp_path / "col", steps=2))
    split, p_split = run(main_job(tmp_path / "split", "rollout.devices=4", steps=2))
    cfg = main_job(tmp_path / "bytes", "rollout.devices=4")
    trainer = OnlineTrainer(cfg, log_stream=open("/dev/null", "w"))
    try:  # what is copied: the whole model (LoRA merged), not the adapters trained
        full = sum(x.nbytes for x in jax.tree.leaves(trainer.policy.full_params()))
    finally:
        trainer.close()
    assert split[0]["reward/mean"] == colocated[0]["reward/mean"]
    assert split[0]["data/prompts_crc32"] == colocated[0]["data/prompts_crc32"]
    np.testing.assert_allclose(split[0]["loss"], colocated[0]["loss"], rtol=1e-5, atol=1e-7)
    assert split[0]["rollout/weight_sync_bytes"] == full
    assert all(r["time/weight_sync_s"] > 0 for r in split)
    assert not any("time/weight_sync_s" in r for r in colocated)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p_split, p_col
    )


# the tiny model's 259-token vocabulary does not split over tensor=2: replicated, as warned
@pytest.mark.filterwarnings("ignore::jaxrl_llm.parallel.ShardingFallbackWarning")
def test_asynchronous_split_run_samples_on_its_own_devices(tmp_path):
    """k = 1 with rollouts on devices 4–7 (data 2 × tensor 2): the learner's state lives on
    devices 0–3 only, the snapshot the producer samples with on 4–7 only; the staleness
    bound holds."""
    cfg = main_job(
        tmp_path / "a", "rollout.max_staleness=1", "rollout.devices=4", "rollout.tensor=2"
    )
    trainer = OnlineTrainer(cfg, log_stream=open("/dev/null", "w"))
    try:
        rows = [trainer.train_step(s) for s in range(1, cfg.max_steps + 1)]
        devs = jax.devices()
        assert _devices(trainer.policy.state.params) == set(devs[:4])
        assert trainer.policy.mesh.shape["data"] == 4
        params, version = trainer.producer.box.get()
        assert _devices(params) == set(devs[4:])
        assert dict(trainer.sampler.mesh.shape) == {
            "data": 2,
            "fsdp": 1,
            "expert": 1,
            "context": 1,
            "tensor": 2,
        }
        assert version == int(trainer.policy.state.step)
    finally:
        trainer.close()
    assert rows[0]["async/staleness_max"] == 0
    for r in rows[1:]:
        assert r["async/staleness_1"] == 1.0
    for r in rows:
        assert np.isfinite(r["loss"]) and r["time/weight_sync_s"] > 0


def test_rollout_devices_leave_the_learner_a_mesh_the_batch_splits_over(tmp_path):
    """16 rows over the 5 learner devices left by rollout.devices=3: refused before a model
    loads, naming the split."""
    from jaxrl_llm.train.config.preflight import check_mesh

    with pytest.raises(ConfigError, match="data x fsdp = 5"):
        check_mesh(main_job(tmp_path / "b", "rollout.devices=3"))


def test_partial_rollouts_continue_with_new_weights_and_keep_token_versions(tmp_path):
    """rollout.partial: a generation continues with weights published midway; each token
    keeps its version, the row counts as old as its oldest token; a 3-step run trains with
    the staleness bound intact."""
    cfg = main_job(
        tmp_path / "p",
        "rollout.engine=paged",
        "rollout.max_staleness=1",
        "rollout.partial=true",
        "rollout.max_new_tokens=24",  # the paged engine's chunks are 16 steps: one swap
    )
    trainer = OnlineTrainer(cfg, log_stream=open("/dev/null", "w"))
    try:
        params = trainer.policy.full_params()
        other = jax.tree.map(lambda x: x * 1.5, params)
        calls = [0]

        def weights_fn():  # the sampling call and the first chunk: version 0; then 5
            calls[0] += 1
            return (params, 0) if calls[0] <= 2 else (other, 5)

        trainer.rollouts.weights_fn = weights_fn  # as the producer's sampler samples
        trainer.rollouts.partial = True
        exp = trainer.rollouts.sample(trainer.train_data.items[:2], seed=0)
        lengths = np.asarray(exp.rollout.lengths)
        tv = exp.token_version
        assert tv.shape == np.asarray(exp.rollout.tokens).shape
        assert (exp.policy_version == 0).all()
        for row, n in zip(tv, lengths):
            assert (row[: min(n, 17)] == 0).all() and (row[17:n] == 5).all()
            assert (row[n:] == -1).all()
    finally:
        trainer.close()
    rows, _ = run(cfg)
    for r in rows:
        assert 0.0 <= r["async/partial_frac"] <= 1.0 and r["async/staleness_max"] <= 1
        assert np.isfinite(r["loss"])
    with pytest.raises(ConfigError, match="rollout.partial"):
        main_job(tmp_path / "q", "rollout.max_staleness=1", "rollout.partial=true")


# ----- rewards scored off the sampling thread ----------------------------------------------------
_SAMPLING_STARTED: dict[int, threading.Event] = {}
_GATE: list = []


def gated_reward(prompts, completions, **fields):
    """The first call (step 1's batch) returns only once step 2's batch has begun sampling,
    or after 20 s; records which."""
    if not _GATE:
        _GATE.append(_SAMPLING_STARTED.setdefault(2, threading.Event()).wait(timeout=20))
        _GATE.append(threading.current_thread().name)
    return [0.0] * len(completions)


def test_the_producer_samples_the_next_batch_while_a_reward_scores_this_one(tmp_path, monkeypatch):
    """With max_staleness 1, step 1's batch is scored on a reward thread: step 2's batch starts
    sampling before that scoring returns (a reward that waits for it does not time out)."""
    from jaxrl_llm.train.online.rollout import Rollouts

    original = Rollouts.collect_deferred

    def spy(self, iterator, step):
        _SAMPLING_STARTED.setdefault(step, threading.Event()).set()
        return original(self, iterator, step)

    monkeypatch.setattr(Rollouts, "collect_deferred", spy)
    _SAMPLING_STARTED.clear()
    _GATE.clear()
    cfg = main_job(
        tmp_path / "g",
        "rollout.max_staleness=1",
        "rewards=[{name: 'tests.train.test_placement:gated_reward'}]",
        steps=2,
    )
    rows, _ = run(cfg)
    assert _GATE[0] is True, "step 2 did not start sampling while step 1 was being scored"
    assert _GATE[1].startswith("reward")
    assert [r["async/staleness_max"] for r in rows] == [0, 1]

"""The ``jaxrl-llm train`` config schema (train/config/run_config.py): every :class:`ConfigError`
``RunConfig`` raises names the key at fault; a valid config resolves (train/config/plan.py) to what
its sections say."""

import dataclasses

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import ALGORITHMS
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.run_config import RunConfig


def online(algorithm="grpo", **over):
    base = dict(
        output_dir="/tmp/unused",
        max_steps=3,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char"),
        data=dict(train="unused.jsonl"),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=8),
        rewards=[dict(name="math_answer")],
    )
    rollout = {**base["rollout"], **over.pop("rollout", {})}
    return {**base, "rollout": rollout, **over}


def offline(algorithm="sft", **over):
    base = dict(
        output_dir="/tmp/unused",
        max_steps=3,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char"),
        data=dict(train="unused.jsonl"),
        train=dict(batch_size=8, micro_batches=2),
    )
    return {**base, **over}


def build(d):
    return from_dict(RunConfig, d)


def test_the_base_configs_are_valid():
    on, off = build(online()), build(offline())
    assert on.is_online and on.algo is ALGORITHMS["grpo"]
    assert not off.is_online and off.algo is ALGORITHMS["sft"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        on.max_steps = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "d,key",
    [
        (online(algorithm="grpo2"), "algorithm: unknown 'grpo2'"),
        (online(max_steps=0), "max_steps must be >= 1"),
        (online(output_dir="  "), "output_dir: "),
        (online(max_nonfinite_steps=0), "max_nonfinite_steps must be >= 1"),
        (online(data=dict(train="")), "data.train: "),
        (online(model=dict(source="tiny", tokenizer="auto")), "model.tokenizer=char"),
        (online("ppo", model=dict(source="tiny", tokenizer="char", lora={})), "model.lora: ppo"),
        (online(rollout=dict(group_size=1)), "rollout.group_size=1: grpo needs groups"),
        (online("rloo", process_reward={}), "process_reward: "),
        (online(rewards=[]), "rewards: "),
        (online(rollout=dict(minibatches=3)), "rollout.minibatches=3 must divide the 8 rows"),
        (online("reinforce", rollout=dict(group_size=0)), "rollout.group_size=0: reinforce needs"),
        (online(rollout=dict(prompts_per_step=0)), "rollout.prompts_per_step must be >= 1"),
        (online(rollout=dict(max_new_tokens=0)), "rollout.max_new_tokens must be >= 1"),
        (online(rollout=dict(epochs=0)), "rollout.epochs must be >= 1"),
        (online(rollout=dict(max_sampling_rounds=0)), "rollout.max_sampling_rounds must be"),
        (online(rollout=dict(micro_batch_groups=0)), "rollout.micro_batch_groups must be"),
        (online(rollout=dict(temperature=0.0)), "rollout.temperature must be"),
        (online(rollout=dict(temperature=float("inf"))), "rollout.temperature: "),
        (online(rollout=dict(top_k=-1)), "rollout.top_k must be >= 0"),
        (online(rollout=dict(top_p=0.0)), r"rollout.top_p must be in \(0, 1\]"),
        (online(rollout=dict(top_p=1.5)), r"rollout.top_p must be in \(0, 1\]"),
        (online(rollout=dict(min_p=1.0)), r"rollout.min_p must be in \[0, 1\)"),
        (online(rollout=dict(max_staleness=-1)), "rollout.max_staleness must be >= 0"),
        (online(rollout=dict(devices=-1)), "rollout.devices must be >= 0"),
        (online(rollout=dict(tensor=0)), "rollout.tensor >= 1"),
        (online(rollout=dict(partial=True)), "rollout.partial: "),
        (
            online(rollout=dict(partial=True, max_staleness=1, engine="static")),
            "rollout.partial: ",
        ),
        (online("cispo", rollout=dict(correction=dict(decoupled=True))), "rollout.correction: "),
        (online("online_dpo", rollout=dict(correction={})), "rollout.correction: "),
        (online("online_dpo", env={}), r"env: online_dpo \(online_pairs\)"),
        (online(env={}, process_reward={}), "env: process supervision"),
        (online(env=dict(max_turn_tokens=9)), "env.max_turn_tokens=9 exceeds"),
        (offline(train=dict(batch_size=8, micro_batches=3)), "train.micro_batches=3"),
        (offline(train=dict(batch_size=0, micro_batches=1)), "train.micro_batches=1"),
        (offline(env={}), "env: sft is an offline algorithm"),
        (offline(rewards=[dict(name="math_answer")]), "rewards: sft is an offline"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_each_config_error_names_the_key(d, key):
    with pytest.raises(ConfigError, match=key):
        build(d)


def test_zero_minibatches_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout.minibatches must be >= 1"):
        build(online(rollout=dict(minibatches=0)))


def test_online_checks_do_not_apply_offline_and_offline_ones_not_online():
    # an offline config ignores the rollout section; an online one the train section
    build(offline(rollout=dict(group_size=1, temperature=0.0)))
    build(online(train=dict(batch_size=3, micro_batches=2)))


def test_an_env_replaces_the_rewards_and_partial_needs_the_paged_engine():
    cfg = build(online(rewards=[], env=dict(max_turn_tokens=8)))
    assert cfg.env is not None and cfg.rewards == ()
    ok = online(rollout=dict(partial=True, max_staleness=1, engine="paged"))
    assert build(ok).rollout.partial


def test_the_config_resolves_to_the_plan_its_sections_describe():
    cfg = build(
        online(
            loss=dict(kl_coef=0.0),
            rollout=dict(
                prompts_per_step=4, group_size=2, minibatches=2, epochs=3, max_staleness=2
            ),
        )
    )
    plan = plan_run(cfg, {"data": 1})
    r = plan.rows
    assert (r.per_step, r.per_update, r.minibatches, r.epochs, r.group) == (8, 4, 2, 3, 2)
    assert plan.max_staleness == 2 and plan.pack is None and plan.cfg is cfg
    assert plan.logprobs.window == 8
    assert plan.loss_config.kl_coef == 0.0  # the loss section on top of the paper preset


@pytest.mark.parametrize(
    "over,key",
    [
        (dict(loss=dict(no_such_field=1)), "unknown config key .loss.no_such_field."),
        (dict(schedules=[dict(name="clip_eps", end=0.1)]), r"schedules\[clip_eps\]"),
        (
            dict(loss=dict(kl_coef=0.0), schedules=[dict(name="kl_coef", end=0.01)]),
            r"schedules\[kl_coef\]: loss.kl_coef must be > 0",
        ),
        (
            dict(
                loss=dict(entropy_control="kl_cov"),
                rollout=dict(correction={}),
            ),
            "loss.entropy_control='kl_cov' with rollout.correction",
        ),
    ],
    ids=["unknown_loss_key", "unschedulable", "schedule_of_zero", "entropy_control+correction"],
)
def test_what_the_plan_resolves_names_the_key(over, key):
    cfg = build(online(**over))  # the schema takes it; resolving the loss refuses it
    with pytest.raises(ConfigError, match=key):
        plan_run(cfg, {"data": 1})

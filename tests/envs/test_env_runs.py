"""Online runs with an environment (tiny model, char tokenizer): a one-turn environment trains
exactly as a run without one; GRPO and PPO train on multi-turn episodes with the environment's
tokens attended but not trained; samples.jsonl; start-up errors for broken environments; an
environment that keeps failing stops the run."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxrl_llm.data.tokenize import CharTokenizer, TokenizedPrompt
from jaxrl_llm.envs import EnvError
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.sampling import SamplingConfig
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.config.sections import EnvSection, RolloutSection
from jaxrl_llm.train.online.episode_sampler import EpisodeSampler
from jaxrl_llm.train.online.experience import rl_batch
from jaxrl_llm.train.online.trainer import OnlineTrainer, train_online
from jaxrl_llm.train.run.logging import read_metrics
from tests.envs.scripted import STOP


def _config(data, out, *, algorithm="grpo", env=None, stop=False, **over):
    tiny = dict(num_layers=1)
    if stop:  # turns end on letters and digits, so the random model takes several turns
        tiny["eos_token_ids"] = [2, *STOP]
    base = dict(
        output_dir=str(out),
        max_steps=2,
        algorithm=algorithm,
        seed=0,
        model=dict(source="tiny", tokenizer="char", tiny=tiny),
        optim=dict(lr=1e-2),
        data=dict(train=str(data / "train.jsonl"), eval=str(data / "eval.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=6, engine="paged"),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        logging=dict(tensorboard=False, plots=False),
        eval=dict(before=False, num_examples=4, batch_size=4),
    )
    if env is not None:
        base["env"] = env
    for k, v in over.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and k in base else v
    return from_dict(RunConfig, base)


def _losses(out):
    return [
        (r["step"], r["loss"], r["reward/mean"])
        for r in read_metrics(out)
        if r.get("loss") is not None
    ]


def test_one_turn_environment_trains_as_a_run_without_environment(chat_data, tmp_path):
    plain = _config(chat_data, tmp_path / "plain")
    single = _config(
        chat_data,
        tmp_path / "env",
        env=dict(name="single_turn", max_turns=1),
        logging=dict(samples_every=1),
    )
    train_online(plain)
    train_online(single)
    a, b = _losses(tmp_path / "plain"), _losses(tmp_path / "env")
    assert [s for s, _, _ in a] == [s for s, _, _ in b] == [1, 2]
    np.testing.assert_allclose([x[1:] for x in b], [x[1:] for x in a], rtol=1e-5, atol=1e-6)
    lines = [json.loads(x) for x in (tmp_path / "env" / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 8 and {x["step"] for x in lines} == {1, 2}
    assert set(lines[0]) == {"step", "prompt_id", "sample", "messages", "reward"}
    assert [m["role"] for m in lines[0]["messages"]] == ["user", "assistant"]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_multi_turn_run_trains_on_the_policy_tokens(chat_data, tmp_path, algorithm):
    cfg = _config(
        chat_data,
        tmp_path / algorithm,
        algorithm=algorithm,
        stop=True,
        env=dict(name="tests.envs.scripted:Scripted", kwargs=dict(replies=["ok"]), max_turns=3),
        rollout=dict(max_new_tokens=48),
        logging=dict(samples_every=2),
    )
    cfg_env = cfg.env
    assert cfg_env is not None and cfg_env.max_turn_tokens is None
    train_online(cfg)
    rows = [r for r in read_metrics(tmp_path / algorithm) if r.get("loss") is not None]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["loss"]) and r["env/turns_mean"] > 1 and r["env/failed"] == 0
        assert r["env/env_tokens_mean"] > 0 and r["env/replies"] > 0
        assert r["completion/length_mean"] < 48  # the policy's tokens only
    lines = (tmp_path / algorithm / "samples.jsonl").read_text().splitlines()
    assert {json.loads(x)["step"] for x in lines} == {2}
    assert any(
        m == {"role": "user", "content": "ok"} for x in lines for m in json.loads(x)["messages"]
    )


def _sampler(env: EnvSection, max_new_tokens=40):
    config = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2, *STOP))
    params = init_params(config, jax.random.PRNGKey(0))
    sampler = EpisodeSampler(
        env,
        RolloutSection(group_size=2, max_new_tokens=max_new_tokens),
        None,
        tokenizer=CharTokenizer(),
        model_config=config,
        prompt_buckets=(16, 32, 64),
    )
    items = [TokenizedPrompt((1, 4, 5), {"answer": "1"}, "12>"), TokenizedPrompt((1, 6), {}, "3>")]

    def run():
        return sampler(params, 0, items, sampling=SamplingConfig(), seed=1, num_samples=2)

    return run


def test_learner_batch_attends_to_environment_tokens_but_trains_on_the_policy_only():
    exp = _sampler(EnvSection(name="tests.envs.scripted:Scripted", max_turns=3))()
    assert exp.context_mask is not None and exp.messages is not None
    ro = exp.rollout
    env_tokens = (exp.context_mask == 1) & (ro.mask == 0)
    assert env_tokens.any()
    batch = rl_batch(exp, np.ones(len(exp), np.float32), np.ones(len(exp), np.int32))
    p = ro.prompt_tokens.shape[1]
    np.testing.assert_array_equal(batch["loss_mask"][:, p:], ro.mask)
    np.testing.assert_array_equal(batch["attention_mask"][:, p:], exp.context_mask)
    assert (batch["old_logp"][:, p:][env_tokens] == 0).all()
    assert (batch["advantages"][:, p:][env_tokens] == 0).all()
    np.testing.assert_array_equal(ro.lengths, ro.mask.sum(1))
    # the per-episode reward is the environment's: 0.25 after turn 1 ... 1.75 when done
    assert set(np.round(exp.rewards, 4)) <= {0.25, 0.75, 1.75}
    assert exp.metrics["env/turns_mean"] > 1


def test_an_environment_that_keeps_failing_stops_the_run():
    run = _sampler(EnvSection(name="tests.envs.scripted:AlwaysFails", max_failures=2))
    exp = run()
    assert not exp.valid.any() and (exp.rewards == 0).all() and exp.metrics["env/failed"] == 4
    with pytest.raises(EnvError, match="every episode failed in 2 consecutive batches"):
        run()


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("tests.envs.scripted:ReturnsDict", {}, "returned dict, not jaxrl_llm.envs.Step"),
        ("tests.envs.scripted:NoStep", {}, "has no step"),
        ("tests.envs.scripted:StepWithoutText", {}, "must take one argument"),
        ("tests.envs.scripted:not_a_class", {}, "not a class"),
        ("tests.envs.scripted:Missing", {}, "cannot import"),
        ("chess", {}, "unknown environment 'chess'"),
        ("tools", {"tools": ["browser"]}, "unknown tool"),
        ("guess_number", {"size": 3}, "env.kwargs"),
    ],
)
def test_a_broken_environment_is_a_start_up_error(chat_data, tmp_path, name, kwargs, match):
    cfg = _config(chat_data, tmp_path / "bad", env=dict(name=name, kwargs=kwargs))
    with pytest.raises(ConfigError, match=match):
        OnlineTrainer(cfg)


def test_env_config_errors(chat_data, tmp_path):
    with pytest.raises(ConfigError, match="online_dpo .* does not train on episodes"):
        _config(chat_data, tmp_path, algorithm="online_dpo", env=dict(name="single_turn"))
    with pytest.raises(ConfigError, match="env.max_turn_tokens=99 exceeds"):
        _config(chat_data, tmp_path, env=dict(name="single_turn", max_turn_tokens=99))
    with pytest.raises(ConfigError, match="env.max_turns must be >= 1"):
        _config(chat_data, tmp_path, env=dict(name="single_turn", max_turns=0))


def test_multi_turn_run_with_asynchronous_rollouts(chat_data, tmp_path):
    """Environments with the background producer (rollout.max_staleness: 1): episodes of the
    next step are played while the learner updates; the bound holds."""
    cfg = _config(
        chat_data,
        tmp_path / "async",
        stop=True,
        max_steps=3,
        env=dict(
            name="tests.envs.scripted:Scripted",
            kwargs=dict(replies=["ok"], sleep=0.05),
            max_turns=3,
        ),
        rollout=dict(max_new_tokens=48, max_staleness=1),
    )
    train_online(cfg)
    rows = [r for r in read_metrics(tmp_path / "async") if r.get("loss") is not None]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 and r["env/turns_mean"] > 1 for r in rows)


def test_an_opening_past_data_max_length_fails_its_episode(chat_data, tmp_path):
    # data.max_length bounds an environment's opening as it bounds a dataset prompt: the
    # episode fails (reward 0, counted), the run goes on
    cfg = _config(
        chat_data,
        tmp_path / "long",
        env=dict(name="tests.envs.scripted:HalfLongOpening", max_turns=2),
        max_steps=1,
    )
    train_online(cfg)
    (row,) = [r for r in read_metrics(tmp_path / "long") if r.get("reward/mean") is not None]
    assert row["env/openings_too_long"] == 4  # every other episode of 4 prompts x G = 2
    assert row["reward/failed"] == 4
    # when no episode of a batch opens, the run stops, naming the knobs
    cfg = _config(
        chat_data,
        tmp_path / "all_long",
        env=dict(name="tests.envs.scripted:LongOpening", max_turns=2),
        max_steps=1,
    )
    with pytest.raises(
        EnvError, match=r"every episode failed at reset \(8 of 8\).*data\.max_length"
    ):
        train_online(cfg)

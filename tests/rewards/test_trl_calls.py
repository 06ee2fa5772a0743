"""TRL's reward calling convention (rewards/base.py): functions are called by keyword with
``prompts``, ``completions``, ``completion_ids``, ``trainer_state`` and every data column, so the
examples of TRL's documentation run as written; the old positional shape keeps working; a
callable with no importable name (a lambda) is held in the process and asked for again on a
resume in another one."""

import functools
import json
import re

import pytest

import jaxrl_llm
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards import RewardSet, TrainerState, bind_reward, build_reward, hold_callable
from tests.train.harness import tiny_online_args

# ----- copied as written from TRL's documentation (https://huggingface.co/docs/trl) --------------


# GRPO quick start: "rewards completions that are close to 20 characters"
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


# "Using a custom reward function", example 1: longer completions, in tokens
def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]


# example 2: a format reward for conversational rows
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


# example 3: an accuracy reward against a reference column
def accuracy_reward(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


# ----------------------------------------------------------------------------------------------


def _chars(text):
    return [ord(c) for c in text]


def test_trls_documented_functions_score_as_written():
    rewards = RewardSet([reward_len, reward_func, accuracy_reward], encode=_chars)
    out = rewards(
        ["p", "p"], ["\\boxed{5}", "x" * 20], ground_truth=["5", "5"], answer=["unused", "x"]
    )
    assert out.valid.all()
    assert out.per_function["reward_len"].tolist() == [-11.0, 0.0]
    assert out.per_function["reward_func"].tolist() == [9.0, 20.0]  # re-encoded: one per char
    assert out.per_function["accuracy_reward"].tolist() == [1.0, 0.0]
    chat = [{"role": "user", "content": "hi"}]
    fmt = RewardSet([jaxrl_llm.rewards.RewardSpec(format_reward_func, conversational=True)])
    out = fmt(["r", "r"], ["<think>a</think><answer>1</answer>", "1"], sources=[chat, chat])
    assert out.per_function["format_reward_func"].tolist() == [1.0, 0.0]


def test_sampled_ids_and_the_trainer_state_are_passed_as_given():
    seen = {}

    def probe(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
        seen.update(ids=completion_ids, state=trainer_state, answer=answer, kw=sorted(kwargs))
        return [0.0] * len(completions)

    rewards = RewardSet([probe])  # no encoder: the caller's ids
    rewards(["p"], ["ab"], completion_ids=[[7, 8, 9]], answer=["1"], extra=["e"])
    assert seen["ids"] == [[7, 8, 9]] and seen["answer"] == ["1"] and seen["kw"] == ["extra"]
    assert seen["state"] == TrainerState() and seen["state"].global_step == 0
    rewards.advance(3, epoch=0.5, max_steps=10)
    rewards(["p"], ["ab"], completion_ids=[[1]], answer=["1"], extra=["e"])
    assert (seen["state"].global_step, seen["state"].epoch, seen["state"].max_steps) == (3, 0.5, 10)
    rewards(["p"], ["ab"], completion_ids=[[1]], trainer_state=TrainerState(step=9), answer=["1"])
    assert seen["state"].step == 9


def test_the_positional_shape_and_narrow_signatures_still_work():
    seen = []

    def legacy(p, c, **fields):  # the first two positionally, the rest as keywords
        seen.append(sorted(fields))
        return [1.0] * len(c)

    def narrow(prompts, completions, answer):  # no **kwargs: only what it names
        return [float(c == a) for c, a in zip(completions, answer)]

    out = RewardSet([legacy, narrow], encode=_chars)(["p"], ["5"], answer=["5"])
    assert out.valid.all() and out.per_function["narrow"].tolist() == [1.0]
    assert seen == [["answer", "completion_ids", "trainer_state"]]


def test_options_bind_to_a_trl_shaped_function():
    def scaled(completions, scale=1.0, **kwargs):
        return [scale * len(c) for c in completions]

    fn = bind_reward(scaled, scale=2.0)
    assert RewardSet([fn])(["p"], ["abc"]).rewards.tolist() == [6.0]
    with pytest.raises(TypeError, match="it takes: scale"):
        bind_reward(scaled, scael=2.0)


def test_a_held_callable_is_found_in_process_and_asked_for_again_elsewhere():
    name = hold_callable(functools.partial(reward_len))
    assert name == "python:partial(reward_len)"
    first = hold_callable(lambda completions, **kw: [0.0])
    assert first.startswith("python:") and first.endswith("<lambda>")
    assert hold_callable(lambda completions, **kw: [1.0], taken=[first]) == first + "#2"
    fn = build_reward(name, {}, key="rewards[0]")
    assert fn(completions=["x" * 20]) == [0]
    with pytest.raises(ConfigError) as e:
        build_reward("python:gone", {}, key="rewards[0]")
    assert "\n" not in str(e.value) and "pass it again" in str(e.value)


STANDARD = [{"prompt": f"{a}+{b}=", "ground_truth": str(a + b)} for a in range(4) for b in range(4)]
CHAT = [{"prompt": [{"role": "user", "content": f"{a}{b}>"}]} for a in range(4) for b in range(4)]


_tiny = tiny_online_args


def _logged(run, key):
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    return [r[key] for r in rows if key in r]


@pytest.mark.slow
def test_trls_documented_rewards_train_a_grpo_step(tmp_path):
    run = tmp_path / "run"
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=[reward_len, reward_func, accuracy_reward],
        train_dataset=STANDARD,
        args=_tiny(run),
    )
    assert trainer.train()["steps"] == 1
    prefix = "rewards/tests.rewards.test_trl_calls:"
    # every function scored every completion (reward_func read completion_ids: the texts
    # re-encoded by the policy's tokenizer)
    for name in ("reward_len", "reward_func", "accuracy_reward"):
        assert _logged(run, f"{prefix}{name}/failures") == [0.0]
    assert _logged(run, f"{prefix}reward_func/mean")[0] > 0.0


@pytest.mark.slow
def test_a_lambda_and_a_format_reward_train_through_the_python_api(tmp_path, monkeypatch):
    run = tmp_path / "run"
    summary = jaxrl_llm.train(
        _tiny(run, algorithm="grpo"),
        reward_funcs=[format_reward_func, lambda completions, **kw: [1.0] * len(completions)],
        train_dataset=CHAT,
    )
    assert summary["steps"] == 1
    name = "python:test_a_lambda_and_a_format_reward_train_through_the_python_api.<lambda>"
    assert _logged(run, f"rewards/{name}/mean") == [1.0]
    assert _logged(run, "rewards/tests.rewards.test_trl_calls:format_reward_func/failures") == [0.0]
    # a resume in a new process (nothing held) asks for the lambda again, in one line
    from jaxrl_llm.rewards import registry

    monkeypatch.setattr(registry, "_HELD", {})
    with pytest.raises(ConfigError) as e:
        jaxrl_llm.train(str(run / "config.yaml"), resume=True, max_steps=2)
    assert "\n" not in str(e.value) and "pass it again" in str(e.value) and name in str(e.value)

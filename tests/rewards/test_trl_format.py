"""Reward functions with TRL's signature: a user's ``module:function`` receives conversational
prompts and completions as message lists (as TRL's GRPOTrainer passes them), the built-ins
read text, and ``jaxrl-llm train`` imports a reward module beside the config."""

import json
import os
import sys

from jaxrl_llm.rewards import RewardSet, RewardSpec, build_reward_set, trl_format
from jaxrl_llm.train.config.sections import RewardItem

CHAT = [{"role": "user", "content": "What is 2 + 3?"}]


def trl_style_reward(prompts, completions, answer, **kwargs):
    """What a TRL user writes: reads ``completion[0]["content"]`` and the prompt's messages."""
    assert all(p[-1]["role"] == "user" for p in prompts)
    return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]


def test_trl_format_passes_messages_for_conversational_rows_only():
    prompts, completions = trl_format(["<rendered>", "plain"], ["5", "6"], [CHAT, "plain"])
    assert prompts == [CHAT, "plain"]
    assert completions == [[{"role": "assistant", "content": "5"}], "6"]


def test_a_users_function_gets_messages_and_a_built_in_gets_text():
    seen = {}

    def record(name):
        def fn(prompts, completions, **_):
            seen[name] = (prompts[0], completions[0])
            return [1.0] * len(completions)

        return fn

    rewards = RewardSet(
        [
            RewardSpec(record("user"), name="user", conversational=True),
            RewardSpec(record("builtin"), name="builtin"),
        ]
    )
    out = rewards(["<rendered chat>"], ["5"], sources=[CHAT])
    assert out.valid.all()
    assert seen["user"] == (CHAT, [{"role": "assistant", "content": "5"}])
    assert seen["builtin"] == ("<rendered chat>", "5")
    rewards(["plain prompt"], ["5"], sources=["plain prompt"])
    assert seen["user"] == ("plain prompt", "5")  # a standard row: text, as TRL passes it


def test_a_trl_reward_runs_unchanged_from_the_config():
    items = [RewardItem(name="tests.rewards.test_trl_format:trl_style_reward")]
    rewards = build_reward_set(items)
    out = rewards(["r", "r"], ["5", "4"], sources=[CHAT, CHAT], answer=["5", "5"])
    assert out.rewards.tolist() == [1.0, 0.0] and out.valid.all()


def test_train_imports_a_reward_module_beside_the_config(tmp_path, monkeypatch):
    # no PYTHONPATH: the config's folder is importable, and the reward sees message lists
    from jaxrl_llm.cli.main import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "project"
    run.mkdir()
    log = run / "seen.jsonl"
    (run / "my_rewards.py").write_text(
        "import json\n"
        "def shape(prompts, completions, **kw):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps([type(prompts[0]).__name__, completions[0][0]['role']]) + '\\n')\n"
        "    return [float(len(c[0]['content'])) for c in completions]\n"
    )
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}{b}>"}]} for a in range(4) for b in range(4)
    ]
    (run / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        algorithm="grpo",
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        data=dict(train=str(run / "train.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=4),
        rewards=[dict(name="my_rewards:shape")],
        logging=dict(tensorboard=False, plots=False),
        eval=dict(before=False),
    )
    import yaml

    (run / "grpo.yaml").write_text(yaml.safe_dump(cfg))
    os.chdir(tmp_path)  # the working directory is not the config's folder
    assert main(["train", str(run / "grpo.yaml")]) == 0
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen and all(s == ["list", "assistant"] for s in seen)

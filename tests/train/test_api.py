"""Training from Python (train/api.py): ``jaxrl_llm.train(...)`` and the TRL-shaped trainer
classes run the CLI's checks and run, with in-memory rows and Python reward functions."""

import json

import pytest
import yaml

import jaxrl_llm
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.api import build_config, importable_name
from tests.train.harness import CHAT_ROWS, SFT, run_cli, tiny_online_args

ROWS = CHAT_ROWS
SEEN: list = []


def larger_digit(prompts, completions, answer, **kwargs):
    """A TRL-style reward: conversational rows arrive as message lists."""
    SEEN.append((type(prompts[0]).__name__, completions[0][0]["role"]))
    return [float(answer[i] in c[0]["content"]) for i, c in enumerate(completions)]


_tiny = tiny_online_args


def test_trainer_class_with_rows_and_a_python_reward(tmp_path):
    SEEN.clear()
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=[larger_digit],
        train_dataset=ROWS,
        args=_tiny(tmp_path / "run"),
    )
    assert trainer.config.algorithm == "grpo"
    assert trainer.config.rewards[0].name == "tests.train.test_api:larger_digit"
    summary = trainer.train()
    assert summary["steps"] == 1 and SEEN and set(SEEN) == {("list", "assistant")}
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert any("rewards/tests.train.test_api:larger_digit/mean" in r for r in rows)
    # the rows are in the run directory (a resume reads the same), and config.yaml names them
    saved = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert saved["data"]["train"] == str(tmp_path / "run" / "data" / "train.jsonl")
    assert len(open(saved["data"]["train"]).read().splitlines()) == len(ROWS)


def test_the_train_package_is_callable_with_a_config_and_overrides(tmp_path, capsys):
    cfg = _tiny(tmp_path / "run", algorithm="grpo")
    summary = jaxrl_llm.train(
        cfg, reward_funcs=[(larger_digit, 2.0)], train_dataset=ROWS, rollout__max_new_tokens=2
    )
    assert summary["steps"] == 1
    # before the model loads, one line says what is happening
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"start: grpo on tiny, 1 steps, into {tmp_path / 'run'}: loading the model, then "
        f"compiling the first step"
    )
    saved = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert saved["rollout"]["max_new_tokens"] == 2 and saved["rewards"][0]["weight"] == 2.0
    assert saved["rollout"]["group_size"] == 2  # a nested override keeps the section's keys


def test_overrides_merge_and_objects_without_a_name_are_refused(tmp_path):
    cfg = build_config(
        _tiny(tmp_path / "run", algorithm="sft"),
        train=dict(batch_size=8),
        data__max_length=48,
        train_dataset=[
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            }
        ],
    )
    assert cfg.train.batch_size == 8 and cfg.data.max_length == 48
    assert cfg.model.source == "tiny"
    with pytest.raises(ConfigError, match="no importable name"):
        importable_name(lambda p, c, **k: [0.0] * len(c), "reward_funcs")

    def nested(prompts, completions, **kw):
        return [0.0] * len(completions)

    # a reward with no importable name is held in this process (a resume elsewhere asks again)
    held = build_config(
        _tiny(tmp_path / "x", algorithm="grpo"), reward_funcs=[nested], train_dataset=ROWS
    )
    assert held.rewards[0].name.startswith("python:") and held.rewards[0].name.endswith("nested")
    with pytest.raises(ConfigError, match="train_dataset: expected a non-empty list of dicts"):
        build_config(_tiny(tmp_path / "y", algorithm="sft"), train_dataset=[])
    with pytest.raises(ConfigError, match="output_dir is required"):
        build_config({"algorithm": "sft", "max_steps": 1}, train_dataset=ROWS)


@pytest.mark.slow
def test_the_train_path_votes_and_eval_of_its_run_gives_the_runs_numbers(tmp_path, capsys):
    """``eval.maj_at`` / ``write_samples`` on the ``jaxrl-llm train`` path (run_training),
    and ``jaxrl-llm eval RUN`` with the run's own rewards and held-out rows scores the final
    weights as the run's last evaluation did."""
    from jaxrl_llm.cli.main import main

    run = tmp_path / "run"
    ev = dict(before=False, num_samples=2, maj_at=[2], pass_at=[1], write_samples=True)
    summary = jaxrl_llm.train(
        _tiny(run, algorithm="grpo", eval=ev),
        reward_funcs=[larger_digit],
        train_dataset=ROWS,
        eval_dataset=ROWS[:3],
    )
    after = summary["eval_after"]
    assert "eval/maj@2" in after and summary["start_step"] == 0
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert any(r.get("eval/maj@2") is not None for r in rows)
    samples = [json.loads(x) for x in open(run / "eval" / "samples-1.jsonl")]
    assert len(samples) == 3 and all(len(s["completions"]) == 2 for s in samples)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert report["step"] == 1 and report["rewards"] == ["tests.train.test_api:larger_digit"]
    for key in ("eval/tests.train.test_api:larger_digit", "eval/pass@1", "eval/maj@2"):
        assert report["metrics"][key] == pytest.approx(after[key]), key


def test_a_config_refused_while_the_trainer_is_built_leaves_no_run_directory(tmp_path):
    """A reward, model or data fault found after the checks (while the trainer is built) ends
    the run; the output_dir it created goes again (no empty directory with a .lock)."""
    run = tmp_path / "run"
    cfg = _tiny(run, algorithm="grpo", rewards=[{"name": "nope"}])
    cfg["data"] = dict(cfg["data"], train=str(tmp_path / "rows.jsonl"))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        jaxrl_llm.train(cfg)
    assert not run.exists()
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        jaxrl_llm.GRPOTrainer(args=cfg).train()
    assert not run.exists()
    # a directory that was there before is left as it was
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        jaxrl_llm.train(cfg)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "notes.txt"]


def _word_reward(completions, **kwargs):
    return [float("w9" in c) for c in completions]


def test_a_model_known_only_once_loaded_has_its_step_memory_checked(tmp_path):
    """A PEFT adapter's model config is known only once it has loaded (no config.json to
    read before): rollout.group_size=1000000 passes the checks before loading and is refused,
    in one line with the memory it would need, before the first step compiles."""
    import jax

    from jaxrl_llm import interop
    from jaxrl_llm import models as M
    from jaxrl_llm.train.api import check_run
    from tests.interop._tiny import tiny_tokenizer

    config = M.ModelConfig.tiny("llama")
    interop.export_hf(
        tmp_path / "base",
        config=config,
        params=M.init_params(config, jax.random.PRNGKey(0)),
        tokenizer=tiny_tokenizer(),
    )
    lora = M.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    interop.export_peft_adapter(
        tmp_path / "adapter",
        config=config,
        adapters=M.init_lora(config, lora, jax.random.PRNGKey(1)),
        lora=lora,
        base_model=str(tmp_path / "base"),
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}"}) + "\n" for i in range(8)))
    cfg = _tiny(
        tmp_path / "run",
        algorithm="grpo",
        model={"source": str(tmp_path / "adapter")},
        data={"train": str(rows), "max_length": 8},
        rollout={"prompts_per_step": 8, "group_size": 1_000_000, "max_new_tokens": 4},
        rewards=[{"name": f"{__name__}:_word_reward"}],
    )
    check_run(build_config(cfg))  # nothing to check before the model loads
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_step x group_size") as e:
        jaxrl_llm.train(cfg)
    assert "GiB per device by the memory estimate" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_dry_run_refuses_a_mistyped_model_alias(capsys):
    rc, _, err = run_cli(["train", SFT, "model.source=smollm2-135m-instrct", "--dry-run"], capsys)
    assert rc == 2, err[-2000:]
    errors = [x for x in err.splitlines() if "error" in x]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert "model.source 'smollm2-135m-instrct': not a model alias (did you mean " in errors[0]
    assert "'smollm2-135m-instruct'" in errors[0]


def test_a_bad_in_memory_row_is_named_by_its_index_and_nothing_is_written(tmp_path):
    rows = [*CHAT_ROWS[:3], {"question": "2+2?", "answer": "4"}]
    out = tmp_path / "run"
    with pytest.raises(jaxrl_llm.errors.DataError) as e:
        build_config(
            {"algorithm": "grpo", "output_dir": str(out), "max_steps": 1},
            train_dataset=rows,
            reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        )
    msg = str(e.value)
    assert msg.startswith("train_dataset[3]: missing field 'prompt'"), msg
    assert "rename 'question' to 'prompt' (GSM8K's shape)" in msg and "\n" not in msg
    assert not out.exists()  # no copy of the rows left behind

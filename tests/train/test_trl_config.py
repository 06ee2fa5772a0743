"""TRL's vocabulary (train/trl_config.py, config_io.TRL_NAMES) and the trainer surface of
train/api.py: typed configs with TRL's names, TRL's names refused in a YAML config with the key to
use, and a trainer's evaluate(), save_model(), .model and callbacks."""

import json
import os
import pydoc

import pytest

import jaxrl_llm
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.api import Callback, build_config
from jaxrl_llm.train.trl_config import GRPOConfig, lora_section

ROWS = [
    {"prompt": [{"role": "user", "content": f"{a}{b}>"}], "answer": str(max(a, b))}
    for a in range(4)
    for b in range(4)
]


@pytest.mark.parametrize(
    "key, value, hint",
    [
        ("learning_rate", 1e-5, "here it is optim.lr"),
        ("num_generations", 4, "here it is rollout.group_size"),
        ("peft_config", {"r": 8}, "here it is model.lora"),
        ("per_device_train_batch_size", 8, "rollout.prompts_per_step"),
        ("gradient_accumulation_steps", 2, "train.micro_batches"),
        ("max_completion_length", 64, "rollout.max_new_tokens"),
        ("beta", 0.04, "loss.kl_coef"),
    ],
)
def test_trl_names_in_a_config_are_refused_with_the_key_to_use(key, value, hint):
    cfg = {"algorithm": "grpo", "output_dir": "/tmp/unused", "max_steps": 1, key: value}
    with pytest.raises(ConfigError, match="that is TRL's name") as e:
        build_config(cfg)
    assert hint in str(e.value)
    nested = {"algorithm": "grpo", "output_dir": "/tmp/unused", "max_steps": 1}
    nested["optim"] = {"learning_rate": 1e-5}
    with pytest.raises(ConfigError, match="'optim.learning_rate': that is TRL's name"):
        build_config(nested)


def test_a_typed_config_maps_trls_names():
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    d = GRPOConfig(
        output_dir="/tmp/unused",
        max_steps=3,
        learning_rate=3e-6,
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_completion_length=32,
        beta=0.04,
        peft_config=lora,
        extra={"rollout": {"engine": "paged"}},
    ).to_dict()
    import jax

    assert d["algorithm"] == "grpo" and d["optim"]["lr"] == 3e-6
    assert d["rollout"]["group_size"] == 4 and d["rollout"]["max_new_tokens"] == 32
    # 8 completions per device x devices x 2 accumulation steps, 4 per prompt
    assert d["rollout"]["prompts_per_step"] == 8 * jax.device_count() * 2 // 4
    assert d["rollout"]["engine"] == "paged" and d["loss"] == {"kl_coef": 0.04}
    assert d["model"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"]}
    with pytest.raises(ConfigError, match="not projections here"):
        lora_section(LoraConfig(r=4, target_modules=["c_attn"]))
    assert lora_section(LoraConfig(r=2, lora_alpha=2, target_modules="all-linear")) == {
        "rank": 2,
        "alpha": 2.0,
    }  # every projection: the section's default targets
    assert lora_section(LoraConfig(r=2))["targets"] == ["q_proj", "v_proj"]  # PEFT's default
    text = pydoc.render_doc(GRPOConfig)
    for field in ("learning_rate", "num_generations", "peft_config", "max_completion_length"):
        assert field in text


class Recorder(Callback):
    """Records what the trainer reports."""

    def __init__(self):
        self.steps, self.evals, self.saves = [], [], []

    def on_step_end(self, info):
        self.steps.append((info.step, "loss" in info.metrics))

    def on_evaluate(self, info, metrics):
        self.evals.append((info.step, sorted(k for k in metrics if k.startswith("eval/maj@"))))

    def on_save(self, info, path):
        self.saves.append((info.step, os.path.isdir(path)))


@pytest.mark.slow
def test_a_typed_config_trains_with_callbacks_evaluate_save_model_and_model(tmp_path):
    from peft import LoraConfig

    seen_steps = []

    def reward(completions, trainer_state, **kwargs):
        seen_steps.append(trainer_state.step)
        return [float(len(c[0]["content"])) for c in completions]

    run = tmp_path / "run"
    args = GRPOConfig(
        output_dir=str(run),
        max_steps=2,
        learning_rate=1e-4,
        num_generations=2,
        prompts_per_step=4,
        max_completion_length=3,
        max_prompt_length=32,
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
        eval_num_samples=3,
        maj_at=(3,),
        extra={
            "logging": {"tensorboard": False, "plots": False},
            "eval": {"write_samples": True, "num_examples": 2},
        },
    )
    recorder, hooked = Recorder(), []
    trainer = jaxrl_llm.GRPOTrainer(
        model={"source": "tiny", "tokenizer": "char", "tiny": {"num_layers": 1}},
        reward_funcs=[reward],
        train_dataset=ROWS,
        eval_dataset=ROWS[:2],
        args=args,
        callbacks=[recorder],
    )
    trainer.add_hook(lambda info: hooked.append(info.step), every=2)
    assert trainer.config.optim.lr == 1e-4 and trainer.config.model.lora.rank == 2
    summary = trainer.train()
    assert summary["steps"] == 2
    assert recorder.steps == [(1, True), (2, True)] and hooked == [2]
    # before and after training, each with maj@3
    assert recorder.evals == [(0, ["eval/maj@3"]), (2, ["eval/maj@3"])]
    assert recorder.saves == [(2, True)]
    # the reward saw the step being trained (and 0 / 2 in the evaluations)
    assert {1, 2} <= set(seen_steps)
    lines = [json.loads(x) for x in open(run / "eval" / "samples-2.jsonl")]
    assert len(lines) == 2 and all(len(r["completions"]) == 3 for r in lines)
    assert set(lines[0]) >= {"prompt", "completions", "answers", "rewards", "votes", "majority"}
    metrics = trainer.evaluate()
    assert "eval/maj@3" in metrics and len(recorder.evals) == 3
    params = trainer.model
    import jax

    assert jax.tree_util.tree_leaves(params)
    out = trainer.save_model(str(tmp_path / "exported"))
    assert os.path.isfile(os.path.join(out, "config.json"))
    assert any(f.endswith(".safetensors") for f in os.listdir(out))


@pytest.mark.slow
def test_an_offline_trainer_has_the_same_surface(tmp_path):
    from jaxrl_llm.train.trl_config import SFTConfig

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{b}="},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(4)
        for b in range(4)
    ]
    run = tmp_path / "run"
    recorder = Recorder()
    trainer = jaxrl_llm.SFTTrainer(
        model={"source": "tiny", "tokenizer": "char", "tiny": {"num_layers": 1}},
        train_dataset=rows,
        eval_dataset=rows[:8],
        args=SFTConfig(
            output_dir=str(run),
            max_steps=2,
            learning_rate=1e-3,
            batch_size=8,
            max_length=32,
            save_steps=1,
            extra={"logging": {"tensorboard": False, "plots": False}},
        ),
        callbacks=[recorder],
    )
    assert trainer.config.algorithm == "sft" and trainer.config.checkpoint.save_every == 1
    before = trainer.evaluate()
    assert before and all(k.startswith("eval/") for k in before)
    trainer.train()
    assert recorder.steps == [(1, True), (2, True)]
    assert recorder.saves == [(1, True), (2, True)]
    after = trainer.evaluate()
    key = next(k for k in after if "loss" in k)
    assert after[key] < before[key]  # 2 steps at lr 1e-3 fit the 16 rows a little
    out = trainer.save_model()
    assert out == str(run / "hf") and os.path.isfile(os.path.join(out, "config.json"))
    with pytest.raises(ConfigError, match="is for sft, this trainer runs dpo"):
        jaxrl_llm.DPOTrainer(args=SFTConfig(output_dir=str(tmp_path / "x"), max_steps=1))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"bf16": "false"}, "GRPOConfig: bf16: expected true or false, got 'false'"),
        ({"num_generations": 0}, "num_generations: expected an integer >= 1, got 0"),
        ({"num_generations": 2.5}, "num_generations: expected an integer >= 1, got 2.5"),
        ({"learning_rate": "1e-5"}, "learning_rate: expected a number > 0, got '1e-5'"),
        ({"learning_rate": float("nan")}, "learning_rate: expected a number > 0, got nan"),
        ({"temperature": 0}, "temperature: expected a number > 0, got 0"),
        ({"top_p": 1.5}, "top_p: expected a number in (0, 1], got 1.5"),
        ({"max_steps": 0}, "max_steps: expected an integer >= 1 (or -1"),
        ({"lr_scheduler_type": "cosin"}, "expected one of 'constant', 'cosine', 'linear'"),
        ({"report_to": 3}, "report_to: expected a string or a list of a string or None, got 3"),
        ({"pass_at": [1, 0]}, "pass_at: expected a list of an integer >= 1, got [1, 0]"),
        ({"max_grad_norm": -1.0}, "max_grad_norm: expected a number > 0 or None, got -1.0"),
        ({"resume_from_checkpoint": "/x"}, "resume_from_checkpoint: expected true or false"),
        ({"extra": ["rollout"]}, "extra: expected a dict, got ['rollout']"),
        ({"use_vllm": True}, "'use_vllm' is TRL's name for something this package does not"),
        ({"fp16": True}, "'fp16' is TRL's name for something this package does not have"),
        ({"num_generation": 4}, "unknown argument 'num_generation' (did you mean"),
    ],
)
def test_typed_config_misuse_is_one_config_error_line(kwargs, words):
    with pytest.raises(ConfigError) as e:
        GRPOConfig(**{"output_dir": "/tmp/unused", "max_steps": 2, **kwargs})
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_typed_configs_check_at_construction_and_normalise():
    with pytest.raises(ConfigError, match="GRPOConfig: missing output_dir"):
        GRPOConfig(max_steps=2)
    with pytest.raises(ConfigError, match="keyword arguments only"):
        GRPOConfig("/tmp/unused")
    with pytest.raises(ConfigError, match="SFTConfig: batch_size: expected an integer >= 1"):
        jaxrl_llm.SFTConfig(output_dir="/tmp/unused", max_steps=2, batch_size=0)
    with pytest.raises(ConfigError, match=r"DPOConfig: beta: expected a number >= 0 or None"):
        jaxrl_llm.DPOConfig(output_dir="/tmp/unused", max_steps=2, beta=-0.1)
    c = GRPOConfig(output_dir="/tmp/unused", max_steps=2, learning_rate=1, pass_at=[1, 4])
    assert c.learning_rate == 1.0 and isinstance(c.learning_rate, float) and c.pass_at == (1, 4)
    d = GRPOConfig(
        output_dir="/tmp/unused",
        max_steps=10,
        warmup_ratio=0.25,
        adam_beta2=0.95,
        scale_rewards=False,
    ).to_dict()
    assert d["optim"]["warmup_steps"] == 3 and d["optim"]["b2"] == 0.95
    assert d["rollout"]["advantage_scale"] == "none"


def test_num_train_epochs_sets_max_steps_from_the_dataset_size(tmp_path):
    """TRL's default: max_steps -1 and 3 epochs; steps = ⌈epochs × rows / rows per step⌉."""
    c = GRPOConfig(output_dir="/tmp/unused", prompts_per_step=4, num_train_epochs=2)
    assert c.to_dict(num_rows=16)["max_steps"] == 8
    assert GRPOConfig(output_dir="/tmp/unused").to_dict(num_rows=10)["max_steps"] == 8  # 3 x 10/4
    assert jaxrl_llm.SFTConfig(output_dir="/x", batch_size=8).to_dict(num_rows=20)["max_steps"] == 8
    with pytest.raises(ConfigError, match="needs the training dataset's size"):
        GRPOConfig(output_dir="/tmp/unused").to_dict()
    trainer = jaxrl_llm.GRPOTrainer(
        model={"source": "tiny", "tokenizer": "char", "tiny": {"num_layers": 1}},
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=ROWS,
        args=GRPOConfig(
            output_dir=str(tmp_path / "g"),
            num_train_epochs=0.5,
            max_prompt_length=16,
            max_completion_length=8,
        ),
    )
    assert trainer.config.max_steps == 2  # 0.5 x 16 rows / 4 prompts per step

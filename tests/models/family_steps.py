"""One GRPO step and a run of DPO steps on a tiny model of a family, for the families' own
training tests (Qwen3.5, Gemma 4): the sampler's log-probs equal the learner's in float32, and
DPO lowers its loss from log 2 and checkpoints the family's parameter tree."""

import json
import os

import jax
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.offline.trainer import train_offline
from jaxrl_llm.train.online.trainer import OnlineTrainer
from jaxrl_llm.train.run.checkpoint import restore_model


def parity_reward(prompts, completions, **_):
    """1 when the completion starts with an even code point, else 0."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def write_data(d) -> None:
    """``prompts.jsonl`` (additions) and ``pref.jsonl`` (64 yes/no preference pairs) in ``d``."""
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    (d / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in prompts))
    rng = np.random.default_rng(0)
    pairs = [
        {
            "prompt": f"q{i}?",
            "chosen": str(rng.choice(["yes", "sure", "ok"])),
            "rejected": str(rng.choice(["no", "never", "nah"])),
        }
        for i in range(64)
    ]
    (d / "pref.jsonl").write_text("\n".join(json.dumps(r) for r in pairs))


def grpo_step(data, out, tiny: dict, engine: str):
    """One GRPO step (``rollout.correction`` on, so the sampler/learner gap is logged) of the
    tiny model ``tiny``; -> (metrics, config, params before, params after)."""
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(out),
            max_steps=1,
            algorithm="grpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=tiny),
            optim=dict(name="sgd", lr=1e-2),
            data=dict(train=str(data / "prompts.jsonl"), max_length=32),
            loss=dict(kl_coef=0.0),
            rollout=dict(
                prompts_per_step=4,
                group_size=4,
                max_new_tokens=8,
                engine=engine,
                correction=dict(high=2.0),
            ),
            rewards=[dict(name="tests.models.family_steps:parity_reward")],
            logging=dict(tensorboard=False, plots=False),
            eval=dict(before=False),
        ),
    )
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        before = jax.device_get(trainer.policy.state.params)
        metrics = trainer.train_step(1)
        after = jax.device_get(trainer.policy.state.params)
    finally:
        trainer.close()
    assert np.isfinite(metrics["loss"])
    # float32 sampler and learner: the same policy up to rounding
    assert metrics["correction/mismatch_kl"] < 1e-10
    assert abs(metrics["correction/weight_mean"] - 1) < 1e-5
    return metrics, trainer.policy.config, before, after


def moved(after, before, module: str) -> float:
    """The largest change of any weight of ``params["layers"][module]``."""
    diff = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after, before)
    return max(jax.tree.leaves(diff["layers"][module]))


def _is_spec(s):
    return isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], tuple)


def dpo_steps(data, out, tiny: dict):
    """12 DPO steps of the tiny model ``tiny``: the loss starts at log 2 (policy = reference)
    and falls; the checkpoint holds the family's parameter tree. -> the restored config."""
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(out),
            max_steps=12,
            algorithm="dpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=tiny),
            optim=dict(lr=3e-3),
            loss=dict(beta=0.1),
            data=dict(train=str(data / "pref.jsonl"), max_length=32),
            train=dict(batch_size=8),
            logging=dict(tensorboard=False, plots=False),
        ),
    )
    train_offline(cfg, log_stream=open(os.devnull, "w"))
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) >= 2 and all(np.isfinite(losses))
    assert losses[0] == pytest.approx(np.log(2), abs=1e-3)  # policy = reference at step 1
    assert np.mean(losses[-3:]) < losses[0] - 0.05
    config, params, _ = restore_model(os.path.join(cfg.output_dir, "checkpoints"))
    want = models.param_shapes_and_axes(config)
    shapes = jax.tree.map(lambda x: tuple(x.shape), params)
    assert shapes == jax.tree.map(lambda s: s[0], want, is_leaf=_is_spec)
    return config

"""Offline algorithms learn a separable synthetic preference task (tiny models, CPU).

Every prompt's preferred replies come from one small set of words and the dispreferred ones
from another, so a policy that learns the preference ranks *held-out* pairs (new prompts and
new pairings) correctly. Measured on held-out pairs with the implicit reward
r(y) = log π(y|x) − log π_init(y|x): accuracy P(r(chosen) > r(rejected)) must exceed 0.9 and
the mean margin r(chosen) − r(rejected) must widen from 0 — for DPO, IPO, robust DPO, KTO,
ORPO, SimPO and the pairwise-rank loss. The reward model's scalar head reaches > 0.9 pairwise
accuracy on held-out pairs, and SFT lowers held-out NLL.
"""

import functools
import json
import os
import random

import jax
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.data import CharTokenizer, Format, Padding, collate_preferences, prepare_dataset
from jaxrl_llm.losses import summed_logps
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.offline.trainer import train_offline
from jaxrl_llm.train.run.checkpoint import restore_model

GOOD = ["yes", "sure", "gladly", "ok"]
BAD = ["no", "never", "nope", "nah"]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefs")
    rng = random.Random(0)

    def prompt(i):
        return f"q{i}: {rng.choice('abcdefgh')}{rng.randint(0, 99)}?"

    def write(name, rows):
        (d / name).write_text("\n".join(json.dumps(r) for r in rows))

    for split, n in (("train", 256), ("heldout", 64)):
        pairs = [
            {"prompt": prompt(i), "chosen": rng.choice(GOOD), "rejected": rng.choice(BAD)}
            for i in range(n)
        ]
        write(f"pref_{split}.jsonl", pairs)
        write(
            f"kto_{split}.jsonl",
            [
                {"prompt": p["prompt"], "completion": p[k], "label": k == "chosen"}
                for p in pairs
                for k in ("chosen", "rejected")
            ],
        )
        write(
            f"rank_{split}.jsonl",
            [
                {
                    "prompt": p["prompt"],
                    "responses": [
                        rng.choice(GOOD),
                        rng.choice(BAD),
                        rng.choice(GOOD),
                        rng.choice(BAD),
                    ],
                    "scores": [1.0, -1.0, 0.5, -0.5],
                }
                for p in pairs
            ],
        )
        write(
            f"sft_{split}.jsonl",
            [{"prompt": p["prompt"], "completion": p["chosen"]} for p in pairs],
        )
    return d


def run(sets, tmp_path, algorithm, data, loss=None, steps=40, lr=3e-3):
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "run"),
            max_steps=steps,
            algorithm=algorithm,
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
            optim=dict(lr=lr),
            loss=loss or {},
            data=dict(
                train=str(sets / f"{data}_train.jsonl"),
                eval=str(sets / f"{data}_heldout.jsonl"),
                max_length=48,
            ),
            train=dict(batch_size=8, eval_batches=8),
            logging=dict(tensorboard=False, plots=False),
        ),
    )
    summary = train_offline(cfg, log_stream=open(os.devnull, "w"))
    return cfg, summary


def implicit_reward_stats(sets, cfg):
    """Held-out accuracy and margin of r(y) = log π(y|x) − log π_init(y|x)."""
    config, params, _ = restore_model(os.path.join(cfg.output_dir, "checkpoints"))
    init = models.init_params(config, jax.random.PRNGKey(cfg.seed))
    tok = CharTokenizer()
    data = prepare_dataset(str(sets / "pref_heldout.jsonl"), Format.PREFERENCE, tok, max_len=48)
    batch = collate_preferences(data.items, padding=Padding(pad_id=0, multiple=16))
    apply_fn = functools.partial(models.apply, config=config)
    r = {}
    for side in ("chosen", "rejected"):
        lp = summed_logps(params, batch, apply_fn=apply_fn, prefix=f"{side}_")
        lp0 = summed_logps(init, batch, apply_fn=apply_fn, prefix=f"{side}_")
        r[side] = np.asarray(lp - lp0)
    return float(np.mean(r["chosen"] > r["rejected"])), float(np.mean(r["chosen"] - r["rejected"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm,data,loss",
    [
        ("dpo", "pref", {"beta": 0.1}),
        ("dpo", "pref", {"beta": 0.1, "kind": "ipo"}),
        ("dpo", "pref", {"beta": 0.1, "kind": "robust", "label_smoothing": 0.1}),
        ("kto", "kto", {"beta": 0.1}),
        ("orpo", "pref", {"beta": 0.1}),
        ("simpo", "pref", {"beta": 2.0, "gamma": 0.5}),
        ("pairwise_rank", "rank", {"beta": 0.3, "group_size": 4}),
    ],
    ids=["dpo", "ipo", "robust_dpo", "kto", "orpo", "simpo", "pairwise_rank"],
)
def test_preference_algorithms_learn_heldout_preferences(sets, tmp_path, algorithm, data, loss):
    cfg, _ = run(sets, tmp_path, algorithm, data, loss)
    acc, margin = implicit_reward_stats(sets, cfg)
    assert acc > 0.9, (acc, margin)
    assert margin > 0.5, (acc, margin)  # starts at exactly 0 (policy = initial model)


@pytest.mark.slow
def test_reward_model_reaches_heldout_pairwise_accuracy(sets, tmp_path):
    _, summary = run(sets, tmp_path, "reward_model", "pref")
    assert summary["eval_after"]["eval/rewards/accuracies"] > 0.9, summary


@pytest.mark.slow
def test_sft_lowers_heldout_nll(sets, tmp_path):
    _, summary = run(sets, tmp_path, "sft", "sft", steps=30)
    before, after = summary["eval_before"]["eval/nll"], summary["eval_after"]["eval/nll"]
    assert after < 0.5 * before, (before, after)

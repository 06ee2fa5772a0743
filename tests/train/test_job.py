"""The pure parts of a multi-process job's start checks (``train/run/job.py``); the checks across
2 processes: ``tests/train/test_multihost_faults.py``."""

import os

from jaxrl_llm.train.run.job import first_difference, flat_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(ROOT, "configs", "sft.yaml")
TINY = ["model.source=tiny", "model.tokenizer=char"]


def test_first_difference_names_the_first_key_in_order():
    a = {"max_steps": "2", "optim.lr": "0.01", "rollout.prompts_per_step": "8"}
    assert first_difference(a, dict(a)) is None
    assert first_difference(a, {**a, "rollout.prompts_per_step": "16"}) == (
        "rollout.prompts_per_step"
    )
    assert first_difference(a, {**a, "optim.lr": "0.1", "max_steps": "3"}) == "max_steps"
    assert first_difference(a, {k: v for k, v in a.items() if k != "optim.lr"}) == "optim.lr"


def test_flat_config_leaves_out_output_dir_only(tmp_path):
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig

    cfg = load_config(RunConfig, SFT, [*TINY, f"output_dir={tmp_path}"])
    flat = flat_config(cfg)
    assert "output_dir" not in flat
    assert flat["max_steps"] == "30" and flat["distributed.failure_timeout_s"] == "60.0"
    other = load_config(RunConfig, SFT, [*TINY, "output_dir=elsewhere"])
    assert flat_config(other) == flat

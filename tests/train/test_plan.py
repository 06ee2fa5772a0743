"""The run plan (train/config/plan.py): a config resolved once; its batch layout checks what the
strategies hand over; ``jaxrl-llm compile`` lowers the train step the trainer runs."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from jaxrl_llm.parallel import topology
from jaxrl_llm.train.config.batch_layout import BatchLayout
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from tests.train.test_online import toy_config, toy_data  # noqa: F401  (fixture)

needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_available(), reason="the TPU compiler (libtpu) is not installed"
)
MESH = dict(data=2, fsdp=4, tensor=1, expert=1, context=1)


def _offline(algorithm, **over):
    base = dict(
        output_dir="/tmp/x",
        max_steps=1,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char"),
        data=dict(train="x.jsonl", max_length=32),
        train=dict(batch_size=8, micro_batches=2),
    )
    return from_dict(RunConfig, {**base, **over})


def test_group_rl_plan(toy_data, tmp_path):  # noqa: F811
    cfg = toy_config(
        toy_data,
        tmp_path,
        "grpo",
        loss=dict(kl_coef=0.0),  # GRPO's preset has β > 0: no skipping, a reference
        rollout=dict(prompts_per_step=8, group_size=4),
    )
    plan = plan_run(cfg, MESH)
    r = plan.rows
    assert (r.per_step, r.per_update, r.minibatches, r.group, r.shards) == (32, 32, 1, 4, 8)
    # skipping: micro-batches of whole groups whose rows split over 8 shards (2 groups each)
    assert r.micro_batches == 4 and plan.needs.skip_zero and r.group_minibatches
    assert not plan.needs.reference and not plan.needs.critic and plan.needs.correction is None
    assert plan.layout.names == (
        "input_ids",
        "attention_mask",
        "loss_mask",
        "old_logp",
        "advantages",
    )
    assert plan.logprobs.window == cfg.rollout.max_new_tokens
    assert plan.handover_layout == plan.layout and plan.pack is None


def test_reference_correction_critic_and_pairs_change_the_layout(toy_data, tmp_path):  # noqa: F811
    kl = toy_config(
        toy_data,
        tmp_path,
        "grpo",
        loss=dict(kl_coef=0.1),
        rollout=dict(prompts_per_step=8, group_size=4, correction=dict(decoupled=True)),
    )
    plan = plan_run(kl, MESH)
    assert plan.needs.reference and plan.needs.reference_in_loss
    assert plan.needs.correction == "proximal_logp" and plan.rows.micro_batches == 1  # β > 0
    assert plan.layout.names[-2:] == ("ref_logp", "proximal_logp")
    assert "proximal_logp" not in plan.handover_layout.names  # added after the hand-over

    ppo = plan_run(toy_config(toy_data, tmp_path, "ppo"), MESH)
    assert ppo.needs.critic and ppo.needs.reference and not ppo.needs.reference_in_loss
    assert [f.name for f in ppo.companion_fields] == ["values", "returns"]
    assert ppo.handover_layout.names[-2:] == ("values", "returns")

    pairs = plan_run(toy_config(toy_data, tmp_path, "online_dpo"), MESH)
    assert pairs.rows.minibatches == 1 and pairs.rows.per_update == 8  # one pair per prompt
    assert pairs.rows.forward == 8
    assert pairs.layout.kind == "preference" and "ref_chosen_logps" in pairs.layout.names

    packed = plan_run(toy_config(toy_data, tmp_path, "grpo", logprobs=dict(pack=True)), MESH)
    assert packed.pack is not None and packed.logprobs.prompt_group_size == 1
    assert {"segment_ids", "positions", "unpack_index"} <= set(packed.step_layout.names)


def test_offline_plan():
    dpo = plan_run(_offline("dpo"), MESH)
    assert (dpo.rows.per_update, dpo.rows.micro_batches) == (8, 2)
    assert dpo.needs.reference_in_loss and dpo.layout.kind == "preference"
    sft = plan_run(_offline("sft"), MESH)
    assert sft.layout.names == ("input_ids", "attention_mask", "loss_mask")
    assert not sft.needs.reference and not sft.needs.skip_zero


def test_layout_check_names_the_mismatch():
    layout = plan_run(_offline("sft"), MESH).layout
    ok = {k: np.zeros((2, 5), np.int32) for k in layout.names}
    layout.check(ok, where="test")
    with pytest.raises(ValueError, match=r"missing \['loss_mask'\]"):
        layout.check({k: v for k, v in ok.items() if k != "loss_mask"}, where="test")
    with pytest.raises(ValueError, match="input_ids is float32"):
        layout.check({**ok, "input_ids": np.zeros((2, 5), np.float32)}, where="test")
    with pytest.raises(ValueError, match="tokens is 6"):
        layout.check({**ok, "loss_mask": np.zeros((2, 6), np.int32)}, where="test")
    assert isinstance(layout, BatchLayout)


def _spec(x):
    return tuple(x.sharding.spec) if hasattr(x.sharding, "spec") else None


@needs_libtpu
@pytest.mark.parametrize(
    "over",
    [
        dict(),
        dict(
            loss=dict(kl_coef=0.05),
            rollout=dict(prompts_per_step=8, group_size=4, max_new_tokens=3, correction={}),
            schedules=[dict(name="kl_coef", end=0.01)],
        ),
    ],
    ids=["grpo", "kl+correction+schedule"],
)
def test_compile_lowers_the_train_step_the_trainer_runs(toy_data, tmp_path, monkeypatch, over):  # noqa: F811
    """The acceptance test of the run plan: for one config, the train step that ``jaxrl-llm
    compile`` lowers for a TPU slice takes the same batch keys, shapes and dtypes, the same
    train state (shapes, dtypes, shardings) and the same traced hyperparameters as the step
    the trainer calls, on an 8-device mesh of the same axis sizes."""
    from jaxrl_llm.train.compile import aot as aot
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    kw = dict(
        loss=dict(kl_coef=0.0),
        rollout=dict(prompts_per_step=8, group_size=4, max_new_tokens=3),
        mesh=MESH,
    )
    cfg = toy_config(toy_data, tmp_path / "run", "grpo", **{**kw, **over})
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    seen: dict = {}
    step_fn = trainer.learner.step_fn

    def spy(state, batch, frozen, *hparams):
        seen.setdefault("args", (state, dict(batch), frozen, hparams))
        return step_fn(state, batch, frozen, *hparams)

    trainer.learner.step_fn = spy
    try:
        trainer.train_step(1)
    finally:
        trainer.close()
    state, batch, frozen, hparams = seen["args"]
    t = np.shape(batch["input_ids"])[1]

    compiled: dict = {}
    real = aot.compile_program

    def record(name, jitted, args, resident, **kw):
        compiled[name] = args
        return real(name, jitted, args, resident, **kw)

    monkeypatch.setattr(aot, "compile_program", record)
    v5e = topology.tpu_topology("v5e:2x4")
    report = aot.compile_run(
        cfg, trainer.policy.config, v5e, seq_len=t, prompt_len=t - cfg.rollout.max_new_tokens
    )
    c_state, c_batch, c_frozen, c_hparams = compiled["train"]
    as_np = {
        k: (np.shape(v), jax.dtypes.canonicalize_dtype(np.asarray(v).dtype))
        for k, v in batch.items()
    }
    assert {k: (v.shape, v.dtype) for k, v in c_batch.items()} == as_np
    ts, cs = jax.tree.structure(state), jax.tree.structure(c_state)
    assert ts == cs
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(c_state), strict=True):
        assert (a.shape, a.dtype, _spec(a)) == (b.shape, b.dtype, _spec(b))
    assert set(c_frozen) == set(frozen)
    assert set(c_hparams) == set(hparams[0] if hparams else {})
    names = {p.name for p in report.programs}
    # the sampler's copy is made by the reshard program (colocated, its own layout)
    want = {"train", "reshard", "decode"} | ({"reference", "recompute"} if over else set())
    assert names == want


@needs_libtpu
def test_jaxrl_llm_compile_takes_a_run_config(toy_data, tmp_path, capsys):  # noqa: F811
    import yaml

    from jaxrl_llm.cli.main import main

    hf = dict(
        model_type="llama",
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    (tmp_path / "config.json").write_text(json.dumps(hf))
    run = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        algorithm="dapo",
        model=dict(source=str(tmp_path), remat="none"),
        mesh=dict(data=4),
        data=dict(train=str(toy_data / "train.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=8, group_size=4, max_new_tokens=96),
        logprobs=dict(pack=True),
        rewards=[dict(name="math_answer")],
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    args = ["compile", "--config", str(tmp_path / "run.yaml"), "--topology", "v5e:2x2"]
    assert main([*args, "--no-decode", "--json", "rollout.group_size=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "dapo" and out["settings"]["seq_len"] == 128
    assert out["settings"]["group_size"] == 2 and {p["name"] for p in out["programs"]} == {"train"}
    s = dataclasses.asdict(plan_run(from_dict(RunConfig, run), {"data": 4}).rows)
    assert s["per_step"] == 32

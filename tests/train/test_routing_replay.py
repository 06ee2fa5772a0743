"""``rollout.routing_replay`` (R3; Ma et al. 2025, https://arxiv.org/abs/2510.11370) through the
online trainer: a tiny Qwen3-MoE GRPO run records the sampler's routing, hands it to the learner
(the plan's ``routing`` batch entry, packed with ``logprobs.pack``) and replays it in the update.

On CPU in float32 the sampler and the trainer route alike, so here the sampler is handed the
policy's weights with a slightly perturbed router (as a bfloat16 sampler or another kernel
would differ): the trainer's own top-k then differs from the recorded routing on some decisions
(``routing/own_topk_mismatch_frac`` > 0); with replay the update routes as the sampler did
(``routing/mismatch_frac`` = 0), without it (``record_routing`` only) the two fractions are
equal.
"""

import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.batch_layout import ROUTING_FIELD
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.trainer import OnlineTrainer


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy_r3")
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": f"{a}{b}>", "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return d


def _config(toy_data, out, algorithm="grpo", *, model=None, **over):
    base = dict(
        output_dir=str(out),
        max_steps=2,
        algorithm=algorithm,
        seed=3,
        model=model
        or dict(source="tiny", tokenizer="char", tiny=dict(family="qwen3_moe", num_layers=2)),
        optim=dict(name="sgd", lr=1e-2),
        data=dict(train=str(toy_data / "train.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=3),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        logging=dict(tensorboard=False, plots=False),
        eval=dict(before=False),
    )
    for k, v in over.items():
        base[k] = {**base[k], **v} if isinstance(base.get(k), dict) else v
    return from_dict(RunConfig, base)


def _perturb_sampler_router(trainer, scale=0.3):
    """The sampler gets the policy's weights with router kernels + ``scale`` × std noise."""
    weights_fn = trainer.rollouts.weights_fn

    def perturbed():
        params, version = weights_fn()
        kernel = params["layers"]["router"]["kernel"]
        noise = jax.random.normal(jax.random.PRNGKey(7), kernel.shape, kernel.dtype)
        layers = {
            **params["layers"],
            "router": {"kernel": kernel + scale * jnp.std(kernel) * noise},
        }
        return {**params, "layers": layers}, version

    trainer.rollouts.weights_fn = perturbed


def _two_steps(cfg, perturb=True):
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    batches = []
    prepare = trainer.strategy.prepare

    def recording_prepare(exp, reference):
        out = prepare(exp, reference)
        batches.append((exp, out.batch))
        return out

    trainer.strategy.prepare = recording_prepare
    if perturb:
        _perturb_sampler_router(trainer)
    try:
        return [trainer.train_step(s) for s in (1, 2)], batches, trainer.policy.config
    finally:
        trainer.close()


def _assert_replay_pins_the_update(cfg):
    """Two steps of ``cfg`` (``routing_replay``) with a perturbed sampler router: the update
    routes as recorded (0 differing decisions) where its own router would not."""
    metrics, _, _ = _two_steps(cfg)
    for m in metrics:
        assert np.isfinite(m["loss"]) and m["routing/mismatch_frac"] == 0.0
        assert m["routing/own_topk_mismatch_frac"] > 0.0


@pytest.mark.parametrize(
    "rollout, logprobs, mesh",
    [
        (dict(), dict(), dict()),
        (dict(engine="paged"), dict(pack=True), dict()),
        (dict(), dict(), dict(data=2, expert=4)),  # experts split 4 ways (8 CPU devices)
        (dict(correction=dict()), dict(), dict()),  # the recompute forward replays too
    ],
    ids=["static", "paged-packed", "expert-mesh", "correction"],
)
def test_grpo_with_routing_replay_runs_two_steps(toy_data, tmp_path, rollout, logprobs, mesh):
    cfg = _config(
        toy_data,
        tmp_path,
        rollout=dict(routing_replay=True, **rollout),
        logprobs=logprobs,
        mesh=mesh,
    )
    metrics, batches, config = _two_steps(cfg)
    assert len(batches) == 2
    for m, (exp, batch) in zip(metrics, batches, strict=True):
        n, t = batch["input_ids"].shape
        assert exp.routing.shape == (n, t, config.num_layers, config.num_experts_per_tok)
        np.testing.assert_array_equal(batch["routing"], exp.routing.astype(np.int32))
        assert np.isfinite(m["loss"])
        assert m["routing/mismatch_frac"] == 0.0  # the update routes as the sampler did
        assert 0.0 < m["routing/own_topk_mismatch_frac"] < 0.5  # its own router would not
    if logprobs:
        assert 0 < metrics[0]["pack/fill"] <= 1


def test_recorded_routing_without_replay_is_only_compared(toy_data, tmp_path):
    cfg = _config(toy_data, tmp_path, rollout=dict(record_routing=True))
    metrics, _, _ = _two_steps(cfg)
    for m in metrics:
        assert m["routing/mismatch_frac"] > 0.0
        assert m["routing/mismatch_frac"] == pytest.approx(m["routing/own_topk_mismatch_frac"])


def test_plan_declares_the_routing_entry(toy_data, tmp_path):
    cfg = _config(toy_data, tmp_path, rollout=dict(routing_replay=True), logprobs=dict(pack=True))
    plan = plan_run(cfg, dict(data=1))
    assert ROUTING_FIELD in plan.layout.fields
    packed = dict(
        plan.step_layout.shapes(
            rows=8, tokens=20, window=3, packed_rows=8, packed_len=20, layers=2, topk=2
        )
    )
    assert packed["routing"] == ((8, 20, 2, 2), "int32")
    plain = plan_run(_config(toy_data, tmp_path), dict(data=1))
    assert "routing" not in plain.layout.names


def test_routing_replay_config_errors(toy_data, tmp_path):
    with pytest.raises(ConfigError, match="no experts"):
        OnlineTrainer(
            _config(
                toy_data,
                tmp_path,
                model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
                rollout=dict(routing_replay=True),
            ),
            log_stream=open(os.devnull, "w"),
        )
    packed_dpo = _config(
        toy_data,
        tmp_path,
        "online_dpo",
        rollout=dict(routing_replay=True),
        logprobs=dict(pack=True),
    )
    with pytest.raises(ConfigError, match="unpacked preference pairs only"):
        plan_run(packed_dpo, {})


def test_concat_experience_left_pads_routing_and_rl_batch_carries_it():
    """Dynamic sampling's concatenation widens prompts to the widest: the routing's prompt
    columns are left-padded with the experts 0..k−1 (masked positions), and ``rl_batch``
    hands the routing over aligned with ``input_ids``."""
    from jaxrl_llm.train.online.experience import concat_experience, rl_batch
    from tests.train.test_experience import make_experience, make_rollout

    def part(p, seed):
        ro = make_rollout(
            prompt_tokens=np.full((2, p), 5),
            prompt_mask=np.ones((2, p)),
            tokens=[[7, 8], [9, 10]],
            mask=np.ones((2, 2)),
            logprobs=np.zeros((2, 2)),
        )
        r = np.random.default_rng(seed).integers(0, 8, (2, p + 2, 3, 2)).astype(np.int16)
        return make_experience(ro._replace(routing=r), [1.0, 0.0], group_size=2), r

    (a, ra), (b, rb) = part(2, 0), part(3, 1)
    out = concat_experience([a, b], max_groups=2)
    assert out.routing.shape == (4, 5, 3, 2) and out.routing.dtype == np.int16
    np.testing.assert_array_equal(out.routing[:2, 1:], ra)
    np.testing.assert_array_equal(out.routing[:2, 0], np.broadcast_to([0, 1], (2, 3, 2)))
    np.testing.assert_array_equal(out.routing[2:], rb)
    batch = rl_batch(out, np.ones(4, np.float32), np.ones(4, np.int32))
    assert batch["routing"].dtype == np.int32
    assert batch["routing"].shape[:2] == batch["input_ids"].shape
    np.testing.assert_array_equal(batch["routing"], out.routing)


QWEN3_5_MOE = dict(
    source="tiny", tokenizer="char", tiny=dict(family="qwen3_5_moe_text", vocab_size=259)
)


# the paged engine, which records per slot (the static engine's recording is checked on the
# Llama-layout MoE and gpt-oss; this family's static case took 109 s of the suite)
@pytest.mark.parametrize("engine", ["paged"])
def test_hybrid_moe_records_and_replays_every_layers_routing(toy_data, tmp_path, engine):
    """Qwen3.5-MoE (Gated DeltaNet and attention layers, an MoE block in each): the samplers
    record [N, T, L, k] in layer order. With the sampler's own weights the trainer's routing
    equals the recording on every decision (each layer reads its own slice, not the slice of
    its rank among the layers of its kind); with a perturbed sampler router, replay pins the
    update to the recording. Replay reads the recording, not the engine that made it, and both
    engines' recordings equal the trainer's routing, so replay runs on the paged engine's."""
    same = _config(
        toy_data,
        tmp_path / "same",
        model=QWEN3_5_MOE,
        rollout=dict(record_routing=True, engine=engine),
    )
    metrics, batches, config = _two_steps(same, perturb=False)
    assert config.is_hybrid and config.num_layers == 4
    for m, (exp, _) in zip(metrics, batches, strict=True):
        assert exp.routing.shape[2:] == (4, config.num_experts_per_tok)
        assert m["routing/mismatch_frac"] == 0.0 and m["routing/own_topk_mismatch_frac"] == 0.0
    replay = _config(
        toy_data,
        tmp_path / "replay",
        model=QWEN3_5_MOE,
        rollout=dict(routing_replay=True, engine=engine),
    )
    _assert_replay_pins_the_update(replay)


def test_multi_turn_episodes_record_and_replay_every_tokens_routing(chat_data, tmp_path):
    """A multi-turn environment: the paged engine records the experts of the opening, the
    policy's turns and the environment's replies (appended through ``extend``), laid out as the
    learner's ``input_ids``. With the sampler's own weights the trainer routes every token as
    recorded (so the layout is aligned, replies included); with a perturbed sampler router,
    replay pins the update to the recording."""
    from tests.envs.scripted import STOP

    moe = dict(family="qwen3_moe", num_layers=2, vocab_size=259, eos_token_ids=[2, *STOP])
    common = dict(
        model=dict(source="tiny", tokenizer="char", tiny=moe),
        data=dict(train=str(chat_data / "train.jsonl")),
        env=dict(name="tests.envs.scripted:Scripted", kwargs=dict(replies=["ok"]), max_turns=3),
    )
    same = _config(
        chat_data,
        tmp_path / "same",
        rollout=dict(record_routing=True, engine="paged", max_new_tokens=24),
        **common,
    )
    metrics, batches, config = _two_steps(same, perturb=False)
    for m, (exp, batch) in zip(metrics, batches, strict=True):
        assert m["env/turns_mean"] > 1 and m["env/env_tokens_mean"] > 0
        assert exp.routing.shape[:2] == batch["input_ids"].shape
        assert m["routing/mismatch_frac"] == 0.0 and m["routing/own_topk_mismatch_frac"] == 0.0
    replay = _config(
        chat_data,
        tmp_path / "replay",
        rollout=dict(routing_replay=True, engine="paged", max_new_tokens=24),
        **common,
    )
    _assert_replay_pins_the_update(replay)


def test_online_dpo_records_and_replays_each_sides_routing(toy_data, tmp_path):
    """Online DPO: each pair's chosen and rejected rows carry the sampler's routing
    (``chosen_routing`` / ``rejected_routing``, aligned with their ``input_ids``), stacked as
    the pair forward stacks the rows. With the sampler's own weights the update routes every
    token as recorded; with a perturbed sampler router, replay pins it to the recording."""
    plan = plan_run(
        _config(toy_data, tmp_path / "plan", "online_dpo", rollout=dict(routing_replay=True)),
        dict(data=1),
    )
    assert {"chosen_routing", "rejected_routing"} <= set(plan.layout.names)
    assert "routing" not in plan.layout.names
    same = _config(
        toy_data,
        tmp_path / "same",
        "online_dpo",
        rollout=dict(record_routing=True, max_new_tokens=6, prompts_per_step=8),
    )
    metrics, batches, config = _two_steps(same, perturb=False)
    for m, (_, batch) in zip(metrics, batches, strict=True):
        for side in ("chosen", "rejected"):
            n, t = batch[f"{side}_input_ids"].shape
            assert batch[f"{side}_routing"].shape == (n, t, 2, config.num_experts_per_tok)
        assert m["routing/mismatch_frac"] == 0.0 and m["routing/own_topk_mismatch_frac"] == 0.0
    replay = _config(
        toy_data,
        tmp_path / "replay",
        "online_dpo",
        rollout=dict(routing_replay=True, max_new_tokens=6, prompts_per_step=8),
    )
    _assert_replay_pins_the_update(replay)


GEMMA4_MOE = dict(
    source="tiny",
    tokenizer="char",
    tiny=dict(
        family="gemma4_text",
        vocab_size=259,
        moe_beside_mlp=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=40,
    ),
)


@pytest.mark.parametrize("engine", ["paged"])  # static: as above (64 s)
def test_gemma4_moe_beside_the_mlp_records_and_replays_routing(toy_data, tmp_path, engine):
    """Gemma 4's experts beside the dense MLP (the 26B-A4B's block): the samplers record
    every layer's experts; with the sampler's own weights the update routes as recorded, and
    with a perturbed sampler router replay pins it to the recording (on the paged engine's
    recording: both engines record what the trainer routes)."""
    same = _config(
        toy_data,
        tmp_path / "same",
        model=GEMMA4_MOE,
        rollout=dict(record_routing=True, engine=engine),
    )
    metrics, batches, config = _two_steps(same, perturb=False)
    assert config.moe_beside_mlp
    for m, (exp, batch) in zip(metrics, batches, strict=True):
        assert exp.routing.shape[:3] == (*batch["input_ids"].shape, config.num_layers)
        assert m["routing/mismatch_frac"] == 0.0 and m["routing/own_topk_mismatch_frac"] == 0.0
    replay = _config(
        toy_data,
        tmp_path / "replay",
        model=GEMMA4_MOE,
        rollout=dict(routing_replay=True, engine=engine),
    )
    _assert_replay_pins_the_update(replay)

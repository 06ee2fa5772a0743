"""Context parallelism in the trainers (``mesh.context``): one SFT and one DPO step of the
offline trainer, and one GRPO learner update of the online trainer, with every row's tokens
split over ``context=4`` (rows over ``data=2`` or ``fsdp=2``), give the loss and updated
parameters of a single-device step on the same examples without the padding to a multiple
of 4; the step goes round the ring (ring attention, Liu et al. 2023). Configs that cannot
split T are one-line ConfigErrors naming the key. 8 forced CPU devices (tests/conftest.py)."""

import dataclasses
import functools
import os

import jax
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.data import BucketMode, Padding, collate_fn_for, pack_rl_batch, pad_length
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.preflight import check_mesh
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.offline.trainer import OfflineTrainer
from jaxrl_llm.train.online.trainer import OnlineTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR = 0.5
RTOL = 1e-5


def _cfg(tmp_path, algorithm, mesh, **sections):
    base = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        algorithm=algorithm,
        seed=0,
        model=dict(source="tiny", tokenizer="char"),
        optim=dict(name="sgd", lr=LR, grad_clip=None, schedule="constant"),
        mesh=mesh,
        logging=dict(tensorboard=False, plots=False),
    )
    return from_dict(RunConfig, {**base, **sections})


def _plain(policy):
    """The policy as one program on one device: no mesh bound into its forward."""
    return dataclasses.replace(policy, apply_fn=functools.partial(M.apply, config=policy.config))


def _single_device_update(policy, spec, loss_config, logprobs, batch, params0):
    """(loss, params after one SGD step) of the plain loss on ``batch``, jitted without a
    mesh: the reference the context-parallel step must reproduce."""
    loss_fn = _plain(policy).loss_fn(spec.loss_fn, loss_config=loss_config, logprobs=logprobs)
    full = {**batch, "loss_denominator": spec.denominator_fn(batch, config=loss_config)}
    local = jax.tree.map(np.asarray, params0)
    frozen = jax.tree.map(np.asarray, jax.device_get(policy.frozen()))  # LoRA: the base
    (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(local, full, **frozen)
    return float(loss), jax.tree.map(lambda p, g: p - LR * np.asarray(g), local, grads)


def _assert_same_update(new, expected, params0):
    for (path, a), b, p in zip(
        jax.tree_util.tree_flatten_with_path(new)[0],
        jax.tree.leaves(expected),
        jax.tree.leaves(params0),
    ):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-7, err_msg=name)
        # the updates themselves, to 1e-4 of the largest, or to the rounding of the new
        # float32 parameters when an update is that small
        step, step0 = np.asarray(a) - p, np.asarray(b) - p
        tol = max(1e-4 * float(np.abs(step0).max()), 2 * float(np.spacing(np.abs(p)).max()))
        assert float(np.abs(step - step0).max()) <= tol, name


def _goes_round_the_ring(step_fn, state, batch, frozen):
    text = step_fn.jitted.lower(state, batch, frozen, {}).as_text()
    return "collective_permute" in text


TINY = dict(source="tiny", tokenizer="char")
OFFLINE = [
    ("sft", "arith_sft", dict(data=2, context=4), TINY, False),
    ("sft", "arith_sft", dict(fsdp=2, context=4), TINY, False),
    ("dpo", "arith_prefs", dict(data=2, context=4), {**TINY, "lora": dict(rank=4)}, False),
    ("dpo", "arith_prefs", dict(data=2, context=4), TINY, True),
]


@pytest.mark.parametrize("algorithm,data,mesh,model,packing", OFFLINE)
def test_offline_step_matches_single_device(tmp_path, algorithm, data, mesh, model, packing):
    """SFT (also rows over fsdp), DPO with LoRA adapters (the reference: the base), and DPO
    on packed pairs (``data.packing``) against the padded single-device step."""
    cfg = _cfg(
        tmp_path,
        algorithm,
        mesh,
        model=model,
        data=dict(
            train=f"{ROOT}/data/{data}/train.jsonl",
            max_length=192 if packing else 96,  # two pairs' sequences fit one row
            shuffle=False,
            packing=packing,
        ),
        train=dict(batch_size=4, reference="on_the_fly"),
    )
    trainer = OfflineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        p = trainer.policy
        assert dict(p.mesh.shape)["context"] == 4
        params0 = jax.device_get(p.state.params)
        items = trainer.train_data.items[:4]  # the first batch (no shuffling)
        tight = collate_fn_for(
            trainer.format,
            padding=Padding(pad_id=trainer.padding.pad_id, bucket=BucketMode.NONE),
        )(items)
        width = next(v.shape[1] for k, v in tight.items() if k.endswith("input_ids"))
        assert width % 4, "the single-device batch should need padding to split"
        if trainer.reference is not None:  # DPO: the frozen copy's log-probs, one device
            ref_fn = functools.partial(
                trainer.plan.spec.reference_fn,
                apply_fn=_plain(p).apply_fn,
                config=trainer.plan.loss_config,
                logprobs=trainer.plan.logprobs,
            )
            ref_params = jax.tree.map(np.asarray, jax.device_get(p.reference_params()))
            tight.update(jax.device_get(jax.jit(ref_fn)(ref_params, tight)))
        loss0, expected = _single_device_update(
            p, trainer.plan.spec, trainer.plan.loss_config, trainer.plan.logprobs, tight, params0
        )

        metrics = trainer.train_step(1)
        assert metrics["loss"] == pytest.approx(loss0, rel=RTOL)
        _assert_same_update(jax.device_get(p.state.params), expected, params0)
        padded = trainer._prepare(trainer.collate(items))
        assert all(v.shape[1] % 4 == 0 for k, v in padded.items() if k.endswith("input_ids"))
        assert ("pair_index" in padded) == packing
        if packing:  # 8 sequences in fewer rows than the padded [2B, T] forward's 8
            assert padded["input_ids"].shape[0] < 8
        assert _goes_round_the_ring(trainer.step_fn, p.state, padded, p.frozen())
    finally:
        trainer.close()


def _rl_batch(vocab, *, groups=2, group=4, prompt=5, completion=6, seed=0):
    """A learner batch in the ``rl`` layout (left-padded prompt + completion), T = 11: not a
    multiple of 4. The second group's rewards are equal, so its advantages are all zero and
    the update skips its micro-batch."""
    rng = np.random.default_rng(seed)
    n, t = groups * group, prompt + completion
    ids = rng.integers(1, vocab, size=(n, t)).astype(np.int32)
    p_len = np.repeat(rng.integers(2, prompt + 1, size=groups), group)
    c_len = rng.integers(2, completion + 1, size=n)
    col = np.arange(t)[None, :]
    attn = ((col >= prompt - p_len[:, None]) & (col < prompt + c_len[:, None])).astype(np.int32)
    lmask = ((col >= prompt) & (attn == 1)).astype(np.int32)
    adv = np.concatenate([rng.standard_normal(group), np.zeros(group)]).astype(np.float32)
    old = -rng.uniform(1.0, 5.0, size=(n, t)).astype(np.float32)
    return {
        "input_ids": ids * attn,
        "attention_mask": attn,
        "loss_mask": lmask,
        "old_logp": old * lmask,
        "advantages": adv[:, None] * lmask,
    }


@pytest.mark.parametrize(
    "mesh, pack",
    [
        (dict(data=2, context=4), False),
        (dict(fsdp=2, context=4), False),
        (dict(data=2, context=4), True),
    ],
)
def test_grpo_learner_update_matches_single_device(tmp_path, mesh, pack):
    """Also with the learner's rows packed (``logprobs.pack``): packed rows of 12 tokens
    split over the ring, against the padded single-device update."""
    cfg = _cfg(
        tmp_path,
        "grpo",
        mesh,
        data=dict(train=f"{ROOT}/data/addition/train.jsonl", max_length=96),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=6),
        loss=dict(kl_coef=0.0),
        logprobs=dict(shared_prompt=False, pack=pack),
        rewards=[dict(name="math_answer")],
    )
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        p = trainer.policy
        assert trainer.plan.rows.micro_batches == 2  # one micro-batch per group, one skipped
        params0 = jax.device_get(p.state.params)
        batch = _rl_batch(p.config.vocab_size)
        loss0, expected = _single_device_update(
            p, trainer.plan.spec, trainer.plan.loss_config, trainer.plan.logprobs, batch, params0
        )
        metrics = trainer.learner.update(p, batch, 1, frozen=p.frozen())
        assert metrics["update/computed_frac"] == 0.5
        assert metrics["loss"] == pytest.approx(loss0, rel=RTOL)
        _assert_same_update(jax.device_get(p.state.params), expected, params0)
        padded = pad_length(batch, 4, side="left")
        assert padded["input_ids"].shape == (8, 12)
        assert ("pack/fill" in metrics) == pack
        if pack:
            padded = pack_rl_batch(batch, window=6, row_len=12, micro_batches=2, row_multiple=2)
            assert padded["input_ids"].shape[1] == 12
        assert _goes_round_the_ring(trainer.step_fn, p.state, padded, p.frozen())
    finally:
        trainer.close()


def test_pad_length_pads_every_token_leaf_of_its_prefix():
    batch = {
        "chosen_input_ids": np.ones((2, 5), np.int32),
        "chosen_loss_mask": np.ones((2, 5), np.int32),
        "rejected_input_ids": np.ones((2, 8), np.int32),
        "rejected_attention_mask": np.ones((2, 8), np.int32),
        "ref_chosen_logps": np.ones((2,), np.float32),
    }
    right = pad_length(batch, 4, pad_id=7)
    assert right["chosen_input_ids"].shape == right["chosen_loss_mask"].shape == (2, 8)
    assert (right["chosen_input_ids"][:, 5:] == 7).all() and right["chosen_loss_mask"][
        :, 5:
    ].sum() == 0
    assert right["rejected_input_ids"] is batch["rejected_input_ids"]  # 8 splits already
    assert right["ref_chosen_logps"] is batch["ref_chosen_logps"]
    left = pad_length({"input_ids": np.ones((1, 3), np.int32)}, 4, side="left")
    assert left["input_ids"].tolist() == [[0, 1, 1, 1]]
    with pytest.raises(ValueError, match="left padding of packed rows"):
        pad_length({"input_ids": np.ones((1, 3)), "segment_ids": np.ones((1, 3))}, 4, side="left")


def test_configs_that_cannot_split_their_tokens_are_config_errors(tmp_path):
    sft = dict(data=dict(train="unused.jsonl", max_length=90), train=dict(batch_size=4))
    with pytest.raises(
        ConfigError, match=r"data\.max_length=90 cannot be split over mesh\.context=4"
    ):
        check_mesh(_cfg(tmp_path, "sft", dict(context=4), **sft), 8)
    check_mesh(_cfg(tmp_path, "sft", dict(context=2), **sft), 8)  # 90 splits over 2
    forced = {**sft, "model": dict(source="tiny", tokenizer="char", attention="blockwise")}
    forced["data"] = dict(train="unused.jsonl", max_length=96)
    with pytest.raises(ConfigError, match="model.attention=blockwise"):
        check_mesh(_cfg(tmp_path, "sft", dict(context=4), **forced), 8)
    grpo = dict(
        data=dict(train="unused.jsonl"),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=6),
        rewards=[dict(name="math_answer")],
    )
    with pytest.raises(ConfigError, match="logprobs.shared_prompt"):
        check_mesh(_cfg(tmp_path, "grpo", dict(context=4), **grpo), 8)
    with pytest.raises(ConfigError, match="mesh.context=0"):
        _cfg(tmp_path, "sft", dict(context=0), **sft)


def test_online_reference_forward_is_padded_to_the_ring(tmp_path):
    """β > 0 on ``context=4``: the reference forward pads T = 11 to 12 (so it goes round the
    ring like the update) and crops ``ref_logp`` back: the single-device values."""
    cfg = _cfg(
        tmp_path,
        "grpo",
        dict(data=2, context=4),
        data=dict(train=f"{ROOT}/data/addition/train.jsonl", max_length=96),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=6),
        loss=dict(kl_coef=0.04),
        logprobs=dict(shared_prompt=False),
        rewards=[dict(name="math_answer")],
    )
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        p = trainer.policy
        batch = _rl_batch(p.config.vocab_size)
        seen = []
        trainer._t_ref = 0.0  # set by train_step in a run
        ref_fn = trainer.programs.reference
        trainer.programs = dataclasses.replace(
            trainer.programs,
            reference=lambda params, b: seen.append(b["input_ids"].shape) or ref_fn(params, b),
        )
        got = trainer.reference(batch)["ref_logp"]
        assert seen == [(8, 12)] and got.shape == (8, 11)
        plain = functools.partial(
            trainer.plan.spec.reference_fn,
            apply_fn=_plain(p).apply_fn,
            config=trainer.plan.loss_config,
            logprobs=trainer.plan.logprobs,
        )
        ref_params = jax.tree.map(np.asarray, jax.device_get(trainer.ref_params))
        want = jax.jit(plain)(ref_params, batch)["ref_logp"]
        np.testing.assert_allclose(got, want, atol=1e-5)
    finally:
        trainer.close()

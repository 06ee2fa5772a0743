"""Expert parallelism (jaxrl_llm.models.moe): a tiny Qwen3-MoE (8 experts, top-2) with its experts
split over ``expert=4`` (and ``fsdp=2 × expert=4``) gives the single-device forward, router
load-balancing loss and gradients, and one train step through ``Policy`` (the aux loss added
by ``Policy.loss_fn``) gives the single-device update. 8 forced CPU devices
(tests/conftest.py)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm import ops
from jaxrl_llm.losses import get_loss
from jaxrl_llm.parallel import (
    DEFAULT_RULES,
    batch_sharding,
    batch_sharding_tree,
    logical_to_sharding,
    make_mesh,
)
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.policy import build_policy
from jaxrl_llm.train.programs.step import make_train_step

CFG = M.ModelConfig.tiny("qwen3_moe")  # 2 layers, d=48, 8 experts of width 40, top-2
MESHES = [dict(data=2, expert=4), dict(fsdp=2, expert=4)]
AUX_COEF = 0.05


def _params(config, seed=0):
    params = M.init_params(config, jax.random.PRNGKey(seed))
    # A sharper router: the top-2 choice then has clear margins, so float reordering across
    # devices cannot flip a near tie.
    params["layers"]["router"]["kernel"] = params["layers"]["router"]["kernel"] * 30.0
    return params


def _batch(vocab, rows=4, t=16, seed=4):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(rows, t)).astype(np.int32)
    lengths = np.asarray([t, 13, 9, 16])[:rows]
    attn = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    loss = attn * (np.arange(t)[None, :] >= np.asarray([[3], [2], [1], [5]])[:rows])
    return {"input_ids": ids * attn, "attention_mask": attn, "loss_mask": loss.astype(np.int32)}


def _loss(params, batch):
    out = M.apply(params, batch["input_ids"], config=CFG, attention_mask=batch["attention_mask"])
    logits = M.logits_from_hidden(params, out.hidden, CFG)
    logp = ops.token_logprobs_from_hidden(
        out.hidden[:, :-1], out.unembed, batch["input_ids"][:, 1:], chunk_size=8
    )
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    nll = ops.masked_sum(-logp, mask) / jnp.sum(mask)
    return nll + AUX_COEF * out.router_aux_loss, (logits, out.router_aux_loss)


def _run(params, batch):
    (loss, aux), grads = jax.jit(jax.value_and_grad(_loss, has_aux=True))(params, batch)
    return jax.device_get((loss, aux, grads))


def _assert_grads_close(grads, grads0, rel=1e-4):
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        g0 = grads0
        for key in path:
            g0 = g0[key.key]
        scale = max(float(np.max(np.abs(g0))), 1e-12)
        err = float(np.max(np.abs(np.asarray(g) - np.asarray(g0))))
        assert err <= rel * scale, (jax.tree_util.keystr(path), err, scale)


@pytest.fixture(scope="module")
def single_device():
    params, batch = _params(CFG), _batch(CFG.vocab_size)
    return params, batch, _run(params, batch)


def test_forward_aux_loss_and_grads_match_single_device(single_device):
    """fsdp=2 × expert=4 (expert=4 alone: the train step test below, which compares the loss,
    the aux loss and the update)."""
    params, batch, (loss0, (logits0, aux0), grads0) = single_device
    mesh = make_mesh(fsdp=2, expert=4)
    sharding = logical_to_sharding(M.param_logical_axes(CFG), mesh, shapes=params)
    assert sharding["layers"]["experts_gate"]["kernel"].spec[1] == "expert"
    sharded = jax.device_put(params, sharding)
    local = {s.data.shape for s in sharded["layers"]["experts_down"]["kernel"].addressable_shards}
    assert local == {(2, 8 // 4, 40, 48 // 2)}
    sharded_batch = jax.device_put(batch, batch_sharding_tree(batch, mesh, DEFAULT_RULES))
    with jax.set_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(_loss)(sharded, sharded_batch))
        loss, (logits, aux), grads = _run(sharded, sharded_batch)
    assert float(aux0) > 1.0  # top-2: a uniform router gives 2; unequal loads give more
    real = np.asarray(batch["attention_mask"], bool)
    np.testing.assert_allclose(logits[real], logits0[real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(aux, aux0, rtol=1e-6)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    _assert_grads_close(grads, grads0)


def _run_config(mesh_kw, coef):
    return from_dict(
        RunConfig,
        dict(
            output_dir="unused",
            max_steps=1,
            algorithm="sft",
            seed=0,
            data=dict(train="unused.jsonl"),
            model=dict(
                source="tiny",
                tokenizer="char",
                tiny=dict(family="qwen3_moe"),
                router_aux_loss_coef=coef,
            ),
            optim=dict(name="sgd", lr=0.5, grad_clip=None),
            mesh=mesh_kw,
            train=dict(batch_size=4),
        ),
    )


@pytest.mark.parametrize("mesh_kw", MESHES)
def test_train_step_with_aux_loss_matches_single_device(mesh_kw):
    cfg = _run_config(mesh_kw, AUX_COEF)
    policy = build_policy(cfg)
    config = policy.config
    assert policy.mesh.shape["expert"] == 4 and policy.router_aux_weight == AUX_COEF
    params0 = jax.device_get(policy.state.params)
    spec = get_loss("sft")
    loss_config = spec.config_cls()
    den_fn = functools.partial(spec.denominator_fn, config=loss_config)
    batch = _batch(config.vocab_size)

    # Single device: the bound loss (with its aux term) without a mesh, and one SGD update.
    plain = dataclasses.replace(policy, apply_fn=functools.partial(M.apply, config=config))
    loss_fn = plain.loss_fn(spec.loss_fn, loss_config=loss_config)
    full = {**batch, "loss_denominator": den_fn(batch)}
    (loss0, metrics0), grads0 = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params0, full)
    expected = jax.tree.map(lambda p, g: p - 0.5 * np.asarray(g), params0, grads0)

    step = make_train_step(
        policy.loss_fn(spec.loss_fn, loss_config=loss_config),
        policy.optimizer,
        mesh=policy.mesh,
        state_sharding=policy.state_sharding,
        batch_sharding=batch_sharding(policy.mesh),
        denominator_fn=den_fn,
    )
    state, metrics = step(policy.state, jax.device_put(batch, batch_sharding(policy.mesh)))
    assert float(metrics0["moe/aux_loss"]) > 1.0
    np.testing.assert_allclose(metrics["moe/aux_loss"], metrics0["moe/aux_loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], loss0, rtol=1e-5)
    # Compare the updates (new − old), as the gradients are compared above.
    new = jax.device_get(state.params)
    _assert_grads_close(
        jax.tree.map(np.subtract, new, params0), jax.tree.map(np.subtract, expected, params0)
    )
    moved = new["layers"]["experts_gate"]["kernel"] - params0["layers"]["experts_gate"]["kernel"]
    assert np.abs(moved).max() > 0  # the experts were trained


def test_aux_weight_is_the_coefficient_over_the_micro_batches_a_step_sums():
    from jaxrl_llm.models import ModelConfig
    from jaxrl_llm.parallel import make_mesh as mesh_of
    from jaxrl_llm.train.config.plan import plan_run
    from jaxrl_llm.train.programs.policy import router_aux_weight

    mesh = mesh_of(data=2, expert=4)
    offline = dataclasses.replace(
        _run_config(dict(data=2, expert=4), None),
        train=dataclasses.replace(_run_config({}, None).train, batch_size=4, micro_batches=2),
    )
    off_micro = plan_run(offline, mesh).rows.micro_batches
    assert off_micro == 2
    assert router_aux_weight(offline, CFG, off_micro) == pytest.approx(CFG.router_aux_loss_coef / 2)
    assert router_aux_weight(offline, ModelConfig.tiny("qwen3"), off_micro) == 0.0  # dense
    online = from_dict(
        RunConfig,
        dict(
            output_dir="unused",
            max_steps=1,
            algorithm="grpo",
            data=dict(train="unused.jsonl"),
            model=dict(source="tiny", tokenizer="char", router_aux_loss_coef=0.3),
            loss=dict(kl_coef=0.0),
            mesh=dict(data=2, expert=4),
            rollout=dict(prompts_per_step=8, group_size=4, max_new_tokens=8),
            rewards=[dict(name="math_answer")],
        ),
    )
    micro = plan_run(online, mesh).rows.micro_batches
    assert micro > 1  # zero-advantage groups are skippable: the update is split
    assert router_aux_weight(online, CFG, micro) == pytest.approx(0.3 / micro)

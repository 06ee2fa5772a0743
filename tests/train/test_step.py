import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import batch_sharding, logical_to_sharding, make_mesh
from jaxrl_llm.train import count_tokens, create_train_state, make_train_step, split_micro_batches
from tests.train.common import (
    nll_loss,
    nll_train_step,
    ragged_batch,
    tiny_config,
)

CFG = tiny_config()
BATCH = ragged_batch(0, 8, 10, CFG.vocab_size)


def _run(mesh_shape, optimizer, batch, *, micro_batches=1, cfg=CFG, steps=1, **kw):
    n = int(np.prod(mesh_shape))
    mesh = make_mesh(
        data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2], devices=jax.devices()[:n]
    )
    state, step = nll_train_step(mesh, optimizer, config=cfg, micro_batches=micro_batches, **kw)
    params0 = jax.device_get(state.params)
    for _ in range(steps):
        state, metrics = step(state, batch)
    return params0, state, jax.device_get(metrics)


@pytest.fixture(scope="module")
def single_device():
    # SGD with lr 1: params_new = params - grad, so the update *is* the gradient.
    return _run((1, 1, 1), optax.sgd(1.0), BATCH)


def _max_diff(a, b):
    return max(
        jax.tree.leaves(
            jax.tree.map(
                lambda x, y: float(
                    np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
                ),
                a,
                b,
            )
        )
    )


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)])
def test_loss_and_grads_match_single_device(single_device, mesh_shape):
    p0, ref_state, ref_metrics = single_device
    _, state, metrics = _run(mesh_shape, optax.sgd(1.0), BATCH)
    assert metrics["loss"] == pytest.approx(float(ref_metrics["loss"]), abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(float(ref_metrics["grad_norm"]), abs=1e-5)
    ref_grads = jax.tree.map(lambda a, b: a - b, p0, jax.device_get(ref_state.params))
    grads = jax.tree.map(lambda a, b: a - b, p0, jax.device_get(state.params))
    assert _max_diff(grads, ref_grads) < 1e-5
    assert float(ref_metrics["grad_norm"]) > 0.1  # the comparison is not vacuous
    # the updated params keep the rule-table sharding (FSDP over 'fsdp')
    if mesh_shape[1] == 8:
        emb = state.params["embed"]["embedding"]
        assert {s.data.shape for s in emb.addressable_shards} == {(CFG.vocab_size, 4)}


def test_loss_metrics_are_token_mean_nll(single_device):
    _, _, m = single_device
    n_targets = float(BATCH["loss_mask"][:, 1:].sum())
    assert m["loss_tokens"] == BATCH["loss_mask"].sum()
    assert m["tokens"] == BATCH["attention_mask"].sum()
    assert m["loss"] == pytest.approx(m["nll_sum"] / n_targets, rel=1e-6)


def test_grad_accumulation_equals_big_batch(single_device):
    # 4 micro-batches of 2 ragged rows on a 2-device mesh vs one batch of 8 on one device.
    p0, ref_state, ref_m = single_device
    _, state, m = _run((2, 1, 1), optax.sgd(1.0), BATCH, micro_batches=4)
    assert m["loss"] == pytest.approx(float(ref_m["loss"]), rel=1e-6)
    assert m["grad_norm"] == pytest.approx(float(ref_m["grad_norm"]), rel=1e-5)
    assert m["nll_sum"] == pytest.approx(float(ref_m["nll_sum"]) / 4, rel=1e-5)  # averaged
    assert _max_diff(state.params, ref_state.params) < 1e-6
    # the mean of per-micro-batch token means differs (ragged masks): accumulation is exact
    # only because of the shared loss_denominator
    stacked, _ = split_micro_batches(BATCH, 4)
    loss = jax.jit(functools.partial(nll_loss, config=CFG))
    per_mb = [float(loss(p0, {k: v[i] for k, v in stacked.items()})[0]) for i in range(4)]
    assert abs(np.mean(per_mb) - float(ref_m["loss"])) > 1e-3


def _no_loss_tokens(mb):
    return jnp.all(mb["loss_mask"] == 0)


def test_skipped_micro_batches_leave_the_update_unchanged():
    # Rows 1, 5 (micro-batch 1) and 3, 7 (micro-batch 3) carry no loss tokens: their loss and
    # gradient are exactly zero, so skipping their forward and backward changes nothing.
    batch = dict(BATCH)
    lm = np.array(batch["loss_mask"])
    lm[[1, 3, 5, 7]] = 0
    batch["loss_mask"] = lm
    _, ref_state, ref_m = _run((1, 1, 1), optax.sgd(1.0), batch, micro_batches=4)
    _, state, m = _run((1, 1, 1), optax.sgd(1.0), batch, micro_batches=4, skip_fn=_no_loss_tokens)
    assert m["computed_micro_batches"] == 2.0 and "computed_micro_batches" not in ref_m
    assert m["loss"] == pytest.approx(float(ref_m["loss"]), rel=1e-6)
    assert _max_diff(state.params, ref_state.params) < 1e-7
    # the loss's own metrics average over the micro-batches that ran
    assert m["nll_sum"] == pytest.approx(2 * float(ref_m["nll_sum"]), rel=1e-5)
    # the skip branch really replaces the computation: skipping a micro-batch that has loss
    # tokens changes the update
    _, wrong, _ = _run(
        (1, 1, 1),
        optax.sgd(1.0),
        batch,
        micro_batches=4,
        skip_fn=lambda mb: mb["loss_mask"].sum() < 1e9,
    )
    assert _max_diff(wrong.params, ref_state.params) > 1e-3


def test_split_micro_batches_is_a_strided_partition():
    x = np.arange(12).reshape(6, 2)
    stacked, scalars = split_micro_batches({"x": x, "loss_denominator": np.float32(4)}, 3)
    assert stacked["x"].shape == (3, 2, 2)
    np.testing.assert_array_equal(stacked["x"][1], x[[1, 4]])
    assert set(scalars) == {"loss_denominator"}
    with pytest.raises(ConfigError, match="not divisible by micro_batches=4"):
        split_micro_batches({"x": x}, 4)


def test_count_tokens_preference_batch():
    m = np.array([[1, 1, 0], [1, 0, 0]])
    lm = np.array([[0, 1, 0], [0, 0, 0]])
    t, lt = count_tokens(
        {
            "chosen_attention_mask": m,
            "rejected_attention_mask": m,
            "chosen_loss_mask": lm,
            "rejected_loss_mask": lm,
        }
    )
    assert (float(t), float(lt)) == (6.0, 2.0)


def test_bf16_compute_keeps_f32_master_weights_and_opt_state(single_device):
    cfg = tiny_config(compute_dtype="bfloat16")
    _, state, m = _run((2, 2, 2), optax.adamw(1e-2), BATCH, cfg=cfg, compute_dtype=jnp.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state[0].mu)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state[0].nu)} == {jnp.dtype(jnp.float32)}
    # bf16 compute is close to, but not bit-identical with, the f32 loss at the same params
    ref_loss = float(single_device[2]["loss"])
    assert m["loss"] == pytest.approx(ref_loss, abs=5e-2)
    assert m["loss"] != ref_loss
    assert np.isfinite(m["grad_norm"])


def test_frozen_params_are_sharded_arguments_and_grad_clip():
    mesh = make_mesh(data=2, fsdp=4)
    ax = {"w": ("embed", "mlp")}
    sh = logical_to_sharding(ax, mesh)

    def loss(params, batch, *, ref_params):  # ½‖θ − θ_ref‖², gradient θ − θ_ref
        del batch
        d = params["w"] - ref_params["w"]
        return 0.5 * jnp.sum(d * d), {}

    opt = optax.sgd(1.0)
    state, ssh = create_train_state(
        lambda r: {"w": jnp.zeros((8, 4))}, opt, mesh, param_axes=ax, rng=jax.random.PRNGKey(0)
    )
    ref = {"w": jax.device_put(jnp.full((8, 4), 0.5), sh["w"])}
    batch = {"x": np.zeros((8, 1), np.float32)}
    step = make_train_step(
        loss,
        opt,
        mesh=mesh,
        state_sharding=ssh,
        batch_sharding=batch_sharding(mesh),
        frozen_sharding={"ref_params": sh},
    )
    new, m = step(state, batch, {"ref_params": ref})
    np.testing.assert_allclose(np.asarray(new.params["w"]), 0.5)  # one SGD step lands on ref
    assert float(m["grad_norm"]) == pytest.approx(0.5 * np.sqrt(32))
    assert int(new.step) == 1
    # clipped to norm 1: the step moves θ by exactly 1 in the gradient direction
    state, _ = create_train_state(
        lambda r: {"w": jnp.zeros((8, 4))}, opt, mesh, param_axes=ax, rng=jax.random.PRNGKey(0)
    )
    clipped = make_train_step(
        loss,
        opt,
        mesh=mesh,
        state_sharding=ssh,
        batch_sharding=batch_sharding(mesh),
        grad_clip=1.0,
        frozen_sharding={"ref_params": sh},
    )
    new, _ = clipped(state, batch, {"ref_params": ref})
    assert float(jnp.linalg.norm(new.params["w"])) == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ConfigError, match="micro_batches=0"):
        make_train_step(
            loss,
            opt,
            mesh=mesh,
            state_sharding=ssh,
            batch_sharding=batch_sharding(mesh),
            micro_batches=0,
        )

"""Activations by rows (issue 30, item 2): the train step compiled on 8 forced CPU devices
holds B / N rows of the MLP activations and the log-prob chunks on each device, not B."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_llm import models
from jaxrl_llm.parallel import (
    activation_spec,
    batch_sharding,
    constrain,
    layout_mesh,
    make_mesh,
    under_mesh,
)
from jaxrl_llm.train import create_train_state, make_train_step
from tests.train.common import axes, init_fn, nll_denominator, nll_loss, ragged_batch, tiny_config

# Odd sizes, so each buffer's shape names one activation: F = 88, V = 97, T = 12, chunk 8.
CFG = tiny_config(vocab_size=97, hidden_size=40, intermediate_size=88, num_heads=5, num_kv_heads=1)
B, T = 16, 12
BATCH = ragged_batch(0, B, T, CFG.vocab_size)


def _compiled_text(mesh):
    optimizer = optax.sgd(1.0)
    state, sharding = create_train_state(
        init_fn(CFG), optimizer, mesh, param_axes=axes(CFG), rng=jax.random.PRNGKey(0)
    )
    step = make_train_step(
        functools.partial(nll_loss, config=CFG),
        optimizer,
        mesh=mesh,
        state_sharding=sharding,
        batch_sharding=batch_sharding(mesh),
        denominator_fn=nll_denominator,
        donate=False,
    )
    batch = {k: jnp.asarray(v) for k, v in BATCH.items()}
    return step.jitted.lower(state, batch, {}, {}).compile().as_text()


def _rows(text: str, tail: str) -> set[int]:
    """The leading sizes of every buffer shaped ``[rows, *tail]`` in the compiled program."""
    return {int(m) for m in re.findall(r"\[(\d+)," + re.escape(tail) + r"\]", text)}


@pytest.mark.parametrize("shape", [dict(fsdp=8), dict(data=2, fsdp=4)])
def test_train_step_holds_its_own_rows(shape):
    mesh = make_mesh(**shape)
    text = _compiled_text(mesh)
    n = 8
    mlp = _rows(text, f"{T},{CFG.intermediate_size}")  # [B, T, F] MLP activations
    chunk = _rows(text, f"8,{CFG.vocab_size}")  # [B, chunk, V] log-prob chunks
    print(f"{shape}: MLP [rows,{T},88] rows {sorted(mlp)}; logits [rows,8,97] rows {sorted(chunk)}")
    assert mlp == {B // n}, mlp
    assert chunk == {B // n}, chunk


def test_activation_spec_rows_not_model_dim():
    mesh = make_mesh(fsdp=8)
    # rows over fsdp; the model dimension whole (the weights' embed rule would shard it)
    assert activation_spec(("batch", "length", "embed"), mesh, (16, 12, 40)) == P(
        "fsdp", None, None
    )
    # rows the axes do not divide are left to the compiler
    assert activation_spec(("batch", None, "vocab"), mesh, (3, 8, 97)) == P(
        P.UNCONSTRAINED, P.UNCONSTRAINED, None
    )
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert activation_spec(("batch", "length", "mlp"), mesh, (16, 12, 88)) == P(
        ("data", "fsdp"), None, "tensor"
    )


def test_no_mesh_and_one_device_place_nothing():
    x = jnp.ones((4, 3, 2))
    assert layout_mesh() is None  # nothing bound: nothing placed
    one = make_mesh(data=1, devices=jax.devices()[:1])
    assert constrain(x, ("batch", "length", "embed"), one) is x
    assert under_mesh(lambda: layout_mesh(), one)() is not None


def test_single_device_trunk_unchanged_by_a_one_device_mesh():
    """A one-device mesh bound around the model gives the same bits as no mesh at all."""
    params = models.init_params(CFG, jax.random.PRNGKey(1))
    ids = jnp.asarray(BATCH["input_ids"])
    mask = jnp.asarray(BATCH["attention_mask"])
    fwd = jax.jit(functools.partial(models.trunk, config=CFG, attention_mask=mask))
    plain, _ = fwd(params, ids)
    one = make_mesh(data=1, devices=jax.devices()[:1])
    bound, _ = jax.jit(under_mesh(fwd, one))(params, ids)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(bound))


def test_largest_buffers_name_per_device_rows():
    from jaxrl_llm.train.compile.aot_inputs import largest_buffers

    text = _compiled_text(make_mesh(fsdp=8))
    every = largest_buffers(text, top=None)
    print("\n".join(every[:8]))
    # [B, T, F] MLP activations, or [L, B, T, F] as the layer scan saves them for the backward
    mlp = [b for b in every if re.match(rf"f32\[(\d+,)?\d+,{T},{CFG.intermediate_size}\] ", b)]
    rows = {int(b[4 : b.index("]")].split(",")[-3]) for b in mlp}  # the B of [.., B, T, F]
    print("MLP buffers:", mlp)
    assert mlp and rows == {B // 8}, mlp

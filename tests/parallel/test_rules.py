import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import init_params, param_logical_axes
from jaxrl_llm.parallel import (
    DEFAULT_RULES,
    ShardingFallbackWarning,
    batch_sharding,
    batch_sharding_tree,
    logical_to_sharding,
    logical_to_spec,
    make_mesh,
)
from jaxrl_llm.train import create_train_state
from tests.train.common import tiny_config


def test_rule_table_covers_every_model_axis():
    for family in ("llama", "qwen2", "qwen3"):
        cfg = tiny_config(family=family, num_labels=1)
        names = {
            a
            for axes in jax.tree.leaves(
                param_logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple)
            )
            for a in axes
        }
        assert names <= set(DEFAULT_RULES), names - set(DEFAULT_RULES)


def test_specs_for_fsdp_and_tensor():
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    assert logical_to_spec(("layers", "embed", "heads", "head_dim"), mesh) == P(
        None, "fsdp", "tensor", None
    )
    assert logical_to_spec(("vocab", "embed"), mesh) == P("tensor", "fsdp")
    assert logical_to_spec(("layers", "norm"), mesh) == P(None, None)
    # a mesh axis is used at most once per array
    assert logical_to_spec(("embed", "embed"), mesh) == P("fsdp", None)


def test_unmatched_logical_axis_raises():
    mesh = make_mesh()
    with pytest.raises(ConfigError, match="'stages' has no sharding rule"):
        logical_to_sharding({"w": ("embed", "stages")}, mesh)
    rules = {**DEFAULT_RULES, "embed": "pipeline"}
    with pytest.raises(ConfigError, match="mesh axis 'pipeline'"):
        logical_to_spec(("embed",), mesh, rules)


def test_non_divisible_dimension_falls_back_with_warning():
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    shapes = {"k": jax.ShapeDtypeStruct((2, 32, 3, 8), jnp.float32)}
    with pytest.warns(ShardingFallbackWarning, match=r"kv_heads=3.*size 4"):
        s = logical_to_sharding(
            {"k": ("layers", "embed", "kv_heads", "head_dim")}, mesh, shapes=shapes
        )
    assert s["k"].spec == P(None, "fsdp", None, None)  # embed keeps its sharding


def test_batch_sharding():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    s = batch_sharding(mesh)
    assert s.spec == P(("data", "fsdp"))
    x = jax.device_put(np.zeros((8, 5), np.float32), s)
    assert {sh.data.shape for sh in x.addressable_shards} == {(2, 5)}
    tree = batch_sharding_tree({"ids": np.zeros((8, 5)), "loss_denominator": np.float32(3)}, mesh)
    assert tree["loss_denominator"].spec == P()


def test_fsdp_really_shards_params_and_optimizer_state():
    cfg = tiny_config()
    mesh = make_mesh(data=1, fsdp=8, tensor=1)
    state, _ = create_train_state(
        lambda r: init_params(cfg, r),
        optax.adam(1e-3),
        mesh,
        param_axes=param_logical_axes(cfg),
        rng=jax.random.PRNGKey(0),
    )
    for tree in (state.params, state.opt_state[0].mu, state.opt_state[0].nu):
        for leaf, axes in zip(
            jax.tree.leaves(tree),
            jax.tree.leaves(param_logical_axes(cfg), is_leaf=lambda x: isinstance(x, tuple)),
        ):
            per_device = {s.data.nbytes for s in leaf.addressable_shards}
            if "embed" in axes:
                assert per_device == {leaf.nbytes // 8}, (axes, per_device)
            else:
                assert per_device == {leaf.nbytes}
    total = sum(x.nbytes for x in jax.tree.leaves(state.params))
    dev0 = sum(
        s.data.nbytes
        for x in jax.tree.leaves(state.params)
        for s in x.addressable_shards
        if s.device == jax.devices()[0]
    )
    norms = sum(
        x.nbytes
        for x in jax.tree.leaves(state.params)
        if x.ndim <= 2 and x.shape[-1] == cfg.hidden_size and x.shape[0] != cfg.vocab_size
    )
    assert dev0 == pytest.approx((total - norms) / 8 + norms)


def test_expert_weights_split_over_the_expert_axis():
    mesh = make_mesh(data=1, fsdp=2, expert=4)
    spec = logical_to_spec(("layers", "experts", "embed", "mlp"), mesh, shape=(2, 8, 48, 40))
    assert spec == P(None, "expert", "fsdp", "tensor")
    assert logical_to_spec(("layers", "embed", "router"), mesh) == P(None, "fsdp", None)


def test_weights_are_sharded_over_fsdp_and_context():
    """``embed`` maps to fsdp × context (ZeRO-3 over the context axis as well), and a size-1
    axis of a multi-axis rule is left out of the spec."""
    assert logical_to_spec(("vocab", "embed"), make_mesh(fsdp=2, context=4)) == P(
        "tensor", ("fsdp", "context")
    )
    assert logical_to_spec(("embed", "mlp"), make_mesh(context=8)) == P("context", "tensor")
    assert logical_to_spec(("embed", "mlp"), make_mesh(fsdp=8)) == P("fsdp", "tensor")

"""Decode over separate per-layer arrays (``models.separate_layers``): the same tokens and
log-probs as the layer scan, and a decode program with no layer loop inside its token loop."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import ModelConfig, init_params, scan_layers, separate_layers
from jaxrl_llm.sampling import SamplingConfig, pad_prompts, rollout


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_moe"])
def test_separate_layers_sample_the_same_tokens_as_the_scan(family):
    config = ModelConfig.tiny(family, eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))
    tokens, mask = pad_prompts([[5, 6, 7], [8, 9]], length=4)
    sampling = SamplingConfig(temperature=1.0, use_model_eos=False)
    kw = dict(config=config, sampling=sampling, num_samples=2, max_new_tokens=6, seed=3)
    scanned = rollout(params, tokens, mask, separate=False, **kw)
    separate = rollout(params, tokens, mask, separate=True, **kw)
    np.testing.assert_array_equal(scanned.tokens, separate.tokens)
    np.testing.assert_allclose(scanned.logprobs, separate.logprobs, atol=1e-5)


def test_separate_layers_is_a_tuple_of_the_stack_and_idempotent():
    config = ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))
    split = separate_layers(params, config)
    assert isinstance(split["layers"], tuple) and len(split["layers"]) == config.num_layers
    for i, layer in enumerate(split["layers"]):
        jax.tree.map(
            lambda w, s, i=i: np.testing.assert_array_equal(w[i], s), params["layers"], layer
        )
    assert separate_layers(split, config) is split
    hybrid = ModelConfig.tiny("qwen3_5_text")
    hp = init_params(hybrid, jax.random.PRNGKey(0))
    assert separate_layers(hp, hybrid) is hp  # a hybrid stack keeps its period scan


def test_a_separate_stack_unrolls_the_layer_loop():
    """Stacked layers lower to a loop (a ``while`` per scan); separate ones to none: the
    token loop of decode then reads each layer's weights in place (no per-step slice)."""
    config = ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))

    def body(layers, x):
        return scan_layers(
            config, layers, x, lambda c, lp, i: (c + lp["attn_norm"]["scale"], None)
        )[0]

    x = np.zeros(config.hidden_size, np.float32)
    stacked = jax.jit(body).lower(params["layers"], x).as_text()
    split = jax.jit(body).lower(separate_layers(params, config)["layers"], x).as_text()
    assert "stablehlo.while" in stacked
    assert "stablehlo.while" not in split


def _spec(x) -> tuple:
    """The partition spec of ``x``, one entry per dimension (missing ones None)."""
    spec = tuple(x.sharding.spec)
    return spec + (None,) * (x.ndim - len(spec))


needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced) devices")


@needs_8
def test_separate_layers_keep_the_sampler_copys_tensor_parallel_layout():
    """The sampler's tensor-parallel copy of an fsdp=8 learner's weights, split into separate
    layers: each layer keeps its shard layout (no weight all-gathered), and the tokens equal
    the scan's."""
    from jaxrl_llm.models import param_logical_axes
    from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh
    from jaxrl_llm.parallel.placement import plan_placement
    from jaxrl_llm.parallel.sampler_copy import SamplerCopy
    from jaxrl_llm.sampling import generate

    config = ModelConfig.tiny(
        num_heads=4, num_kv_heads=2, vocab_size=96, eos_token_ids=(90,), pad_token_id=0
    )
    params = init_params(config, jax.random.PRNGKey(0))
    mesh = make_mesh(fsdp=8)
    on_learner = jax.device_put(
        params, logical_to_sharding(param_logical_axes(config), mesh, DEFAULT_RULES, shapes=params)
    )
    copy = SamplerCopy(
        plan_placement({"fsdp": 8}, num_devices=8, tensor=2).sampler, param_logical_axes(config)
    )
    weights = copy(on_learner)
    split = separate_layers(weights, config)
    for stacked, layer in zip(
        jax.tree.leaves(weights["layers"]), jax.tree.leaves(split["layers"][0]), strict=True
    ):
        expected = NamedSharding(stacked.sharding.mesh, P(*_spec(stacked)[1:]))
        assert layer.sharding.is_equivalent_to(expected, layer.ndim), (expected, layer.sharding)
    prompts = [[5, 17, 3], [40, 2, 9, 11], [60], [7, 7, 7]] * 2
    kw = dict(
        sampling=SamplingConfig(temperature=0.8),
        num_samples=2,
        seed=3,
        max_new_tokens=8,
        mesh=copy.local_mesh,
    )
    scanned = generate(weights, config, prompts, separate=False, **kw)
    separate = generate(split, config, prompts, **kw)
    np.testing.assert_array_equal(np.asarray(scanned.tokens), np.asarray(separate.tokens))


def test_the_paged_engine_decodes_separate_layers_as_the_scan():
    """The paged engine's programs take split params too (the engine splits them on GPU)."""
    from jaxrl_llm.sampling import generate_paged

    config = ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    kw = dict(sampling=SamplingConfig(temperature=1.0), num_samples=2, seed=1, max_new_tokens=6)
    scanned = generate_paged(params, config, prompts, num_slots=4, **kw)
    separate = generate_paged(separate_layers(params, config), config, prompts, num_slots=4, **kw)
    np.testing.assert_array_equal(np.asarray(scanned.tokens), np.asarray(separate.tokens))
    np.testing.assert_allclose(
        np.asarray(scanned.logprobs), np.asarray(separate.logprobs), atol=1e-5
    )


@needs_8
def test_the_paged_engines_replicas_decode_separate_layers_as_the_scan():
    """Replicas (data=2) × tensor=2: the engine's stacked per-replica programs take split,
    tensor-parallel params and draw the scan's tokens."""
    from jaxrl_llm.models import param_logical_axes
    from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh
    from jaxrl_llm.sampling import generate_paged

    config = ModelConfig.tiny(
        num_heads=4, num_kv_heads=2, vocab_size=96, eos_token_ids=(90,), pad_token_id=0
    )
    params = init_params(config, jax.random.PRNGKey(0))
    mesh = make_mesh(data=2, tensor=2, devices=jax.devices()[:4])
    placed = jax.device_put(
        params, logical_to_sharding(param_logical_axes(config), mesh, DEFAULT_RULES, shapes=params)
    )
    prompts = [[5, 17, 3], [40, 2, 9, 11], [60], [7, 7, 7]]
    kw = dict(sampling=SamplingConfig(temperature=0.8), num_samples=2, seed=3, max_new_tokens=8)
    kw |= dict(num_slots=4, mesh=mesh)
    scanned = generate_paged(placed, config, prompts, **kw)
    separate = generate_paged(separate_layers(placed, config), config, prompts, **kw)
    np.testing.assert_array_equal(np.asarray(scanned.tokens), np.asarray(separate.tokens))

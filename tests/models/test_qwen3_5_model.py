"""The hybrid Qwen3.5 stack beyond parity: LoRA adapters, a sharded forward and gradient on 8
CPU devices, the layer pattern's period, config validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.models import LayerType
from jaxrl_llm.parallel import logical_to_sharding, make_mesh

LIN, GLOB = LayerType.LINEAR, LayerType.GLOBAL


def _tokens(b=4, t=29):
    toks = jax.random.randint(jax.random.PRNGKey(1), (b, t), 3, 97)
    mask = jnp.ones((b, t), bool).at[1, :7].set(False)
    return toks, mask


def test_lora_attached_equals_merged():
    config = M.ModelConfig.tiny("qwen3_5_text", delta_chunk_size=8)
    params = M.init_params(config, jax.random.PRNGKey(0))
    lora = M.LoRAConfig(rank=4)
    adapters = M.init_lora(config, lora, jax.random.PRNGKey(2))
    # B is zero at init; draw it so the adapters change the output
    adapters = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape), adapters
    )
    toks, mask = _tokens()
    attached, _ = M.forward(
        M.attach_lora(params, adapters, lora), toks, config=config, attention_mask=mask
    )
    merged, _ = M.forward(
        M.merge_lora(params, adapters, lora), toks, config=config, attention_mask=mask
    )
    base, _ = M.forward(params, toks, config=config, attention_mask=mask)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(attached)[m], np.asarray(merged)[m], atol=1e-4)
    assert np.abs(np.asarray(attached - base))[m].max() > 1e-3


def test_sharded_forward_and_gradient_equal_one_device():
    """Parameters placed by their logical axes over data × fsdp × tensor = 2 × 2 × 2, rows
    over data × fsdp: logits and gradients equal the single-device ones."""
    config = M.ModelConfig.tiny(
        "qwen3_5_text", vocab_size=98, num_heads=4, num_kv_heads=2, delta_chunk_size=8
    )
    params = M.init_params(config, jax.random.PRNGKey(0))
    toks, mask = _tokens()

    def loss(p, toks, mask):
        out = M.apply(p, toks, config=config, attention_mask=mask)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.sum(jax.nn.logsumexp(logits, -1) * mask) / jnp.sum(mask), logits

    (want, logits_want), grads_want = jax.value_and_grad(loss, has_aux=True)(params, toks, mask)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shardings = logical_to_sharding(M.param_logical_axes(config), mesh, shapes=params)
    placed = jax.device_put(params, shardings)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (got, logits_got), grads_got = step(
        placed, jax.device_put(toks, rows), jax.device_put(mask, rows)
    )
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(logits_got)[m], np.asarray(logits_want)[m], atol=1e-4)
    for a, b in zip(jax.tree.leaves(grads_got), jax.tree.leaves(grads_want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    q = placed["layers"]["in_proj_z"]["kernel"]
    assert len(q.sharding.device_set) == 8


def test_layer_period():
    config = M.ModelConfig.tiny("qwen3_5_text", num_layers=8, layer_types=(LIN, LIN, LIN, GLOB) * 2)
    assert config.layer_period == (LIN, LIN, LIN, GLOB)
    odd = dataclasses.replace(config, num_layers=5, layer_types=(LIN, GLOB, LIN, LIN, GLOB))
    assert odd.layer_period == odd.layer_types  # no shorter repeat: one period of 5 layers
    assert (odd.num_linear_layers, odd.num_attention_layers) == (3, 2)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(linear_num_value_heads=3), "multiple of linear_num_key_heads"),
        (dict(linear_conv_kernel=0), "linear_conv_kernel > 0"),
        (dict(partial_rotary_factor=0.1), "partial_rotary_factor"),  # 1.6 -> 1 dim, odd
        (dict(layer_types=(GLOB,) * 4), "needs LINEAR entries"),
        (
            dict(sliding_window=4, layer_types=(LIN, LayerType.LOCAL, LIN, GLOB)),
            "mix LINEAR and LOCAL",
        ),
    ],
)
def test_config_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        M.ModelConfig.tiny("qwen3_5_text", **overrides)


def test_packing_is_refused():
    config = M.ModelConfig.tiny("qwen3_5_text")
    params = M.init_params(config, jax.random.PRNGKey(0))
    toks, _ = _tokens(b=1, t=6)
    with pytest.raises(ValueError, match="segment_ids"):
        M.forward(params, toks, config=config, segment_ids=jnp.asarray([[0, 0, 0, 1, 1, 1]]))


def test_trailing_and_leading_padding_leave_the_recurrent_state_of_the_real_tokens():
    """Conv windows and delta-rule states after [pads; real; pads] equal those after the real
    tokens alone, and so do the logits of a token fed next."""
    config = M.ModelConfig.tiny("qwen3_5_text", delta_chunk_size=4)
    params = M.init_params(config, jax.random.PRNGKey(0))
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 3 else x, params)
    real = jax.random.randint(jax.random.PRNGKey(5), (1, 9), 3, 97)
    padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), real, jnp.zeros((1, 5), jnp.int32)], 1)
    valid = jnp.zeros((1, 17), bool).at[:, 3:12].set(True)
    pos = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    _, alone = M.forward(params, real, config=config, cache=M.init_cache(config, 1, 12))
    _, padc = M.forward(
        params,
        padded,
        config=config,
        positions=pos,
        attention_mask=valid,
        cache=M.init_cache(config, 1, 20),
    )
    np.testing.assert_allclose(np.asarray(padc.conv), np.asarray(alone.conv), atol=1e-6)
    np.testing.assert_allclose(np.asarray(padc.state), np.asarray(alone.state), atol=1e-5)
    nxt = jnp.asarray([[11]])
    a, _ = M.forward(params, nxt, config=config, positions=jnp.asarray([[9]]), cache=alone)
    b, _ = M.forward(params, nxt, config=config, positions=jnp.asarray([[9]]), cache=padc)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


# the dense stack (its MoE sibling differs in the feed-forward block, which acts per token and
# carries no prompt state; its case took 90 s of the suite on a 2-core host)
@pytest.mark.parametrize("family", ["qwen3_5_text"])
def test_shared_prompt_forward_equals_the_plain_one(family):
    """Groups of G = 3 rows sharing a left-padded prompt: the prompt runs once per group, the
    completions continue its recurrent state (and read its keys) repeated G times; hidden
    states and gradients equal the plain forward's up to float32 rounding (gradients within
    1e-5 of each leaf's largest entry: the plain forward with another delta-rule chunk size
    differs from itself as much)."""
    config = M.ModelConfig.tiny(family, delta_chunk_size=4)
    params = M.init_params(config, jax.random.PRNGKey(0))
    g, tp, tc = 3, 11, 9
    prompts = jax.random.randint(jax.random.PRNGKey(1), (2, tp), 3, 97)
    comps = jax.random.randint(jax.random.PRNGKey(2), (2 * g, tc), 3, 97)
    toks = jnp.concatenate([jnp.repeat(prompts, g, axis=0), comps], axis=1)
    mask = jnp.ones(toks.shape, bool).at[g:, :4].set(False)  # group 2's prompt: left padding
    mask = mask.at[1, tp + 5 :].set(False)  # a completion that ended early
    w = jax.random.normal(jax.random.PRNGKey(9), (*toks.shape, config.hidden_size))

    def loss(p, shared):
        out = M.apply(
            p,
            toks,
            config=config,
            attention_mask=mask,
            shared_prefix=(tp, g) if shared else None,
        )
        return jnp.sum(out.hidden * w * mask[..., None]), out.hidden

    (l_plain, h_plain), g_plain = jax.value_and_grad(loss, has_aux=True)(params, False)
    (l_shared, h_shared), g_shared = jax.value_and_grad(loss, has_aux=True)(params, True)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(h_shared)[m], np.asarray(h_plain)[m], atol=1e-5)
    np.testing.assert_allclose(float(l_shared), float(l_plain), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_shared), jax.tree.leaves(g_plain)):
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=0, atol=1e-5 * (1 + np.abs(b).max()))

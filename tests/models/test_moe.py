"""Sparse mixture-of-experts blocks (jaxrl_llm.models.moe) against transformers' Qwen3-MoE and
Mixtral on CPU in float32: logits within 1e-4 (a left-padded row included), the router
load-balancing loss equal to transformers' ``aux_loss``, both dispatches equal, and the
config mapping's refusals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models import Family, MoeDispatch
from tests.interop._tiny import SIZES, randomize_, tokens_and_mask

# variant -> (transformers config class, MoE kwargs)
MOE_VARIANTS = {
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=False),
    ),
    "mixtral": (
        transformers.MixtralConfig,
        dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=None),
    ),
}


def tiny_moe_hf(variant: str, seed: int = 0, **overrides):
    """A random tiny transformers MoE causal LM (2 layers, d=48, 8 experts, top-2)."""
    cls, extra = MOE_VARIANTS[variant]
    cfg = cls(**{**SIZES, "tie_word_embeddings": False, **extra, **overrides})
    torch.manual_seed(seed)
    return randomize_(transformers.AutoModelForCausalLM.from_config(cfg), seed)


def _hf_forward(hf, toks, mask):
    positions = np.asarray(M.default_positions(jnp.asarray(mask)))
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(toks),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(positions.astype(np.int64)),
            output_router_logits=True,
        )


@pytest.mark.parametrize(
    "variant,family,norm_topk",
    [("qwen3_moe", Family.QWEN3_MOE, False), ("mixtral", Family.MIXTRAL, True)],
)
def test_logits_and_aux_loss_match_transformers(variant, family, norm_topk):
    hf = tiny_moe_hf(variant, seed=3)
    loaded = interop.from_hf_model(hf)
    c = loaded.config
    assert (c.family, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (
        family,
        8,
        2,
        norm_topk,
    )
    assert c.num_params() == sum(p.numel() for p in hf.parameters())
    toks, mask = tokens_and_mask(seed=1)
    ref = _hf_forward(hf, toks, mask)
    ref_logits = ref.logits.numpy()
    assert np.abs(ref_logits[mask]).max() > 0.5
    for dispatch in MoeDispatch:
        config = dataclasses.replace(c, moe_dispatch=dispatch)
        out = jax.jit(lambda p, t, m: M.apply(p, t, config=config, attention_mask=m))(
            loaded.params, jnp.asarray(toks), jnp.asarray(mask)
        )
        logits = np.asarray(M.logits_from_hidden(loaded.params, out.hidden, config))
        np.testing.assert_allclose(logits[mask], ref_logits[mask], atol=1e-4, rtol=0)
        # transformers pools the router statistics over the real tokens of every layer.
        np.testing.assert_allclose(out.router_aux_loss, float(ref.aux_loss), rtol=1e-5)


def test_routing_renormalisation_is_exercised():
    """Qwen3-MoE's norm_topk_prob changes the logits, so the parity test checks both forms."""
    loaded = interop.from_hf_model(tiny_moe_hf("qwen3_moe", seed=3))
    toks, mask = tokens_and_mask(seed=1)
    forward = jax.jit(M.forward, static_argnames=("config",))
    run = lambda c: np.asarray(forward(loaded.params, jnp.asarray(toks), config=c)[0])
    on = run(dataclasses.replace(loaded.config, norm_topk_prob=True))
    assert np.abs(on - run(loaded.config)).max() > 1e-2


def test_uniform_router_gives_aux_loss_k_and_gradient_only_through_probabilities():
    """With a zero router every probability is 1/X: whichever k experts the ties pick,
    aux = X · Σ_x f_x · (1/X) = Σ_x f_x = k (Fedus et al. 2021's minimum is reached at
    balance; the k assignments per token make it k here). The expert weights never reach it."""
    config = M.ModelConfig.tiny("mixtral", num_experts_per_tok=3)
    params = M.init_params(config, jax.random.PRNGKey(0))
    params["layers"]["router"]["kernel"] = jnp.zeros_like(params["layers"]["router"]["kernel"])
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, config.vocab_size)
    aux = lambda p: M.apply(p, toks, config=config).router_aux_loss
    np.testing.assert_allclose(jax.jit(aux)(params), 3.0, rtol=1e-6)
    grads = jax.jit(jax.grad(aux))(params)["layers"]
    for name in ("experts_gate", "experts_up", "experts_down"):
        assert not np.any(np.asarray(grads[name]["kernel"]))
    assert np.abs(np.asarray(grads["router"]["kernel"])).max() > 0


def test_shared_prompt_forward_gives_the_plain_forwards_aux_loss():
    config = M.ModelConfig.tiny("qwen3_moe")
    params = M.init_params(config, jax.random.PRNGKey(2))
    params["layers"]["router"]["kernel"] = params["layers"]["router"]["kernel"] * 30.0
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, config.vocab_size, (2, 6))
    toks = np.concatenate([np.repeat(prompt, 3, axis=0), rng.integers(3, 97, (6, 4))], axis=1)
    mask = np.ones_like(toks, bool)
    mask[3:, :2] = False  # the second group's prompt is left-padded
    run = jax.jit(M.apply, static_argnames=("config", "shared_prefix"))
    plain = run(params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask))
    shared = run(
        params,
        jnp.asarray(toks),
        config=config,
        attention_mask=jnp.asarray(mask),
        shared_prefix=(6, 3),
    )
    np.testing.assert_allclose(shared.router_aux_loss, plain.router_aux_loss, rtol=1e-5)
    np.testing.assert_allclose(shared.hidden[mask], plain.hidden[mask], atol=1e-5, rtol=0)


def test_dense_models_report_no_aux_loss_and_keep_their_params():
    config = M.ModelConfig.tiny("qwen3")
    assert not config.is_moe and "router" not in M.param_shapes_and_axes(config)["layers"]
    out = M.apply(
        M.init_params(config, jax.random.PRNGKey(0)), jnp.ones((1, 3), int), config=config
    )
    assert out.router_aux_loss is None


def test_active_parameters_count_k_experts():
    c = M.ModelConfig.tiny("qwen3_moe")  # 8 experts of 3·48·40 weights, top-2
    assert c.num_params() - c.num_params(active=True) == c.num_layers * 6 * 3 * 48 * 40


@pytest.mark.parametrize(
    "variant,overrides,match",
    [
        ("qwen3_moe", dict(decoder_sparse_step=2), "dense layers"),
        ("qwen3_moe", dict(mlp_only_layers=[1]), "dense layers"),
        ("mixtral", dict(router_jitter_noise=0.1), "router_jitter_noise"),
    ],
)
def test_unsupported_moe_configs_are_refused(variant, overrides, match):
    cls, extra = MOE_VARIANTS[variant]
    hf_config = cls(**{**SIZES, **extra, **overrides}).to_dict()
    hf_config["architectures"] = [f"{cls.__name__[:-6]}ForCausalLM"]
    with pytest.raises(ModelLoadError, match=match):
        interop.config_from_hf_dict(hf_config)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(num_experts_per_tok=9), "num_experts_per_tok"),
        (dict(num_experts=0), "needs num_experts > 0"),
        (dict(router_aux_loss_coef=-1.0), "router_aux_loss_coef"),
    ],
)
def test_bad_moe_fields_raise(overrides, match):
    with pytest.raises(ValueError, match=match):
        M.ModelConfig.tiny("mixtral", **overrides)


def test_lora_on_a_moe_model_adapts_attention_only():
    config = M.ModelConfig.tiny("qwen3_moe")
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="experts take no adapters"):
        M.init_lora(config, M.LoRAConfig(), key)  # the default targets include gate_proj
    lora = M.LoRAConfig(rank=2, targets=("q_proj", "o_proj"))
    adapters = M.init_lora(config, lora, key)
    assert set(adapters["layers"]) == {"q_proj", "o_proj"}
    params = M.init_params(config, key)
    merged = M.merge_lora(params, adapters, lora)  # B = 0: the base model
    jax.tree.map(np.testing.assert_array_equal, merged, params)

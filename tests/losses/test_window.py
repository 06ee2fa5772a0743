"""Log-probs computed on the last W columns only (the completion of a rollout batch) equal the
full computation there, for the loss, its gradient and the reference log-probs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.losses import LOSSES, LogprobSettings, grpo_config, sequence_logps


def test_logprob_window_matches_full_computation():
    cfg = models.ModelConfig.tiny("llama")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    apply_fn = functools.partial(models.apply, config=cfg)
    b, p, m = 4, 7, 5
    ids = jax.random.randint(jax.random.PRNGKey(1), (b, p + m), 0, cfg.vocab_size)
    attn = jnp.ones((b, p + m), jnp.int32).at[1, :3].set(0)  # left-padded prompt
    comp = jnp.ones((b, m), jnp.int32).at[2, 3:].set(0)  # a shorter completion
    loss_mask = jnp.concatenate([jnp.zeros((b, p), jnp.int32), comp], 1)
    attn = attn.at[:, p:].set(comp)
    adv = jax.random.normal(jax.random.PRNGKey(2), (b, p + m)) * loss_mask
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "advantages": adv}
    full = sequence_logps(params, batch, apply_fn=apply_fn)
    win = sequence_logps(params, batch, apply_fn=apply_fn, window=m)
    np.testing.assert_allclose(win, full, atol=1e-6)
    spec = LOSSES["grpo"]
    config = grpo_config(kl_coef=0.0)
    (l1, _), g1 = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, batch, apply_fn=apply_fn, config=config
    )
    (l2, _), g2 = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, batch, apply_fn=apply_fn, config=config, logprobs=LogprobSettings(window=m)
    )
    np.testing.assert_allclose(l2, l1, atol=1e-6)
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-6), g1, g2)
    ref_full = spec.reference_fn(params, batch, apply_fn=apply_fn, config=grpo_config())
    ref_win = spec.reference_fn(
        params, batch, apply_fn=apply_fn, config=grpo_config(), logprobs=LogprobSettings(window=m)
    )
    np.testing.assert_allclose(ref_win["ref_logp"], ref_full["ref_logp"], atol=1e-6)


def test_prompt_shared_per_group_matches_plain_forward():
    """GRPO batches hold G completions of each prompt; computing the prompt once per group
    (LogprobSettings.prompt_group_size=G) gives the same loss, gradient and reference log-probs."""
    cfg = models.ModelConfig.tiny("qwen2")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    apply_fn = functools.partial(models.apply, config=cfg)
    groups, g, p, m = 2, 4, 6, 5
    prompts = jax.random.randint(jax.random.PRNGKey(1), (groups, p), 0, cfg.vocab_size)
    comps = jax.random.randint(jax.random.PRNGKey(2), (groups * g, m), 0, cfg.vocab_size)
    ids = jnp.concatenate([jnp.repeat(prompts, g, 0), comps], 1)
    p_attn = jnp.ones((groups, p), jnp.int32).at[1, :2].set(0)  # left-padded prompt
    comp = jnp.ones((groups * g, m), jnp.int32).at[2, 3:].set(0).at[7, 1:].set(0)
    attn = jnp.concatenate([jnp.repeat(p_attn, g, 0), comp], 1)
    loss_mask = jnp.concatenate([jnp.zeros((groups * g, p), jnp.int32), comp], 1)
    adv = jax.random.normal(jax.random.PRNGKey(3), (groups * g, p + m)) * loss_mask
    old = jax.random.normal(jax.random.PRNGKey(4), (groups * g, p + m)) * 0.1 - 2.0
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "advantages": adv,
        "old_logp": old * loss_mask,
        "ref_logp": old * loss_mask,
    }
    spec = LOSSES["grpo"]
    config = grpo_config(kl_coef=0.04)
    plain = LogprobSettings(window=m)
    shared = LogprobSettings(window=m, prompt_group_size=g)
    (l1, m1), g1 = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, batch, apply_fn=apply_fn, config=config, logprobs=plain
    )
    (l2, m2), g2 = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, batch, apply_fn=apply_fn, config=config, logprobs=shared
    )
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(m2["pg/clipfrac"], m1["pg/clipfrac"])
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-4), g1, g2)
    r1 = spec.reference_fn(params, batch, apply_fn=apply_fn, config=config, logprobs=plain)[
        "ref_logp"
    ]
    r2 = spec.reference_fn(params, batch, apply_fn=apply_fn, config=config, logprobs=shared)[
        "ref_logp"
    ]
    np.testing.assert_allclose(r2, r1, atol=1e-5)

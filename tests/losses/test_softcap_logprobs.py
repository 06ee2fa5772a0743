"""The losses' chunked log-probs go through Gemma 2's final-logit soft cap: on a tiny Gemma 2
the training log-probs equal log-softmax of :func:`jaxrl_llm.models.forward`'s (capped)
logits, for the chunked log-prob op with and without entropies."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.losses.common import forward_logps


@pytest.mark.parametrize("with_entropy", [False, True])
def test_training_logprobs_apply_the_final_logit_softcap(with_entropy):
    config = models.ModelConfig.tiny("gemma2")
    assert config.final_logit_softcap == 30.0
    params = models.init_params(config, jax.random.PRNGKey(0))
    # large logits so that the cap matters: scale the (tied) embedding up
    params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, config.vocab_size)
    attn = jnp.ones_like(ids)
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": attn.at[:, 0].set(0)}
    apply_fn = functools.partial(models.apply, config=config)
    logp, ent, _ = forward_logps(
        params, batch, apply_fn=apply_fn, chunk_size=4, with_entropy=with_entropy
    )
    logits, _ = models.forward(params, ids, config=config)
    ref_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ref = jnp.take_along_axis(ref_all, ids[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(logp[:, 1:]), np.asarray(ref), atol=2e-5)
    uncapped = jnp.einsum(
        "btd,dv->btv",
        models.apply(params, ids, config=config).hidden,
        models.unembedding(params, config),
    )
    assert float(jnp.max(jnp.abs(uncapped))) > 30.0  # the cap changes these logits
    if with_entropy:
        ref_ent = -jnp.sum(jnp.exp(ref_all) * ref_all, axis=-1)
        np.testing.assert_allclose(np.asarray(ent[:, 1:]), np.asarray(ref_ent), atol=2e-5)

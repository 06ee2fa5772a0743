"""Shared helpers for the parallel / train tests: a tiny model, a token-mean NLL test loss
with the losses-layer contract, and ragged batches."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import ops
from jaxrl_llm.models import ModelConfig, apply, init_params, param_logical_axes

# Dimensions divisible by every mesh axis size used in the tests (2, 4, 8).
TINY = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=False,
)


def tiny_config(**overrides) -> ModelConfig:
    return ModelConfig.tiny(**{**TINY, **overrides})


def nll_denominator(batch) -> jax.Array:
    """Number of target tokens of the whole batch."""
    return jnp.sum(batch["loss_mask"][:, 1:].astype(jnp.float32))


def nll_loss(params, batch, *, config):
    """Token-mean NLL; divides by batch['loss_denominator'] when present."""
    out = apply(params, batch["input_ids"], config=config, attention_mask=batch["attention_mask"])
    logp = ops.token_logprobs_from_hidden(
        out.hidden[:, :-1], out.unembed, batch["input_ids"][:, 1:], chunk_size=8
    )
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    total = ops.masked_sum(-logp, mask)
    den = batch["loss_denominator"] if "loss_denominator" in batch else jnp.sum(mask)
    return total / den, {"nll_sum": total}


def ragged_batch(seed: int, batch_size: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    """Right-padded rows of random lengths; the completion starts at a random offset."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab, size=(batch_size, length)).astype(np.int32)
    lengths = rs.randint(3, length + 1, size=batch_size)
    lengths[0] = length
    pos = np.arange(length)[None, :]
    attn = (pos < lengths[:, None]).astype(np.int32)
    prompt = rs.randint(1, 3, size=batch_size)
    loss = ((pos >= prompt[:, None]) & (attn == 1)).astype(np.int32)
    return {"input_ids": ids * attn, "attention_mask": attn, "loss_mask": loss}


def init_fn(config):
    return functools.partial(init_params, config)


def axes(config):
    return param_logical_axes(config)


def nll_train_step(mesh, optimizer, *, config=None, micro_batches: int = 1, **kw):
    """The tiny model's NLL train step on ``mesh`` (rows split by ``batch_sharding``), from a
    fresh state (``PRNGKey(0)``): (state, step)."""
    from jaxrl_llm.parallel import batch_sharding
    from jaxrl_llm.train import create_train_state, make_train_step

    config = config or tiny_config()
    state, sharding = create_train_state(
        init_fn(config), optimizer, mesh, param_axes=axes(config), rng=jax.random.PRNGKey(0)
    )
    step = make_train_step(
        functools.partial(nll_loss, config=config),
        optimizer,
        mesh=mesh,
        state_sharding=sharding,
        batch_sharding=batch_sharding(mesh),
        denominator_fn=nll_denominator,
        micro_batches=micro_batches,
        **kw,
    )
    return state, step

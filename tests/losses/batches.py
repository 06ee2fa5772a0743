"""Synthetic batches and helpers for tests/losses (tiny shapes, hand-made masks)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.losses import LOSSES, sequence_logps

B, T = 4, 10


def make_rows(rng, prompt_lens, lengths, t=T, vocab=97):
    """input_ids / attention_mask / loss_mask numpy arrays for right-padded rows."""
    b = len(lengths)
    ids = rng.integers(3, vocab, size=(b, t)).astype(np.int32)
    pos = np.arange(t)[None, :]
    attn = pos < np.asarray(lengths)[:, None]
    lmask = attn & (pos >= np.asarray(prompt_lens)[:, None])
    ids = np.where(attn, ids, 0).astype(np.int32)
    return ids, attn.astype(np.int32), lmask.astype(np.int32)


def seq_batch(seed=0, prompt_lens=(2, 3, 1, 4), lengths=(10, 7, 5, 9), t=T):
    rng = np.random.default_rng(seed)
    ids, attn, lm_ = make_rows(rng, prompt_lens, lengths, t)
    return {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.asarray(attn),
        "loss_mask": jnp.asarray(lm_),
    }


def rl_batch(params, apply_fn, seed=0, **kw):
    """A sequence batch with advantages, old_logp (policy + noise) and ref_logp."""
    batch = seq_batch(seed, **kw)
    rng = np.random.default_rng(seed + 100)
    m = np.asarray(batch["loss_mask"]).astype(bool)
    lp = np.asarray(logps(params, batch, apply_fn))
    shape = m.shape
    adv_row = rng.normal(size=(shape[0], 1))
    adv = np.where(m, adv_row + 0.1 * rng.normal(size=shape), 0.0)
    old = np.where(m, lp + 0.05 * rng.normal(size=shape), 0.0)
    ref = np.where(m, lp + 0.2 * rng.normal(size=shape), 0.0)
    values = np.where(m, rng.normal(size=shape), 0.0)
    returns = np.where(m, values + rng.normal(size=shape), 0.0)
    batch.update(
        advantages=jnp.asarray(adv, jnp.float32),
        old_logp=jnp.asarray(old, jnp.float32),
        ref_logp=jnp.asarray(ref, jnp.float32),
        values=jnp.asarray(values, jnp.float32),
        returns=jnp.asarray(returns, jnp.float32),
    )
    return batch


def pref_batch(
    seed=0, prompt_lens=(2, 3, 1, 4), chosen_lens=(10, 7, 5, 9), rejected_lens=(6, 9, 8, 10), t=T
):
    """A preference batch whose chosen/rejected rows share their prompt tokens."""
    rng = np.random.default_rng(seed)
    c_ids, c_attn, c_lm = make_rows(rng, prompt_lens, chosen_lens, t)
    r_ids, r_attn, r_lm = make_rows(rng, prompt_lens, rejected_lens, t)
    pos = np.arange(t)[None, :]
    in_prompt = pos < np.asarray(prompt_lens)[:, None]
    r_ids = np.where(in_prompt, c_ids, r_ids).astype(np.int32)
    out = dict(
        chosen_input_ids=c_ids,
        chosen_attention_mask=c_attn,
        chosen_loss_mask=c_lm,
        rejected_input_ids=r_ids,
        rejected_attention_mask=r_attn,
        rejected_loss_mask=r_lm,
    )
    return {k: jnp.asarray(v) for k, v in out.items()}


def kto_batch(seed=0, labels=(1, 0, 1, 0)):
    """Sequence rows + labels + mismatched KL rows (prompt i, completion of row i+1)."""
    batch = seq_batch(seed)
    rng = np.random.default_rng(seed + 7)
    ids, attn, lm_ = make_rows(rng, (2, 3, 1, 4), (8, 9, 6, 10))
    batch.update(
        kl_input_ids=jnp.asarray(ids),
        kl_attention_mask=jnp.asarray(attn),
        kl_loss_mask=jnp.asarray(lm_),
        label=jnp.asarray(labels, jnp.int32),
    )
    return batch


def rank_batch(seed=0, group_size=2):
    batch = seq_batch(seed)
    batch["scores"] = jnp.asarray([1.0, 0.0, 0.5, 2.0][: batch["input_ids"].shape[0]])
    return batch


def take_rows(batch, idx):
    """Rows ``idx`` of every [B, ...] entry of a batch (scalars are kept)."""
    idx = np.asarray(idx)
    return {k: (v[idx] if getattr(v, "ndim", 0) >= 1 else v) for k, v in batch.items()}


def pad_rows(batch, n):
    """Append ``n`` all-padding rows (zeros everywhere) to every [B, ...] entry."""
    out = {}
    for k, v in batch.items():
        if getattr(v, "ndim", 0) >= 1:
            out[k] = jnp.concatenate([v, jnp.zeros((n,) + v.shape[1:], v.dtype)], axis=0)
        else:
            out[k] = v
    return out


def pad_time(batch, n):
    """Append ``n`` padding positions to every [B, T] entry."""
    out = {}
    for k, v in batch.items():
        if getattr(v, "ndim", 0) == 2:
            out[k] = jnp.pad(v, ((0, 0), (0, n)))
        else:
            out[k] = v
    return out


def tree_allclose(a, b, rtol=1e-5, atol=1e-6):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@functools.cache
def loss_and_grad(name, config, apply_fn):
    """Cached ``jit(value_and_grad(loss))`` of a registered loss, shared by every test file.

    Tests call it with ``loss_denominator`` always present, so one compile per (loss, config,
    batch shape) serves the registry, hand-value and accumulation tests alike.
    """
    spec = LOSSES[name]

    def f(params, batch):
        return spec.loss_fn(params, batch, apply_fn=apply_fn, config=config)

    return jax.jit(jax.value_and_grad(f, has_aux=True))


@functools.cache
def _jit_logps(apply_fn, prefix):
    return jax.jit(lambda p, b: sequence_logps(p, b, apply_fn=apply_fn, prefix=prefix))


def logps(params, batch, apply_fn, prefix=""):
    """Jitted, cached :func:`jaxrl_llm.losses.sequence_logps` for the tests."""
    keys = ("input_ids", "attention_mask", "loss_mask", "segment_ids", "positions")
    sub = {f"{prefix}{k}": batch[f"{prefix}{k}"] for k in keys if f"{prefix}{k}" in batch}
    return _jit_logps(apply_fn, prefix)(params, sub)


def with_den(spec_name, batch, config):
    """``batch`` plus its full-batch ``loss_denominator`` from the spec's denominator_fn."""
    den = LOSSES[spec_name].denominator_fn(batch, config)
    return {**batch, "loss_denominator": den}

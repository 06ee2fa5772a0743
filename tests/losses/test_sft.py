"""SFT loss: hand-checked NLL, packing, padding invariance, exact micro-batch accumulation."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import losses, models
from tests.losses.batches import (
    loss_and_grad,
    pad_rows,
    pad_time,
    seq_batch,
    take_rows,
    tree_allclose,
    with_den,
)

CONFIG = losses.sft_config()


def _vg(apply_fn):
    return loss_and_grad("sft", CONFIG, apply_fn)


def test_sft_equals_masked_mean_nll_from_forward_logits(lm):
    cfg, params, apply_fn = lm
    batch = seq_batch()
    (loss, metrics), _ = _vg(apply_fn)(params, with_den("sft", batch, CONFIG))
    logits, _ = models.forward(
        params, batch["input_ids"], config=cfg, attention_mask=batch["attention_mask"]
    )
    logp_all = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    ids, lmask = np.asarray(batch["input_ids"]), np.asarray(batch["loss_mask"])
    total, count = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if lmask[b, t]:
                total -= logp_all[b, t - 1, ids[b, t]]
                count += 1
    assert count == int(lmask.sum())
    np.testing.assert_allclose(float(loss), total / count, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["nll"]), total / count, rtol=1e-5)


def test_sft_padding_rows_and_right_padding_change_nothing(lm):
    _, params, apply_fn = lm
    batch = seq_batch()
    (l0, _), g0 = _vg(apply_fn)(params, with_den("sft", batch, CONFIG))
    padded = pad_rows(batch, 2)
    (l1, _), g1 = _vg(apply_fn)(params, with_den("sft", padded, CONFIG))
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    tree_allclose(g1, g0, rtol=1e-4, atol=1e-7)
    # Extra right padding: eager (un-jitted) path without loss_denominator.
    l2, _ = losses.sft_loss(params, pad_time(batch, 3), apply_fn=apply_fn, config=CONFIG)
    np.testing.assert_allclose(float(l2), float(l0), rtol=1e-5)


def test_sft_micro_batches_sum_to_full_batch(lm):
    _, params, apply_fn = lm
    batch = seq_batch()
    full = with_den("sft", batch, CONFIG)
    (l_full, _), g_full = _vg(apply_fn)(params, full)
    for k in (2, 4):
        tot_l, tot_g = 0.0, None
        for idx in np.array_split(np.arange(4), k):
            mb = take_rows(batch, idx)
            (l, _), g = _vg(apply_fn)(params, {**mb, "loss_denominator": full["loss_denominator"]})
            tot_l += float(l)
            tot_g = g if tot_g is None else jax.tree.map(jnp.add, tot_g, g)
        np.testing.assert_allclose(tot_l, float(l_full), rtol=1e-5)
        tree_allclose(tot_g, g_full, rtol=1e-4, atol=1e-6)
    # Without the global denominator, a mean of micro-batch means is NOT the token mean here
    # (ragged masks): the contract matters.
    means = [
        float(_vg(apply_fn)(params, with_den("sft", take_rows(batch, i), CONFIG))[0][0])
        for i in ([0, 1], [2, 3])
    ]
    assert abs(np.mean(means) - float(l_full)) > 1e-4


def test_packed_sft_equals_unpacked(lm):
    """Two examples packed in one row (segment_ids, restarting positions) give the same
    token-mean loss and gradient as the two examples in separate rows."""
    _, params, apply_fn = lm
    rng = np.random.default_rng(3)
    a = rng.integers(3, 97, size=6).astype(np.int32)
    b = rng.integers(3, 97, size=5).astype(np.int32)
    t = 12
    ids = np.zeros((2, t), np.int32)
    ids[0, :6], ids[1, :5] = a, b
    attn = (ids > 0).astype(np.int32)
    lmask = attn.copy()
    lmask[:, :2] = 0  # prompts of length 2
    unpacked = {"input_ids": ids, "attention_mask": attn, "loss_mask": lmask}
    packed_ids = np.zeros((1, t), np.int32)
    packed_ids[0, :11] = np.concatenate([a, b])
    seg = np.zeros((1, t), np.int32)
    seg[0, :6], seg[0, 6:11] = 1, 2
    pm = np.zeros((1, t), np.int32)
    pm[0, 2:6], pm[0, 8:11] = 1, 1
    packed = {
        "input_ids": packed_ids,
        "attention_mask": (seg > 0).astype(np.int32),
        "loss_mask": pm,
        "segment_ids": seg,
    }
    packed["positions"] = models.default_positions(
        jnp.asarray(packed["attention_mask"]), jnp.asarray(seg)
    )
    packed = {k: jnp.asarray(v) for k, v in packed.items()}
    unpacked = {k: jnp.asarray(v) for k, v in unpacked.items()}
    f = jax.jit(
        jax.value_and_grad(
            lambda p, bt: losses.sft_loss(p, bt, apply_fn=apply_fn, config=CONFIG)[0]
        )
    )
    lu, gu = f(params, unpacked)
    lp, gp = f(params, packed)
    np.testing.assert_allclose(float(lp), float(lu), rtol=1e-5)
    tree_allclose(gp, gu, rtol=1e-4, atol=1e-6)

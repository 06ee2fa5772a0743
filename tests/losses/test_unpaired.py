"""KTO and pairwise-rank losses over parameters: hand values and padding."""

import jax
import numpy as np
import pytest

from jaxrl_llm import losses
from jaxrl_llm.errors import DataError
from tests.losses.batches import kto_batch, logps, pad_rows, rank_batch

sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731


def test_kto_by_hand(lm):
    _, params, apply_fn = lm
    batch = kto_batch(labels=(1, 0, 1, 0))
    ref_params = jax.tree.map(lambda p: p * 0.8, params)
    batch.update(losses.kto_reference_logps(ref_params, batch, apply_fn=apply_fn))
    cfg = losses.kto_config(beta=0.5, desirable_weight=1.0, undesirable_weight=1.5)
    loss, metrics = losses.kto_model_loss(params, batch, apply_fn=apply_fn, config=cfg)
    pol = np.asarray(logps(params, batch, apply_fn)).sum(-1)
    pol_kl = np.asarray(logps(params, batch, apply_fn, "kl_")).sum(-1)
    r = pol - np.asarray(batch["ref_logps"])
    z0 = max(0.0, float(np.mean(pol_kl - np.asarray(batch["ref_kl_logps"]))))
    label = np.asarray(batch["label"]).astype(bool)
    per = np.where(label, 1.0 - sigmoid(0.5 * (r - z0)), 1.5 * (1.0 - sigmoid(0.5 * (z0 - r))))
    np.testing.assert_allclose(float(loss), per.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["kl"]), z0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        float(metrics["rewards/chosen"]), 0.5 * r[label].mean(), rtol=1e-4, atol=1e-5
    )
    # Padding rows (no completion tokens, label 0, zero KL rows) change neither loss nor z0.
    padded = pad_rows(batch, 2)
    loss_p, metrics_p = losses.kto_model_loss(params, padded, apply_fn=apply_fn, config=cfg)
    np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-5)
    np.testing.assert_allclose(float(metrics_p["kl"]), float(metrics["kl"]), rtol=1e-5, atol=1e-7)
    with pytest.raises(DataError, match="kl_input_ids"):
        losses.kto_model_loss(
            params,
            {k: v for k, v in batch.items() if k != "kl_input_ids"},
            apply_fn=apply_fn,
            config=cfg,
        )


def test_pairwise_rank_by_hand_and_padding_groups(lm):
    _, params, apply_fn = lm
    batch = rank_batch()  # scores [1, 0, 0.5, 2], groups of 2
    cfg = losses.pairwise_rank_config(group_size=2, beta=0.3)
    loss, metrics = losses.pairwise_rank_model_loss(params, batch, apply_fn=apply_fn, config=cfg)
    s = np.asarray(logps(params, batch, apply_fn)).sum(-1)
    # Group 1: row 0 beats row 1; group 2: row 3 beats row 2. One ordered pair each.
    g1 = np.logaddexp(0, -0.3 * (s[0] - s[1]))
    g2 = np.logaddexp(0, -0.3 * (s[3] - s[2]))
    np.testing.assert_allclose(float(loss), (g1 + g2) / 2, rtol=1e-5)
    assert float(metrics["num_pairs"]) == 1.0
    padded = pad_rows(batch, 2)  # one whole padding group
    assert float(losses.group_denominator(padded, cfg)) == 2.0
    loss_p, _ = losses.pairwise_rank_model_loss(params, padded, apply_fn=apply_fn, config=cfg)
    np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-5)
    with pytest.raises(DataError, match="group_size=3"):
        losses.pairwise_rank_model_loss(
            params, batch, apply_fn=apply_fn, config=losses.pairwise_rank_config(group_size=3)
        )

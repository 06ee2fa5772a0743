"""train/online/correction.py: which rows the rollout correction recomputes, and the batch it builds."""

import numpy as np
import pytest

from jaxrl_llm.train.online.correction import CorrectionSection, correct_batch, recompute_rows


def _batch(informative_groups, groups=4, g=2, t=3):
    adv = np.zeros((groups * g, t), np.float32)
    for i in informative_groups:
        adv[i * g, 1] = 0.5  # one token of one row is enough
    mask = np.ones((groups * g, t), np.int32)
    return adv, mask


def test_recompute_rows_are_the_informative_groups_padded_to_a_power_of_two():
    adv, mask = _batch([1, 3])
    np.testing.assert_array_equal(recompute_rows(adv, mask, group_size=2), [2, 3, 6, 7])
    adv, mask = _batch([2])
    np.testing.assert_array_equal(recompute_rows(adv, mask, group_size=2), [4, 5])
    adv, mask = _batch([0, 1, 3])  # 3 groups -> a bucket of 4 (all)
    np.testing.assert_array_equal(recompute_rows(adv, mask, group_size=2), np.arange(8))
    adv, mask = _batch([])  # none: still one group, so the metrics exist
    np.testing.assert_array_equal(recompute_rows(adv, mask, group_size=2), [0, 1])
    adv, mask = _batch([2])
    mask[4:6] = 0  # an advantage under mask 0 does not count
    np.testing.assert_array_equal(recompute_rows(adv, mask, group_size=2), [0, 1])


def test_correct_batch_weights_only_the_recomputed_rows():
    rng = np.random.default_rng(0)
    mask = np.ones((4, 3), np.int32)
    mask[3, 2] = 0
    sampler = rng.normal(size=(4, 3)).astype(np.float32) * mask
    learner = sampler + 0.1
    batch = {"loss_mask": mask, "old_logp": sampler, "advantages": np.ones((4, 3))}
    rows = np.array([2, 3])
    out, m = correct_batch(batch, learner, CorrectionSection(high=None), rows)
    # weight π/μ = e^0.1 on the recomputed rows' real tokens, 1 elsewhere, 0 at padding
    want = np.where(mask > 0, 1.0, 0.0)
    want[2:] = np.where(mask[2:] > 0, np.exp(0.1), 0.0)
    np.testing.assert_allclose(out["is_weights"], want, rtol=1e-5)
    np.testing.assert_allclose(out["old_logp"], learner * mask, rtol=1e-6)
    assert m["correction/rows_frac"] == 0.5
    assert m["correction/weight_mean"] == pytest.approx(np.exp(0.1), rel=1e-5)
    dec, _ = correct_batch(batch, learner, CorrectionSection(decoupled=True), rows)
    assert "is_weights" not in dec and dec["old_logp"] is sampler
    np.testing.assert_allclose(dec["proximal_logp"], learner * mask, rtol=1e-6)

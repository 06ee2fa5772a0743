"""Packing (jaxrl_llm.data.packing): every sequence lands whole in one packed row, in order,
with positions restarting at 0, and the RL packer's ``unpack_index`` points every target
back at its token — also per micro-batch, which the train step splits strided."""

import numpy as np
import pytest

from jaxrl_llm.data import (
    TokenizedPreference,
    collate_preferences,
    first_fit,
    pack_preferences,
    pack_rl_batch,
)
from jaxrl_llm.errors import DataError


def rl_rows(rng, n, p, m, *, vocab=97):
    """A left-padded prompt + right-padded completion batch as ``rl_batch`` builds it."""
    p_len = rng.integers(1, p + 1, n)
    c_len = rng.integers(0, m + 1, n)
    cols = np.arange(p + m)[None, :]
    attn = ((cols >= p - p_len[:, None]) & (cols < p + c_len[:, None])).astype(np.int32)
    lmask = (attn * (cols >= p)).astype(np.int32)
    ids = np.where(attn, rng.integers(3, vocab, (n, p + m)), 0).astype(np.int32)
    adv = (rng.normal(size=(n, 1)) * lmask).astype(np.float32)
    old = (rng.normal(size=(n, p + m)) * lmask).astype(np.float32)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": lmask,
        "advantages": adv,
        "old_logp": old,
        "row_weight": rng.normal(size=n).astype(np.float32),
    }


def test_first_fit_places_every_sequence_once_within_the_row():
    rng = np.random.default_rng(0)
    for _ in range(30):
        row_len = int(rng.integers(4, 40))
        lengths = [int(x) for x in rng.integers(1, row_len + 1, int(rng.integers(1, 30)))]
        bins = first_fit(lengths, row_len)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in b) <= row_len for b in bins)
        # first-fit decreasing never leaves two bins that are each at most half full
        assert sum(sum(lengths[i] for i in b) <= row_len / 2 for b in bins) <= 1
    with pytest.raises(DataError, match="longer than the packed row length"):
        first_fit([3, 9], 8)


@pytest.mark.parametrize("micro_batches, row_len", [(1, None), (2, None), (4, 40), (2, 64)])
def test_rl_unpack_index_points_at_every_target(micro_batches, row_len):
    rng = np.random.default_rng(micro_batches)
    n, p, m = 16, 7, 9
    batch = rl_rows(rng, n, p, m)
    packed = pack_rl_batch(
        batch, window=m, row_len=row_len, micro_batches=micro_batches, row_multiple=2
    )
    length = row_len or p + m
    r = packed["input_ids"].shape[0]
    assert packed["input_ids"].shape == (r, length) and r % (2 * micro_batches) == 0
    assert packed["unpack_index"].shape == (n, m)
    # fewer packed rows than padded ones, and no token lost
    assert r < n
    assert packed["attention_mask"].sum() == batch["attention_mask"].sum()
    lm = packed["loss_mask"].astype(bool)
    np.testing.assert_array_equal(packed["loss_mask"], batch["loss_mask"][:, p:])
    np.testing.assert_array_equal(packed["advantages"], batch["advantages"][:, p:])
    np.testing.assert_array_equal(packed["old_logp"], batch["old_logp"][:, p:])
    np.testing.assert_array_equal(packed["row_weight"], batch["row_weight"])
    # micro-batch k = rows k, k + M, ... of both layouts; indices local to its packed rows
    rows_per_mb = r // micro_batches
    for k in range(micro_batches):
        ids_k = packed["input_ids"][k::micro_batches].reshape(-1)
        pos_k = packed["positions"][k::micro_batches].reshape(-1)
        seg_k = packed["segment_ids"][k::micro_batches].reshape(-1)
        for i in range(k, n, micro_batches):
            idx = packed["unpack_index"][i][lm[i]]
            assert np.all(idx < rows_per_mb * length)
            np.testing.assert_array_equal(ids_k[idx], batch["input_ids"][i, p:][lm[i]])
            # position = the token's rank among its row's real tokens (cumsum(mask) - 1)
            want = np.cumsum(batch["attention_mask"][i]) - 1
            np.testing.assert_array_equal(pos_k[idx], want[p:][lm[i]])
            # the predicting token (idx - 1) is in the same segment: no cross-sequence target
            np.testing.assert_array_equal(seg_k[idx - 1], seg_k[idx])


def test_rl_packer_refuses_targets_outside_the_window_and_short_rows():
    batch = rl_rows(np.random.default_rng(0), 4, 5, 6)
    with pytest.raises(ValueError, match="targets before the last window"):
        pack_rl_batch(batch, window=3)
    with pytest.raises(DataError, match="longer than the packed row length"):
        pack_rl_batch(batch, window=6, row_len=3)
    with pytest.raises(ValueError, match="packed already"):
        pack_rl_batch(pack_rl_batch(batch, window=6), window=6)


def test_preference_pairs_pack_into_segments_of_their_sequences():
    rng = np.random.default_rng(1)

    def toks(k):
        return tuple(int(x) for x in rng.integers(3, 50, k))

    items = [
        TokenizedPreference(toks(int(a)), toks(int(b)), toks(int(c)))
        for a, b, c in rng.integers(1, 9, (6, 3))
    ]
    padded = collate_preferences(items)
    packed = pack_preferences(items, row_len=24, micro_batches=2)
    b, r = len(items), packed["input_ids"].shape[0]
    assert r % 2 == 0 and r < 2 * b
    np.testing.assert_array_equal(packed["pair_valid"], np.ones(b))
    for k in range(2):
        ids_k = packed["input_ids"][k::2].reshape(-1)
        idx_k = packed["pair_index"][k::2].reshape(-1)
        lm_k = packed["loss_mask"][k::2].reshape(-1)
        half = b // 2
        for j, i in enumerate(range(k, b, 2)):  # pair i is pair j of micro-batch k
            for side, seq in (("chosen_", j), ("rejected_", half + j)):
                attn = padded[side + "attention_mask"][i].astype(bool)
                np.testing.assert_array_equal(
                    ids_k[idx_k == seq], padded[side + "input_ids"][i][attn]
                )
                assert lm_k[idx_k == seq].sum() == padded[side + "loss_mask"][i].sum()
    with pytest.raises(DataError, match="more than num_rows"):
        pack_preferences(items, row_len=24, num_rows=2)

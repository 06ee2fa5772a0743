"""Collation into the shared batch layout, bucketed padding, and packing == unpacking."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.data import (
    BucketMode,
    CharTokenizer,
    Padding,
    TokenizedPreference,
    TokenizedPrompt,
    TokenizedRank,
    TokenizedSequence,
    collate_kto,
    collate_preferences,
    collate_prompts,
    collate_ranks,
    collate_sequences,
    encode_completion,
    encode_prompt,
    pack_sequences,
    round_up_length,
)
from jaxrl_llm.errors import DataError
from jaxrl_llm.models import ModelConfig, default_positions, forward, init_params
from jaxrl_llm.ops import token_logprobs


@pytest.mark.parametrize(
    "n, mode, multiple, max_len, expected",
    [
        (1, "multiple", 64, None, 64),
        (64, "multiple", 64, None, 64),
        (65, "multiple", 64, None, 128),
        (65, "pow2", 64, None, 128),
        (128, "pow2", 64, None, 128),
        (5, "pow2", 64, None, 8),
        (7, "none", 64, None, 7),
        (100, "multiple", 64, 100, 100),
        (90, "multiple", 64, 100, 100),
        (120, "multiple", 64, 100, 120),
    ],
)
def test_bucket_length(n, mode, multiple, max_len, expected):
    assert round_up_length(n, mode=mode, multiple=multiple, max_len=max_len) == expected


def test_collate_sequences_hand_computed():
    items = [TokenizedSequence((5, 6), (7, 2)), TokenizedSequence((8,), (9, 10, 2))]
    b = collate_sequences(items, padding=Padding(pad_id=0, multiple=8))
    np.testing.assert_array_equal(
        b["input_ids"], [[5, 6, 7, 2, 0, 0, 0, 0], [8, 9, 10, 2, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(b["attention_mask"], [[1, 1, 1, 1, 0, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(
        b["loss_mask"], [[0, 0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0]]
    )
    assert all(v.dtype == np.int32 for v in b.values())


def test_buckets_limit_shapes():
    shapes = {
        collate_sequences(
            [TokenizedSequence((1,) * p, (2,))], padding=Padding(bucket=BucketMode.POW2)
        )["input_ids"].shape
        for p in range(1, 60)
    }
    assert shapes == {(1, 2), (1, 4), (1, 8), (1, 16), (1, 32), (1, 64)}


def test_collate_preferences_common_length():
    items = [TokenizedPreference((5,), (6, 2), (7, 7, 7, 2))]
    b = collate_preferences(items, padding=Padding(bucket="none"))
    assert b["chosen_input_ids"].shape == b["rejected_input_ids"].shape == (1, 5)
    np.testing.assert_array_equal(b["chosen_loss_mask"], [[0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(b["rejected_loss_mask"], [[0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(b["rejected_input_ids"], [[5, 7, 7, 7, 2]])


def test_collate_kto_mismatched_kl_rows():
    items = [
        TokenizedSequence((5,), (6, 2), label=True),
        TokenizedSequence((8, 8), (9, 9, 2), label=False),
        TokenizedSequence((4,), (3, 2), label=True),
    ]
    b = collate_kto(items, padding=Padding(bucket="none", pad_id=0))
    np.testing.assert_array_equal(b["label"], [1, 0, 1])
    # kl row i = prompt i + completion (i+1) mod B
    np.testing.assert_array_equal(
        b["kl_input_ids"], [[5, 9, 9, 2, 0], [8, 8, 3, 2, 0], [4, 6, 2, 0, 0]]
    )
    np.testing.assert_array_equal(
        b["kl_loss_mask"], [[0, 1, 1, 1, 0], [0, 0, 1, 1, 0], [0, 1, 1, 0, 0]]
    )
    assert b["input_ids"].shape == b["kl_input_ids"].shape


def test_collate_ranks_groups_and_scores():
    items = [
        TokenizedRank((5,), ((6, 2), (7, 2)), (1.0, -1.0)),
        TokenizedRank((8,), ((9, 2), (3, 3, 2)), (0.0, 2.0)),
    ]
    b = collate_ranks(items, padding=Padding(bucket="none"))
    np.testing.assert_array_equal(
        b["input_ids"], [[5, 6, 2, 0], [5, 7, 2, 0], [8, 9, 2, 0], [8, 3, 3, 2]]
    )
    np.testing.assert_array_equal(b["scores"], np.float32([1, -1, 0, 2]))
    with pytest.raises(DataError, match="same size"):
        collate_ranks([items[0], TokenizedRank((1,), ((2,),) * 3, (0.0,) * 3)])


def test_collate_prompts_left_padded_with_extras():
    arrays, extras = collate_prompts(
        [TokenizedPrompt((5, 6, 7), {"answer": "1"}), TokenizedPrompt((8,), {"answer": "2"})],
        padding=Padding(pad_id=0, multiple=4),
    )
    np.testing.assert_array_equal(arrays["prompt_ids"], [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(arrays["prompt_mask"], [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert extras == [{"answer": "1"}, {"answer": "2"}]


def test_pack_layout_hand_computed():
    items = [
        TokenizedSequence((5,), (6, 2)),
        TokenizedSequence((7, 7), (2,)),
        TokenizedSequence((8, 8, 8), (9, 9, 2)),
    ]
    b = pack_sequences(items, row_len=7, pad_id=0)
    # first-fit decreasing: row 0 holds example 2 (6 tokens); row 1 holds examples 0 and 1
    np.testing.assert_array_equal(b["input_ids"], [[8, 8, 8, 9, 9, 2, 0], [5, 6, 2, 7, 7, 2, 0]])
    np.testing.assert_array_equal(b["segment_ids"], [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 2, 2, 2, 0]])
    np.testing.assert_array_equal(b["positions"], [[0, 1, 2, 3, 4, 5, 0], [0, 1, 2, 0, 1, 2, 0]])
    np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 1, 0]])
    real = b["attention_mask"].astype(bool)
    model_pos = np.asarray(
        default_positions(jnp.asarray(b["attention_mask"]), jnp.asarray(b["segment_ids"]))
    )
    np.testing.assert_array_equal(model_pos[real], b["positions"][real])
    with pytest.raises(DataError, match="num_rows=1"):
        pack_sequences(items, row_len=7, num_rows=1)
    assert pack_sequences(items, row_len=7, num_rows=4)["input_ids"].shape == (4, 7)


@functools.partial(jax.jit, static_argnames="config")
def _logprobs_jit(params, ids, mask, segment_ids, positions, *, config):
    logits, _ = forward(
        params,
        ids,
        config=config,
        attention_mask=mask,
        segment_ids=segment_ids,
        positions=positions,
    )
    lp = token_logprobs(logits[:, :-1], ids[:, 1:])
    return jnp.pad(lp, ((0, 0), (1, 0)))  # lp[:, t] = log π(token t | tokens < t)


def _per_token_logprobs(params, config, batch):
    mask = batch["attention_mask"]
    # an unpacked row is a single segment (segment id 1, padding 0): same compiled function
    seg = batch.get("segment_ids", mask)
    pos = batch.get("positions", np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32))
    return np.asarray(_logprobs_jit(params, batch["input_ids"], mask, seg, pos, config=config))


def test_packing_equals_unpacked_logprobs_on_tiny_model():
    tok = CharTokenizer()
    texts = [("1+2=", "3"), ("10+20=", "30"), ("7+8=", "15"), ("99+1=", "100"), ("5+5=", "10")]
    items = [TokenizedSequence(encode_prompt(tok, p), encode_completion(tok, c)) for p, c in texts]
    config = ModelConfig.tiny(vocab_size=tok.vocab_size)
    params = init_params(config, jax.random.PRNGKey(0))
    unpacked = collate_sequences(items, padding=Padding(multiple=24))
    packed = pack_sequences(items, row_len=24, num_rows=len(items))
    assert packed["input_ids"].shape == unpacked["input_ids"].shape == (5, 24)
    assert packed["segment_ids"].max() > 1  # several examples share a row
    lp_u = _per_token_logprobs(params, config, unpacked)
    lp_p = _per_token_logprobs(params, config, packed)
    seen = 0
    for r in range(packed["input_ids"].shape[0]):
        for s in range(1, packed["segment_ids"][r].max() + 1):
            cols = np.flatnonzero(packed["segment_ids"][r] == s)
            seg_ids = packed["input_ids"][r, cols]
            i = next(
                i for i, x in enumerate(items) if x.prompt_ids + x.completion_ids == tuple(seg_ids)
            )
            n = len(cols)
            np.testing.assert_array_equal(
                packed["loss_mask"][r, cols], unpacked["loss_mask"][i, :n]
            )
            # every token after the segment's first is predicted from its own example only
            np.testing.assert_allclose(lp_p[r, cols[1:]], lp_u[i, 1:n], rtol=1e-5, atol=1e-5)
            seen += 1
    assert seen == len(items)

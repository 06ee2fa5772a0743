"""End to end: demo data files → validated, tokenised examples → collated batches."""

import functools
import json
from pathlib import Path

import pytest

from jaxrl_llm.data import (
    Format,
    Padding,
    collate_fn_for,
    describe_prompt_splits,
    make_iterator,
    prepare_dataset,
)
from jaxrl_llm.errors import ConfigError, DataError
from tests.data.conftest import write_lines

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.parametrize(
    "name, fmt, keys",
    [
        ("arith_sft", Format.SFT, {"input_ids", "attention_mask", "loss_mask"}),
        ("arith_prefs", Format.PREFERENCE, {"chosen_input_ids", "rejected_loss_mask"}),
        ("arith_kto", Format.KTO, {"label", "kl_input_ids", "kl_loss_mask"}),
        ("arith_rank", Format.PAIRWISE_RANK, {"scores", "input_ids"}),
    ],
)
def test_demo_sets_load_and_collate(smollm2_tokenizer, name, fmt, keys):
    data = prepare_dataset(DATA / name / "heldout.jsonl", fmt, smollm2_tokenizer, max_len=128)
    assert data.stats["kept"] == data.stats["total"] > 0 and data.stats["dropped"] == 0
    collate = collate_fn_for(fmt, padding=Padding(pad_id=smollm2_tokenizer.pad_token_id))
    batch = next(make_iterator(data.items, batch_size=4, seed=0, collate_fn=collate))
    assert keys <= set(batch)
    rows = 16 if fmt == Format.PAIRWISE_RANK else 4
    ids = batch.get("input_ids", batch.get("chosen_input_ids"))
    assert ids.shape == (rows, 64)


def test_demo_prompts_keep_answer(smollm2_tokenizer):
    data = prepare_dataset(
        DATA / "addition" / "heldout.jsonl", "prompt", smollm2_tokenizer, max_len=128
    )
    arrays, extras = collate_fn_for("prompt")(data.items[:3])
    assert arrays["prompt_ids"].shape == (3, 64)
    for row, mask, ex in zip(arrays["prompt_ids"], arrays["prompt_mask"], extras):
        text = smollm2_tokenizer.decode(row[mask.astype(bool)])
        a, b = (int(x) for x in text.split("What is ")[1].split("?")[0].split(" + "))
        assert int(ex["answer"]) == a + b


def test_prepare_with_length_policy_and_packing(char_tokenizer, tmp_path):
    rows = [{"prompt": "p" * n, "completion": "c" * 3} for n in (2, 5, 20, 3)]
    p = write_lines(tmp_path / "s.jsonl", [json.dumps(r) for r in rows])
    data = prepare_dataset(p, "sft", char_tokenizer, max_len=12, length_policy="drop")
    assert data.stats == {"total": 4, "kept": 3, "truncated": 0, "dropped": 1}
    # the run's data line (issue 42: words, not the stats dict)
    assert data.describe("training examples") == (
        "3 training examples (1 of 4 dropped: longer than data.max_length)"
    )
    cut = prepare_dataset(p, "sft", char_tokenizer, max_len=12, length_policy="truncate")
    assert cut.describe("held-out") == "4 held-out (1 of 4 truncated to data.max_length)"
    fits = prepare_dataset(p, "sft", char_tokenizer, max_len=64)
    assert fits.describe("training examples") == "4 training examples"
    with pytest.raises(DataError, match=r"s\.jsonl line 3: 25 tokens exceed max_len=12"):
        prepare_dataset(p, "sft", char_tokenizer, max_len=12)
    pack = collate_fn_for("sft", padding=Padding(max_len=16), pack_rows=2)
    batch = pack(data.items)
    assert batch["input_ids"].shape == (2, 16)
    assert int(batch["attention_mask"].sum()) == sum(
        len(x.prompt_ids) + len(x.completion_ids) for x in data.items
    )
    with pytest.raises(ConfigError, match="sft and preference formats"):
        collate_fn_for("kto", padding=Padding(max_len=16), pack_rows=2)


def test_the_online_data_line_says_what_was_kept_and_dropped(char_tokenizer, tmp_path):
    """An online run's ``data:`` line (issue 42): the prompts kept per split, then how many
    were dropped and why, "none" included; truncated prompts are counted as cut."""
    # char tokenizer: a prompt of n characters is n + 1 tokens (BOS); 8 fit 8 tokens, 2 do not
    train = write_lines(
        tmp_path / "train.jsonl",
        [json.dumps({"prompt": "p" * n, "answer": "1"}) for n in [3] * 8 + [20, 30]],
    )
    held = write_lines(
        tmp_path / "held.jsonl", [json.dumps({"prompt": "q" * n}) for n in (2, 4, 40)]
    )

    def splits(max_len, policy, with_held_out=True):
        read = functools.partial(
            prepare_dataset,
            fmt="prompt",
            tokenizer=char_tokenizer,
            max_len=max_len,
            length_policy=policy,
        )
        return read(train), read(held) if with_held_out else None

    assert describe_prompt_splits(*splits(64, "error")) == (
        "10 training prompts, 3 held-out; none dropped (every prompt within "
        "data.max_length=64 tokens)"
    )
    assert describe_prompt_splits(*splits(8, "drop")) == (
        "8 training prompts, 2 held-out; dropped 2 of 10 training and 1 of 3 held-out "
        "prompts: longer than data.max_length=8 tokens (data.length_policy: drop)"
    )
    assert describe_prompt_splits(*splits(8, "truncate", with_held_out=False)) == (
        "10 training prompts; none dropped; 2 of 10 training prompts cut from the left to "
        "data.max_length=8 tokens (data.length_policy: truncate)"
    )
    # jaxrl-llm eval: the held-out prompts alone
    assert describe_prompt_splits(None, splits(8, "drop")[1]) == (
        "2 held-out prompts; dropped 1 of 3 held-out prompts: longer than data.max_length=8 "
        "tokens (data.length_policy: drop)"
    )
    # only the held-out split changed: the training split is not named among the changes
    assert describe_prompt_splits(*splits(32, "truncate")) == (
        "10 training prompts, 3 held-out; none dropped; 1 of 3 held-out prompts cut from the "
        "left to data.max_length=32 tokens (data.length_policy: truncate)"
    )

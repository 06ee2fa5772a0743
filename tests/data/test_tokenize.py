"""Tokenisation (plain and chat template), BOS/EOS handling and the length policy."""

import numpy as np
import pytest

from jaxrl_llm.data import (
    Format,
    LengthPolicy,
    Padding,
    Record,
    TokenizedPreference,
    TokenizedRank,
    TokenizedSequence,
    apply_length_policy,
    collate_sequences,
    encode_completion,
    encode_prompt,
    parse_example,
    tokenize_example,
    truncate,
)
from jaxrl_llm.errors import DataError


def ids(text):  # CharTokenizer ids of text without specials
    return tuple(b + 3 for b in text.encode())


def test_char_plain_text_bos_and_eos(char_tokenizer):
    assert encode_prompt(char_tokenizer, "ab") == (1, 100, 101)  # BOS, 'a'+3, 'b'+3
    assert encode_completion(char_tokenizer, "c") == (102, 2)  # 'c'+3, EOS
    assert encode_completion(char_tokenizer, "c", add_eos=False) == (102,)


def test_char_chat_template(char_tokenizer):
    msgs = ({"role": "user", "content": "hi"},)
    assert encode_prompt(char_tokenizer, msgs) == ids("user: hi\nassistant: ")


def test_tokenize_example_kinds(char_tokenizer):
    t = tokenize_example(
        char_tokenizer,
        parse_example(Record({"prompt": "q", "completion": "a", "label": True}, "x"), Format.KTO),
    )
    assert t == TokenizedSequence((1,) + ids("q"), ids("a") + (2,), label=True)
    t = tokenize_example(
        char_tokenizer,
        parse_example(
            Record({"prompt": "q", "responses": ["a", "bc"], "scores": [1, 2]}, "x"),
            Format.PAIRWISE_RANK,
        ),
    )
    assert t.response_ids == (ids("a") + (2,), ids("bc") + (2,)) and t.scores == (1.0, 2.0)


def test_smollm2_chat_template_loss_mask_covers_completion_and_eos(smollm2_tokenizer):
    tok = smollm2_tokenizer
    user = [{"role": "user", "content": "What is 12 + 30? Reply with just the number."}]
    ex = parse_example(Record({"prompt": user, "completion": "42"}, "x"), Format.SFT)
    t = tokenize_example(tok, ex)
    batch = collate_sequences([t], padding=Padding(pad_id=tok.pad_token_id, multiple=16))
    row, attn, loss = (batch[k][0] for k in ("input_ids", "attention_mask", "loss_mask"))
    n = int(attn.sum())
    assert n == len(t.prompt_ids) + len(t.completion_ids) and row.shape[0] % 16 == 0
    # exactly the completion tokens followed by EOS (<|im_end|>) are targets
    targets = row[loss.astype(bool)]
    assert tok.decode(targets) == "42<|im_end|>"
    assert targets[-1] == tok.eos_token_id
    assert np.all(loss[: len(t.prompt_ids)] == 0) and np.all(loss[n:] == 0)
    # the row is the chat template's rendering of the full conversation (up to its final "\n")
    full = tok.apply_chat_template(user + [{"role": "assistant", "content": "42"}], tokenize=False)
    assert tok.decode(row[:n]) == full.rstrip("\n")
    prompt_text = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert tok.decode(t.prompt_ids) == prompt_text


def test_smollm2_plain_text_adds_no_bos(smollm2_tokenizer):
    tok = smollm2_tokenizer
    # SmolLM2's tokenizer adds no special tokens to plain text; we add nothing either.
    assert encode_prompt(tok, "Hello") == tuple(tok.encode("Hello", add_special_tokens=False))
    assert encode_completion(tok, " world")[-1] == tok.eos_token_id


def seq(p, c):
    return TokenizedSequence(tuple(range(10, 10 + p)), tuple(range(50, 50 + c)))


def test_length_policy_error_names_example():
    items = [seq(3, 2), seq(5, 4)]
    with pytest.raises(DataError, match=r"f.jsonl line 2: 9 tokens exceed max_len=6"):
        apply_length_policy(
            items, max_len=6, policy="error", locations=["f.jsonl line 1", "f.jsonl line 2"]
        )


def test_length_policy_drop_counts():
    items = [seq(3, 2), seq(5, 4), seq(1, 1)]
    kept, stats = apply_length_policy(items, max_len=6, policy=LengthPolicy.DROP)
    assert kept == [items[0], items[2]]
    assert stats == {"total": 3, "kept": 2, "truncated": 0, "dropped": 1}


def test_length_policy_truncate_prompt_left_then_completion_right():
    items = [seq(3, 2), seq(5, 4), seq(2, 9)]
    kept, stats = apply_length_policy(items, max_len=6, policy="truncate")
    assert stats == {"total": 3, "kept": 3, "truncated": 2, "dropped": 0}
    assert kept[0] == items[0]
    # prompt 10..14 cut from the left to 6 - 4 = 2 tokens; completion intact
    assert kept[1] == TokenizedSequence((13, 14), (50, 51, 52, 53))
    # completion longer than max_len: keep 1 prompt token (its last), cut completion to 5
    assert kept[2] == TokenizedSequence((11,), (50, 51, 52, 53, 54))


def test_truncate_preference_and_rank_use_longest_completion():
    t = TokenizedPreference((1, 2, 3, 4), (5, 6), (7, 8, 9))
    assert truncate(t, 5) == TokenizedPreference((3, 4), (5, 6), (7, 8, 9))
    r = TokenizedRank((1, 2, 3), ((4,), (5, 6, 7, 8)), (0.0, 1.0))
    assert truncate(r, 4) == TokenizedRank((3,), ((4,), (5, 6, 7)), (0.0, 1.0))


def test_every_example_dropped_is_an_error():
    with pytest.raises(DataError, match="every example was dropped"):
        apply_length_policy([seq(5, 5)], max_len=4, policy="drop")

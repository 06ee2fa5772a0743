"""Per-format validation: accepted shapes and one clear error per bad case."""

import json

import pytest

from jaxrl_llm.data import (
    Format,
    KTOExample,
    PreferenceExample,
    PromptExample,
    RankExample,
    Record,
    SFTExample,
    is_conversational,
    load_examples,
    parse_example,
)
from jaxrl_llm.errors import DataError
from tests.data.conftest import write_lines

USER = [{"role": "user", "content": "What is 2 + 3?"}]


def rec(**fields):
    return Record(fields, "f.jsonl line 7")


def test_sft_plain_prompt_messages_and_conversational_prompt():
    e = parse_example(rec(prompt="2 + 3 =", completion=" 5"), Format.SFT)
    assert e == SFTExample("2 + 3 =", " 5") and not is_conversational(e.prompt)
    msgs = USER + [{"role": "assistant", "content": "5"}]
    e = parse_example(rec(messages=msgs), "sft")
    assert e.prompt == tuple(USER) and e.completion == "5" and is_conversational(e.prompt)
    e = parse_example(rec(prompt=USER, completion=[{"role": "assistant", "content": "5"}]), "sft")
    assert e == SFTExample(tuple(USER), "5")


def test_preference_kto_rank_prompt():
    e = parse_example(
        rec(prompt=USER, chosen="5", rejected=[{"role": "assistant", "content": "6"}]), "preference"
    )
    assert e == PreferenceExample(tuple(USER), "5", "6")
    e = parse_example(rec(prompt="q", completion="a", label=False), Format.KTO)
    assert e == KTOExample("q", "a", False)
    e = parse_example(rec(prompt="q", responses=["a", "b"], scores=[1, 0.5]), "pairwise_rank")
    assert e == RankExample("q", ("a", "b"), (1.0, 0.5))
    e = parse_example(rec(prompt=USER, answer="5", difficulty=1), Format.PROMPT)
    assert e == PromptExample(tuple(USER), {"answer": "5", "difficulty": 1})


@pytest.mark.parametrize(
    "fmt, fields, field, words",
    [
        ("sft", {"prompt": "q"}, "completion", "missing field"),
        ("sft", {"prompt": 3, "completion": "a"}, "prompt", "got int"),
        ("sft", {"prompt": "q", "completion": "  "}, "completion", "empty text"),
        ("sft", {"messages": [{"role": "user", "content": "q"}]}, "messages", "final assistant"),
        (
            "sft",
            {"messages": [{"role": "bot", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages[0].role",
            "expected one of",
        ),
        (
            "sft",
            {"prompt": [{"role": "user", "content": ""}], "completion": "a"},
            "prompt[0].content",
            "empty text",
        ),
        ("preference", {"prompt": "q", "chosen": "a"}, "rejected", "missing field"),
        (
            "preference",
            {"prompt": "q", "chosen": "a", "rejected": [{"role": "user", "content": "b"}]},
            "rejected",
            "one assistant message",
        ),
        ("kto", {"prompt": "q", "completion": "a", "label": 1}, "label", "true or false"),
        (
            "pairwise_rank",
            {"prompt": "q", "responses": ["a", "b"], "scores": [1.0]},
            "scores",
            "must match",
        ),
        (
            "pairwise_rank",
            {"prompt": "q", "responses": ["a", "b"], "scores": [1.0, "x"]},
            "scores[1]",
            "finite number",
        ),
        (
            "pairwise_rank",
            {"prompt": "q", "responses": ["a"], "scores": [1.0]},
            "responses",
            "at least 2",
        ),
        ("prompt", {"answer": "5"}, "prompt", "missing field"),
    ],
)
def test_bad_examples_name_location_and_field(fmt, fields, field, words):
    with pytest.raises(DataError) as e:
        parse_example(rec(**fields), fmt)
    msg = str(e.value)
    assert msg.startswith("f.jsonl line 7: ")
    assert repr(field) in msg and words in msg and "\n" not in msg


def test_error_from_file_names_file_line_and_field(tmp_path):
    good = json.dumps({"prompt": "q", "completion": "a"})
    p = write_lines(
        tmp_path / "sft.jsonl", [good, good, json.dumps({"prompt": "q", "completion": 5})]
    )
    with pytest.raises(
        DataError,
        match=r"sft\.jsonl line 3: field 'completion': expected a "
        r"string",
    ):
        load_examples(p, Format.SFT)
    ok = write_lines(tmp_path / "ok.jsonl", [good, "", good])
    examples, locations = load_examples(ok, Format.SFT)
    assert examples == [SFTExample("q", "a")] * 2
    assert locations == [f"{ok} line 1", f"{ok} line 3"]


def test_sharegpt_conversations_are_read_as_messages():
    conv = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "What is 2 + 3?"},
        {"from": "gpt", "value": "5"},
    ]
    e = parse_example(rec(conversations=conv), "sft")
    assert e.prompt == ({"role": "system", "content": "Be brief."}, USER[0])
    assert e.completion == "5" and e.messages[-1] == {"role": "assistant", "content": "5"}
    bad = [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "5"}]
    with pytest.raises(DataError, match=r"messages\[0\]\.role.*'narrator'"):
        parse_example(rec(conversations=bad), "sft")


def test_an_sft_row_as_a_prompt_row_for_evaluation():
    from jaxrl_llm.data.formats import as_prompt_row

    msgs = [*USER, {"role": "assistant", "content": "5"}]
    out = as_prompt_row(rec(messages=msgs, level=1)).fields
    assert out == {"prompt": USER, "level": 1, "answer": "5"}
    assert parse_example(Record(out, "x"), Format.PROMPT).extras == {"level": 1, "answer": "5"}
    # a row's own answer column wins; prompt-completion rows too
    out = as_prompt_row(rec(prompt="2 + 3 =", completion=" 5", answer="5")).fields
    assert out == {"prompt": "2 + 3 =", "answer": "5"}
    conv = [{"from": "human", "value": "What is 2 + 3?"}, {"from": "gpt", "value": "5"}]
    assert as_prompt_row(rec(conversations=conv)).fields == {"prompt": USER, "answer": "5"}
    prompt_row = rec(prompt=USER, answer="5")
    assert as_prompt_row(prompt_row) is prompt_row
    with pytest.raises(DataError, match="f.jsonl line 7"):
        as_prompt_row(rec(messages=USER))  # no assistant turn to take as the answer


@pytest.mark.parametrize(
    "fmt, fields, words",
    [
        ("prompt", {"question": "2+2?", "answer": "4"}, "rename 'question' to 'prompt' (GSM8K's"),
        ("prompt", {"problem": "x", "solution": "y"}, "rename 'problem' to 'prompt' (MATH's"),
        (
            "sft",
            {"instruction": "Add.", "input": "2 2", "output": "4"},
            "rename 'instruction' to 'prompt' (Alpaca's (prompt = instruction + input",
        ),
        ("sft", {"prompt": "q", "response": "a"}, "rename 'response' to 'completion'"),
        (
            "prompt",
            {"conversations": [{"from": "human", "value": "hi"}]},
            "ShareGPT's shape (conversations of {from, value})",
        ),
    ],
)
def test_a_common_datasets_columns_get_the_rename(fmt, fields, words):
    with pytest.raises(DataError) as e:
        parse_example(rec(**fields), fmt)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)

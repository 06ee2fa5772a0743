"""TRL's dataset types (docs/data.md), standard and conversational, through every reader, and
``data.loss_on``: which tokens of an SFT row are trained."""

import json
import os

import pytest

from jaxrl_llm.data import (
    Format,
    KTOExample,
    LossOn,
    Padding,
    PreferenceExample,
    PromptExample,
    Record,
    SFTExample,
    StepwiseExample,
    TextExample,
    collate_sequences,
    load_examples,
    pack_sequences,
    parse_example,
    prepare_dataset,
    tokenize_example,
    truncate,
)
from jaxrl_llm.errors import ConfigError, DataError

U = [{"role": "user", "content": "What color is the sky?"}]
A_BLUE = [{"role": "assistant", "content": "It is blue."}]
A_GREEN = [{"role": "assistant", "content": "It is green."}]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "2 + 2?"},
    {"role": "assistant", "content": "4"},
]

# (TRL type, our format, row, expected example): one standard and one conversational row each,
# as docs/data.md shows them.
CASES = [
    ("language modelling", "sft", {"text": "The sky is blue."}, TextExample("The sky is blue.")),
    (
        "language modelling (conversational)",
        "sft",
        {"messages": U + A_BLUE},
        SFTExample(tuple(U), "It is blue.", tuple(U + A_BLUE)),
    ),
    ("prompt-only", "prompt", {"prompt": "The sky is"}, PromptExample("The sky is", {})),
    ("prompt-only (conversational)", "prompt", {"prompt": U}, PromptExample(tuple(U), {})),
    (
        "prompt-completion",
        "sft",
        {"prompt": "The sky is", "completion": " blue."},
        SFTExample("The sky is", " blue."),
    ),
    (
        "prompt-completion (conversational)",
        "sft",
        {"prompt": U, "completion": A_BLUE},
        SFTExample(tuple(U), "It is blue."),
    ),
    (
        "preference",
        "preference",
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
        PreferenceExample("The sky is", " blue.", " green."),
    ),
    (
        "preference (conversational)",
        "preference",
        {"prompt": U, "chosen": A_BLUE, "rejected": A_GREEN},
        PreferenceExample(tuple(U), "It is blue.", "It is green."),
    ),
    (
        "preference, implicit prompt",
        "preference",
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        PreferenceExample("The sky is", " blue.", " green."),
    ),
    (
        "preference, implicit prompt (conversational)",
        "preference",
        {"chosen": U + A_BLUE, "rejected": U + A_GREEN},
        PreferenceExample(tuple(U), "It is blue.", "It is green."),
    ),
    (
        "unpaired preference",
        "kto",
        {"prompt": "The sky is", "completion": " blue.", "label": True},
        KTOExample("The sky is", " blue.", True),
    ),
    (
        "unpaired preference (conversational)",
        "kto",
        {"prompt": U, "completion": A_GREEN, "label": False},
        KTOExample(tuple(U), "It is green.", False),
    ),
    (
        "stepwise supervision",
        "stepwise",
        {
            "prompt": "9.8 or 9.11?",
            "completions": ["0.8 > 0.11.", "So 9.8."],
            "labels": [True, True],
        },
        StepwiseExample("9.8 or 9.11?", ("0.8 > 0.11.", "So 9.8."), (True, True)),
    ),
]


@pytest.mark.parametrize("kind, fmt, row, expected", CASES, ids=[c[0] for c in CASES])
def test_each_trl_type_parses(kind, fmt, row, expected):
    assert parse_example(Record(row, "x.jsonl line 1"), fmt) == expected


def _write(tmp_path, rows, reader):
    if reader == "jsonl":
        p = tmp_path / "d.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return p
    if reader == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        p = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), p)
        return p
    datasets = pytest.importorskip("datasets")
    p = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(p))
    return p


@pytest.mark.parametrize("reader", ["jsonl", "parquet", "saved"])
@pytest.mark.parametrize(
    "kind",
    [
        "language modelling",
        "language modelling (conversational)",
        "preference, implicit prompt (conversational)",
        "unpaired preference",
        "stepwise supervision",
    ],
)
def test_each_reader_reads_each_type(tmp_path, reader, kind):
    _, fmt, row, expected = next(c for c in CASES if c[0] == kind)
    path = _write(tmp_path, [row, row], reader)
    examples, locations = load_examples(path, fmt)
    assert examples == [expected, expected] and locations[1].endswith(("line 2", "row 2"))


@pytest.mark.parametrize(
    "fmt, row, field, words",
    [
        ("preference", {"chosen": "blue", "rejected": "green"}, "chosen", "share no beginning"),
        ("preference", {"chosen": "The sky", "rejected": "The sky is"}, "chosen", "no 'prompt'"),
        (
            "preference",
            {"chosen": U + A_BLUE, "rejected": U + A_GREEN + U},
            "rejected",
            "one assistant message",
        ),
        (
            "stepwise",
            {"prompt": "q", "completions": ["a", "b"], "labels": [True]},
            "labels",
            "one true/false per step",
        ),
        (
            "stepwise",
            {"prompt": "q", "completions": ["a"], "labels": [1]},
            "labels[0]",
            "true or false",
        ),
        ("sft", {"text": " "}, "text", "empty text"),
    ],
)
def test_bad_rows_name_the_field(fmt, row, field, words):
    with pytest.raises(DataError) as e:
        parse_example(Record(row, "f.jsonl line 3"), fmt)
    msg = str(e.value)
    assert msg.startswith("f.jsonl line 3: ") and repr(field) in msg and words in msg


def test_stepwise_rows_are_prompt_only_data_for_online_algorithms():
    row = CASES[-1][2]
    assert parse_example(Record(row, "x"), "prompt") == PromptExample(
        "9.8 or 9.11?", {"completions": row["completions"], "labels": row["labels"]}
    )
    with pytest.raises(ConfigError, match="no algorithm here trains on it"):
        tokenize_example(None, parse_example(Record(row, "x"), "stepwise"))


def _trained(tok, t):
    """The decoded target tokens of one tokenised SFT row, one string per trained run."""
    b = collate_sequences([t], padding=Padding(pad_id=0, multiple=8))
    ids, mask = b["input_ids"][0], b["loss_mask"][0]
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(int(i))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r, skip_special_tokens=False) for r in runs], int(mask.sum())


def test_loss_on_with_char_tokenizer(char_tokenizer):
    tok = char_tokenizer
    ex = parse_example(Record({"messages": CHAT}, "x"), "sft")
    t = tokenize_example(tok, ex)  # default: every assistant turn
    runs, n = _trained(tok, t)
    assert runs == ["Hello", "4"] and n == len("Hello") + 1 + len("4") + 1  # each + EOS
    assert tok.decode(t.prompt_ids) == "system: Be brief.\nuser: Hi\nassistant: "
    runs, n = _trained(tok, tokenize_example(tok, ex, loss_on="completion"))
    assert runs == ["4"] and n == 2
    t_all = tokenize_example(tok, ex, loss_on=LossOn.ALL)
    _, n = _trained(tok, t_all)
    assert n == len(t_all.prompt_ids) + len(t_all.completion_ids) - 1
    # one assistant turn: every mode but `all` gives the prompt-completion row's tokens
    one = parse_example(Record({"messages": U + A_BLUE}, "x"), "sft")
    pc = parse_example(Record({"prompt": U, "completion": A_BLUE}, "x"), "sft")
    for mode in ("assistant", "completion"):
        assert tokenize_example(tok, one, loss_on=mode) == tokenize_example(tok, pc)
    # text rows: every token but the first (BOS), EOS appended
    t = tokenize_example(tok, TextExample("ab"))
    assert t.prompt_ids == (1,) and t.completion_ids == (100, 101, 2)


def test_smollm2_every_assistant_turn_and_only_those(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ex = parse_example(Record({"messages": CHAT}, "x"), "sft")
    t = tokenize_example(tok, ex)
    runs, _ = _trained(tok, t)
    assert runs == ["Hello<|im_end|>", "4<|im_end|>"]
    full = tok.apply_chat_template(CHAT, tokenize=False)
    assert tok.decode(t.prompt_ids + t.completion_ids, skip_special_tokens=False) == full.rstrip(
        "\n"
    )
    runs, _ = _trained(tok, tokenize_example(tok, ex, loss_on="completion"))
    assert runs == ["4<|im_end|>"]


def test_truncation_and_packing_keep_the_turn_mask(char_tokenizer):
    tok = char_tokenizer
    t = tokenize_example(tok, parse_example(Record({"messages": CHAT}, "x"), "sft"))
    cut = truncate(t, 20)  # the prompt is cut to 1 token, the conversation to 19
    assert cut.prompt_ids == t.prompt_ids[-1:]
    assert len(cut.completion_mask) == len(cut.completion_ids) == 19
    assert cut.completion_mask == t.completion_mask[:19]
    packed = pack_sequences([t, t], row_len=128)
    assert int(packed["loss_mask"].sum()) == 2 * sum(t.completion_mask)


def test_loss_on_reaches_the_trainer(tmp_path, capsys):
    """A one-step SFT run on multi-turn rows: the step's target count is every assistant turn
    (`assistant`, the default) or the last one (`completion`)."""
    from jaxrl_llm.cli.main import main

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(8)))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    counts = {}
    for mode in ("assistant", "completion"):
        out = tmp_path / mode
        rc = main(
            [
                "train",
                os.path.join(root, "configs", "sft.yaml"),
                f"output_dir={out}",
                "model.source=tiny",
                "model.tokenizer=char",
                f"data.train={data}",
                "data.eval=null",
                f"data.loss_on={mode}",
                "max_steps=1",
                "train.eval_every=0",
                "logging.tensorboard=false",
                "logging.plots=false",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        rows = [json.loads(x) for x in open(out / "metrics.jsonl")]
        counts[mode] = next(r["num_tokens"] for r in rows if r.get("num_tokens") is not None)
    assert counts == {"assistant": 8 * (6 + 2), "completion": 8 * 2}


def test_prepare_dataset_names_the_row_of_an_unrenderable_conversation(tmp_path):
    class Rewriting:
        """A chat template that rewrites earlier turns (as reasoning templates do)."""

        eos_token_id, eos_token, pad_token_id = 2, None, 0

        def encode(self, text, add_special_tokens=True):
            return [b + 3 for b in text.encode()]

        def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
            n = len(messages)
            text = "".join(f"{m['role']}{n}: {m['content']}\n" for m in messages)
            return text + ("assistant: " if add_generation_prompt else "")

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"messages": CHAT}) + "\n")
    with pytest.raises(DataError, match=r"c\.jsonl line 1: the chat template does not render"):
        prepare_dataset(p, Format.SFT, Rewriting(), max_len=512)


def test_a_prompt_that_tokenises_to_nothing_is_refused_with_its_line(tmp_path):
    """A tokenizer that does not know the data's text (it maps it to no ids) would give rows
    with no prompt token and a loss of 0; the row is refused instead."""

    class Empty:
        eos_token_id, eos_token, pad_token_id = 2, None, 0

        def encode(self, text, add_special_tokens=True):
            return []

    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"prompt": "w3 w4", "completion": "w5"}) + "\n")
    with pytest.raises(DataError, match=r"x\.jsonl line 1: the prompt tokenises to no tokens"):
        prepare_dataset(p, Format.SFT, Empty(), max_len=16)

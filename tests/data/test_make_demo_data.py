"""tools/make_demo_data.py: deterministic, disjoint splits, committed files up to date."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location(
        "make_demo_data", ROOT / "tools" / "make_demo_data.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pair(row):
    a, b = re.match(r"What is (\d+) \+ (\d+)\?", row["prompt"][0]["content"]).groups()
    return int(a), int(b)


def test_deterministic_per_seed(tool):
    assert tool.generate(0) == tool.generate(0)
    assert tool.generate(0)["addition"]["train"] != tool.generate(1)["addition"]["train"]


def test_splits_disjoint_across_all_sets_and_sizes(tool):
    data = tool.generate(0)
    heldout = {pair(r) for s in data.values() for r in s["heldout"]}
    train = {pair(r) for s in data.values() for r in s["train"]}
    assert not heldout & train
    assert len(data["addition"]["heldout"]) >= 200 and len(data["addition"]["train"]) >= 200
    assert len({pair(r) for r in data["addition"]["heldout"]}) == len(data["addition"]["heldout"])


def test_contents_are_correct(tool):
    data = tool.generate(0)
    for r in data["addition"]["train"][:50]:
        a, b = pair(r)
        assert r["answer"] == str(a + b) and 10 <= a <= 99 and 10 <= b <= 99
        assert r["prompt"] == [
            {"role": "user", "content": f"What is {a} + {b}? Reply with just the number."}
        ]
    for r in data["arith_prefs"]["train"][:50]:
        a, b = pair(r)
        assert r["chosen"] == str(a + b) and r["rejected"] != r["chosen"]
    for r in data["arith_kto"]["train"][:50]:
        a, b = pair(r)
        assert r["label"] == (r["completion"] == str(a + b))
    labels = [r["label"] for r in data["arith_kto"]["train"]]
    assert 0.4 < sum(labels) / len(labels) < 0.6
    for r in data["arith_rank"]["train"][:50]:
        a, b = pair(r)
        assert len(r["responses"]) == 4 and len(set(r["responses"])) == 4
        assert r["scores"] == [-abs(int(x) - (a + b)) for x in r["responses"]]
        assert max(r["scores"]) == 0


def test_committed_files_match_generator(tool):
    total = 0
    for name, splits in tool.generate(0).items():
        for split, rows in splits.items():
            path = ROOT / "data" / name / f"{split}.jsonl"
            assert path.read_text(encoding="utf-8") == tool.to_jsonl(rows), (
                f"{path} is stale; run python tools/make_demo_data.py"
            )
            total += path.stat().st_size
    assert total < 5 * 2**20

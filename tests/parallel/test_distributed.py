import jax
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import (
    batch_sharding,
    host_local_batch_to_global,
    host_local_rows,
    initialize_distributed,
    make_mesh,
)


@pytest.fixture
def no_dist_env(monkeypatch):
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)


def test_single_process_without_settings_is_a_no_op(no_dist_env):
    assert initialize_distributed() is False
    assert initialize_distributed(num_processes=1) is False
    assert jax.process_count() == 1


def test_partial_settings_raise(no_dist_env, monkeypatch):
    with pytest.raises(ConfigError, match=r"missing \['process_id'\]"):
        initialize_distributed("localhost:1234", 2)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES='two'"):
        initialize_distributed()
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ConfigError, match=r"process_id=5 must be in \[0, num_processes=2\)"):
        initialize_distributed("localhost:1234", process_id=5)


def test_host_local_batch_single_process_is_the_global_batch():
    mesh = make_mesh(data=4, fsdp=2)
    ids = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    out = host_local_batch_to_global({"input_ids": ids, "loss_denominator": np.float32(7)}, mesh)
    np.testing.assert_array_equal(np.asarray(out["input_ids"]), ids)
    assert out["input_ids"].sharding == batch_sharding(mesh)
    assert float(out["loss_denominator"]) == 7.0
    assert host_local_rows(mesh, 8) == slice(0, 8)
    with pytest.raises(ConfigError, match="not divisible by the 8 batch shards"):
        host_local_rows(mesh, 12)


def test_the_package_uses_no_private_jax_module():
    """Multi-host runs go through JAX's public API (issue 40): nothing imports ``jax._src``
    (rows used to cross hosts through the coordination service's private client)."""
    import pathlib

    import jaxrl_llm

    root = pathlib.Path(jaxrl_llm.__file__).parent
    users = [str(p) for p in root.rglob("*.py") if "jax._src" in p.read_text()]
    assert users == []


def test_one_process_data_path_is_the_identity():
    """On one process the host-local helpers change nothing (the single-host run is the
    reference the multi-process tests compare against)."""
    from jaxrl_llm.parallel import (
        gather_numbers,
        gather_packed,
        gather_strings,
        over_processes,
        rows_to_global,
    )

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert rows_to_global({"x": x})["x"] is x
    np.testing.assert_array_equal(gather_numbers(np.array([1.5, 2.0])), [[1.5, 2.0]])
    assert gather_strings("a\nb") == ["a\nb"]
    width, pair = gather_packed([np.int64(3), np.array([[1.5, 2.0]], np.float32)])
    assert width.shape == (1,) and width.dtype == np.int64 and width[0] == 3
    assert pair.shape == (1, 1, 2) and pair.dtype == np.float32
    np.testing.assert_array_equal(pair[0], [[1.5, 2.0]])
    fn = lambda v: v * 2  # noqa: E731
    assert over_processes(fn) is fn

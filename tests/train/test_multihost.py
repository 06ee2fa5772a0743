import os
import socket
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from jaxrl_llm.parallel import make_mesh
from tests.conftest import FAST_COMPILE_XLA_FLAGS
from tests.train.common import nll_train_step, ragged_batch, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_four_devices(tmp_path):
    out = str(tmp_path / "params.npz")
    address = f"127.0.0.1:{_free_port()}"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": ROOT,
        # the suite's compile flags (tests/conftest.py): the comparison below is bit-close
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {FAST_COMPILE_XLA_FLAGS}",
    }
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    child = os.path.join(ROOT, "tests", "train", "multihost_child.py")
    procs = [
        subprocess.Popen(
            [sys.executable, child, address, "2", str(i), out],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-3000:] for x in logs)

    # the same three steps in this process on a 4-device mesh of the same shape
    cfg = tiny_config()
    mesh = make_mesh(data=2, fsdp=-1, devices=jax.devices()[:4])
    state, step = nll_train_step(mesh, optax.adamw(1e-2), config=cfg, micro_batches=2)
    for i in range(3):
        state, metrics = step(state, ragged_batch(10 + i, 8, 10, cfg.vocab_size))
    got = np.load(out)
    assert int(got["step"]) == 3
    # the host-local data path (multihost_child.host_local_primitives)
    prims = np.load(out + ".prims.npz")
    whole = np.concatenate([np.arange(12).reshape(4, 3) + 100 * p for p in range(2)])
    np.testing.assert_array_equal(prims["taken"], whole[[7, 0, 5, 2, 6, 1, 4, 3]])
    np.testing.assert_allclose(prims["centred"].reshape(8, 3), whole - whole.mean())
    np.testing.assert_array_equal(prims["numbers"], [[0, 2**40], [1, 2**40 + 1]])
    assert list(prims["names"]) == ["a\nb", "c"]
    # gather_packed: an int64, a float32 pair and bools of both processes, in one collective
    np.testing.assert_array_equal(prims["packed"], [7, 8, 0.5, 0, 0.5, 1, 1, 1, 0, 1, 1])
    # rows 4 and 8: the loss weighted by rows, failures summed over the process reporting
    # them; the first merge agrees the new name (3 exchanges), the next takes one
    np.testing.assert_allclose(prims["merges"], [[20 / 12, 2, 4], [20 / 12, 2, 1]])
    assert float(got["loss"]) == pytest.approx(float(metrics["loss"]), abs=1e-5)
    ref = {
        jax.tree_util.keystr(p): np.asarray(x)
        for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))
    }
    assert set(ref) <= set(got.files)
    for k, v in ref.items():
        np.testing.assert_allclose(got[k], v, atol=1e-5, rtol=0, err_msg=k)

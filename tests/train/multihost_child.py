"""One process of the two-process test (run by test_multihost.py, not collected by pytest).

argv: coordinator_address num_processes process_id out_path. Each process has the CPU
devices XLA_FLAGS gives it; the mesh spans all processes' devices.
"""

import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")

from jaxrl_llm.parallel import initialize_distributed  # noqa: E402


def main(address: str, n: int, pid: int, out: str) -> None:
    assert initialize_distributed(address, n, pid)
    import numpy as np
    import optax
    from jax.experimental import multihost_utils

    from jaxrl_llm.parallel import host_local_batch_to_global, host_local_rows, make_mesh
    from tests.train.common import nll_train_step, ragged_batch, tiny_config

    assert jax.process_count() == n and jax.device_count() == 2 * n
    cfg = tiny_config()
    mesh = make_mesh(data=2, fsdp=-1)
    state, step = nll_train_step(mesh, optax.adamw(1e-2), config=cfg, micro_batches=2)
    for i in range(3):
        full = ragged_batch(10 + i, 8, 10, cfg.vocab_size)
        rows = host_local_rows(mesh, 8)
        batch = host_local_batch_to_global({k: v[rows] for k, v in full.items()}, mesh)
        state, metrics = step(state, batch)
    params = multihost_utils.process_allgather(state.params, tiled=True)
    prims = host_local_primitives(mesh, pid)
    if pid == 0:
        np.savez(out + ".prims.npz", **prims)
        flat = {
            jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)
        }
        np.savez(out, loss=float(metrics["loss"]), step=int(state.step), **flat)
    jax.distributed.shutdown()


def host_local_primitives(mesh, pid: int) -> dict:
    """The host-local data path's pieces, across the processes: each holds 4 rows of its own
    (process p's rows are p·100 + 0..11), the results gathered whole for the parent."""
    import numpy as np
    from jax.experimental import multihost_utils

    from jaxrl_llm.parallel import (
        check_host_blocks,
        gather_numbers,
        gather_packed,
        gather_strings,
        over_processes,
        rows_to_global,
        rows_to_local,
        take_rows,
    )

    check_host_blocks(mesh, 4)
    local = np.arange(12, dtype=np.int32).reshape(4, 3) + 100 * pid
    rows = rows_to_global({"x": local, "scale": np.float32(2)}, mesh)
    assert rows["x"].shape == (8, 3) and not rows["x"].is_fully_addressable
    assert (rows_to_local(rows)["x"] == local).all()
    index = np.array([7, 0, 5, 2, 6, 1, 4, 3])
    taken = multihost_utils.process_allgather(take_rows(rows, index, mesh)["x"], tiled=True)
    centred = over_processes(lambda x: x - x.mean())(local.astype(np.float32))
    numbers = gather_numbers(np.array([pid, 2**40 + pid], np.int64))
    names = gather_strings("a\nb" if pid == 0 else "c")
    from jaxrl_llm.parallel.host_rows import EXCHANGED
    from jaxrl_llm.train.online.experience import merge_process_metrics

    before = EXCHANGED[1]
    wide, small, flags = gather_packed(
        [np.int64(7 + pid), np.array([0.5, pid], np.float32), np.array([pid == 0, True])]
    )
    packed_calls = EXCHANGED[1] - before
    # process 1 reports a name the other does not: the names are agreed, then one exchange
    merges = []
    for _ in range(2):
        before = EXCHANGED[1]
        mine = {"loss": 1.0 + pid, **({"reward/failed": 2} if pid else {})}
        merged = merge_process_metrics(mine, 4 + 4 * pid, site="child")
        merges.append([merged["loss"], merged["reward/failed"], EXCHANGED[1] - before])
    return {
        "packed": np.array([*wide, *small.reshape(-1), *flags.reshape(-1), packed_calls]),
        "merges": np.array(merges),
        "taken": np.asarray(taken),
        "centred": np.asarray(multihost_utils.process_allgather(centred, tiled=False)),
        "numbers": numbers,
        "names": np.array(names),
    }


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

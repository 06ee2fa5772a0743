"""Weight sync of the disaggregated placement (issue 18 §3): the seconds per parameter byte of
moving the learner's weights to the rollout mesh (``rollout.devices``:
:class:`jaxrl_llm.parallel.sampler_copy.SamplerCopy`), beside an in-place copy of the same
weights on the learner's mesh (what the colocated asynchronous producer pays per update), in
one run. On 8 forced CPU devices every "device" is host memory, so both are memory copies;
the ratio shows what the resharding adds to a copy.

Full run:   python tools/bench/bench_weight_sync.py --out tools/bench/results/weight_sync.md
Smoke test: python tools/bench/bench_weight_sync.py --model tiny --repeats 1
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--rollout-devices", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from jaxrl_llm import models
    from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh, split_devices
    from jaxrl_llm.parallel.placement import plan_placement
    from jaxrl_llm.parallel.sampler_copy import SamplerCopy

    config, params, _ = common.load_model(args.model)
    learner_devs, rollout_devs = split_devices(args.rollout_devices)
    nl, nr = len(learner_devs), len(rollout_devs)
    rows, metrics, notes = [], {}, []
    nbytes = 0
    for fsdp, tensor in ((1, 1), (nl, 1), (nl, nr)):
        mesh = make_mesh(data=-1, fsdp=fsdp, devices=learner_devs)
        shard = logical_to_sharding(
            models.param_logical_axes(config), mesh, DEFAULT_RULES, shapes=params
        )
        learner = jax.block_until_ready(
            jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params), shard)
        )
        nbytes = sum(x.nbytes for x in jax.tree.leaves(learner))
        layout = plan_placement(
            {"fsdp": fsdp, "data": nl // fsdp},
            num_devices=nl + nr,
            rollout_devices=nr,
            tensor=tensor,
        ).sampler
        sampler = SamplerCopy(layout, models.param_logical_axes(config))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            placed = sampler(learner)  # first call: shardings and the program built
        fallback = sorted({str(w.message).split(":")[0] for w in caught})
        written = sum(
            sh.data.nbytes for x in jax.tree.leaves(placed) for sh in x.addressable_shards
        )
        del placed
        sync = common.best_time(lambda: sampler(learner), args.repeats)
        copy_fn = jax.jit(lambda t: jax.tree.map(jnp.copy, t))
        jax.block_until_ready(copy_fn(learner))
        copy = common.best_time(lambda: jax.block_until_ready(copy_fn(learner)), args.repeats)
        name = f"learner fsdp={fsdp} over {nl} → rollout tensor={tensor} over {nr}"
        common.log(f"{name}: sync {sync * 1e3:.1f} ms, copy {copy * 1e3:.1f} ms")
        rows.append(
            [
                name,
                f"{sync * 1e3:.1f} ms",
                f"{sync / nbytes * 1e9:.3f} ns",
                f"{written / 2**20:,.0f} MiB",
                f"{written / sync / 1e9:.2f} GB/s",
                f"{copy * 1e3:.1f} ms",
                f"{sync / copy:.2f}×",
            ]
        )
        metrics[f"sync_ns_per_byte_fsdp{fsdp}_tensor{tensor}"] = sync / nbytes * 1e9
        if fallback:
            notes.append(
                f"tensor={tensor}: {len(fallback)} weights do not split over {tensor} devices "
                f"(heads / KV heads / vocabulary not divisible) and are replicated: "
                + ", ".join(fallback)
                + "."
            )
    bw = common.memory_bandwidth(nbytes=2**28, repeats=args.repeats)
    body = [
        f"{args.model}: {nbytes / 2**20:.0f} MiB of float32 weights; 8 forced CPU devices, the "
        f"learner on {nl}, rollouts on {nr}; best of {args.repeats}. Measured memory "
        f"bandwidth of one device: {bw / 1e9:.1f} GB/s.",
        "",
        *common.markdown_table(
            [
                "placement",
                "weight sync",
                "per parameter byte",
                "bytes written (all rollout devices)",
                "write rate",
                "in-place copy (colocated)",
                "sync / copy",
            ],
            rows,
        ),
        "",
        *notes,
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Weight sync to a separate rollout mesh",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())

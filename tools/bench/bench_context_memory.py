"""Compiled per-device memory of a SmolLM2-135M-shaped SFT train step at long T, without and
with context parallelism (ring attention over ``mesh.context``; Liu et al. 2023,
https://arxiv.org/abs/2310.01889), on 8 forced CPU devices. Compiled, not run: XLA's
``memory_analysis`` of the step ``jaxrl_llm.train.make_train_step`` builds for the mesh, with
the policy's forward bound to the mesh as ``train.policy.build_policy`` binds it.

Meshes (8 devices, parameters and AdamW state replicated in each, so only activations differ):
``data=8`` (8 rows, one whole row per device), ``data=2 × context=4`` (2 rows, each split
over 4 devices: a quarter of a row per device) and ``context=8`` (1 row over 8 devices).

    python tools/bench/bench_context_memory.py --seq 8192 [--remat none]
"""

from __future__ import annotations

import argparse
import functools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxrl_llm import models as M  # noqa: E402
from jaxrl_llm.losses import LogprobSettings, get_loss  # noqa: E402
from jaxrl_llm.parallel import (  # noqa: E402
    batch_sharding,
    context_size,
    logical_to_sharding,
    make_mesh,
    under_mesh,
)
from jaxrl_llm.train.programs.state import TrainState, state_sharding_from_params  # noqa: E402
from jaxrl_llm.train.programs.step import make_train_step  # noqa: E402

GiB = 1024**3


def measure(mesh_kw: dict, rows: int, seq: int, remat: str) -> dict:
    """Compile one SFT step for ``mesh_kw`` on ``rows × seq`` tokens; XLA's byte counts."""
    config = M.ModelConfig.smollm2_135m()
    mesh = make_mesh(**mesh_kw)
    params = jax.eval_shape(lambda: M.init_params(config, jax.random.PRNGKey(0)))
    param_sharding = logical_to_sharding(M.param_logical_axes(config), mesh, shapes=params)
    optimizer = optax.adamw(1e-5)
    state_sharding = state_sharding_from_params(optimizer, params, param_sharding, mesh)
    state = TrainState(
        params=params,
        opt_state=jax.eval_shape(optimizer.init, params),
        step=jax.ShapeDtypeStruct((), jnp.int32),
        rng=jax.eval_shape(lambda: jax.random.PRNGKey(0)),
    )
    apply_fn = functools.partial(M.apply, config=config, remat=remat)
    if context_size(mesh) > 1:
        apply_fn = under_mesh(apply_fn, mesh)
    spec = get_loss("sft")
    loss_config = spec.config_cls()
    loss = functools.partial(
        spec.loss_fn, apply_fn=apply_fn, config=loss_config, logprobs=LogprobSettings()
    )
    step = make_train_step(
        loss,
        optimizer,
        mesh=mesh,
        state_sharding=state_sharding,
        batch_sharding=batch_sharding(mesh),
        denominator_fn=functools.partial(spec.denominator_fn, config=loss_config),
    )
    tok = jax.ShapeDtypeStruct((rows, seq), jnp.int32)
    batch = {"input_ids": tok, "attention_mask": tok, "loss_mask": tok}
    t0 = time.perf_counter()
    lowered = step.jitted.lower(state, batch, {}, {})
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    ring = "collective-permute" in compiled.as_text()
    return {
        "args": m.argument_size_in_bytes,
        "out": m.output_size_in_bytes,
        "temp": m.temp_size_in_bytes,
        "alias": m.alias_size_in_bytes,
        "compile_s": seconds,
        "ring": ring,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--remat", default="none", choices=["none", "dots", "full"])
    args = ap.parse_args()
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform}")
    print(
        f"SmolLM2-135M shapes, float32, SFT step (AdamW), T = {args.seq}, remat {args.remat}; "
        f"per-device bytes from XLA's memory_analysis (peak = args + out + temp - alias)"
    )
    print(
        "| mesh | rows | tokens / device | args (GiB) | temp (GiB) | peak (GiB) | ring | compile (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for mesh_kw, rows in ((dict(data=8), 8), (dict(data=2, context=4), 2), (dict(context=8), 1)):
        r = measure(mesh_kw, rows, args.seq, args.remat)
        c = mesh_kw.get("context", 1)
        per_device = rows * args.seq // 8
        peak = r["args"] + r["out"] + r["temp"] - r["alias"]
        name = " x ".join(f"{k}={v}" for k, v in mesh_kw.items())
        print(
            f"| {name} | {rows} | {per_device} (T/{c}) | {r['args'] / GiB:.2f} | "
            f"{r['temp'] / GiB:.2f} | {peak / GiB:.2f} | {'yes' if r['ring'] else 'no'} | "
            f"{r['compile_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

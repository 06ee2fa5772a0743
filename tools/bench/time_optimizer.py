"""How long the optimizer part of a train step takes on its own, at SmolLM2-135M's shapes.

Times three jitted programs over the full parameter tree (float32, one device): the AdamW update
(``optax.adamw``, params and moments donated), the same behind the NaN/Inf guard in its two
forms (a per-element ``jnp.where`` over params and moments, and the ``lax.cond`` branch that
``jaxrl_llm.train.programs.step`` uses), and the global gradient norm with clipping. Compare with the "optimizer + step overhead" row of the train-step profile
(``profile_train_step.py``): whatever that row holds beyond these is not the optimizer's
arithmetic.

    python tools/bench/time_optimizer.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm.models import ModelConfig, init_params


def _best(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    cfg = ModelConfig.smollm2_135m()
    params = jax.jit(functools.partial(init_params, cfg))(jax.random.PRNGKey(0))
    grads = jax.tree.map(lambda p: p * 1e-3, params)
    opt = optax.adamw(1e-5)

    def update(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    def guarded_where(p, s, g):
        p2, s2 = update(p, s, g)
        finite = jnp.isfinite(optax.tree.norm(g))
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        return keep(p2, p), keep(s2, s)

    def guarded_cond(p, s, g):
        finite = jnp.isfinite(optax.tree.norm(g))
        return jax.lax.cond(finite, update, lambda p, s, g: (p, s), p, s, g)

    def clip(g):
        n = optax.tree.norm(g)
        return jax.tree.map(lambda x: x * jnp.minimum(1.0, 1.0 / n), g), n

    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"{n_params / 1e6:.1f}M float32 parameters; best of {args.repeats} after a warm-up")
    for name, fn in (
        ("AdamW update", update),
        ("AdamW update + NaN/Inf guard, jnp.where", guarded_where),
        ("AdamW update + NaN/Inf guard, lax.cond (train.step)", guarded_cond),
    ):
        jitted = jax.jit(fn, donate_argnums=(0, 1))
        state = {"p": params, "s": opt.init(params)}

        def run():
            state["p"], state["s"] = jitted(state["p"], state["s"], grads)
            return state["p"]

        jax.block_until_ready(run())
        print(f"{name}: {_best(run, args.repeats):.3f} s")
        params = state["p"]
    jclip = jax.jit(clip)
    jax.block_until_ready(jclip(grads))
    print(f"global norm + clipping: {_best(lambda: jclip(grads), args.repeats):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

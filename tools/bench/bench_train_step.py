"""Benchmark: one policy-gradient train step (token-level PG loss, random advantages, AdamW,
float32) with jaxrl_llm's sharded jitted step vs transformers + torch eager on the same model.

Reports tokens/s for both and JAX's MFU against a measured jnp matmul rate
(MFU = 6 · params · tokens / step time / matmul FLOP/s). Prints a markdown table and writes
it (with the exact command and a machine description) to --out.

Full run (the lead's):  python tools/bench/bench_train_step.py --out tools/bench/results/train_step.md
Smoke test (tiny):      python tools/bench/bench_train_step.py --tiny --steps 2 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import ops
from jaxrl_llm.models import ModelConfig, apply, init_params, param_logical_axes
from jaxrl_llm.parallel import batch_sharding, make_mesh
from jaxrl_llm.train import create_train_state, make_train_step, measure_matmul_flops


def pg_loss(params, batch, *, config):
    """Token-level policy gradient: −Σ A_t log π(y_t) m_t / Σ m_t."""
    out = apply(params, batch["input_ids"], config=config, attention_mask=batch["attention_mask"])
    logp = ops.token_logprobs_from_hidden(out.hidden[:, :-1], out.unembed,
                                          batch["input_ids"][:, 1:])
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    adv = batch["advantages"][:, 1:]
    den = batch.get("loss_denominator", jnp.sum(mask))
    return -ops.masked_sum(adv * logp, mask) / den, {}


def make_batch(seed: int, b: int, t: int, vocab: int) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab, size=(b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    loss = np.zeros((b, t), np.int32)
    loss[:, t // 4:] = 1  # first quarter is the prompt
    adv = rs.randn(b, t).astype(np.float32) * loss
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss, "advantages": adv}


def bench_jax(cfg, batches, steps, warmup):
    opt = optax.adamw(1e-5)
    mesh = make_mesh(data=-1)
    state, sharding = create_train_state(functools.partial(init_params, cfg), opt, mesh,
                                         param_axes=param_logical_axes(cfg),
                                         rng=jax.random.PRNGKey(0))
    step = make_train_step(functools.partial(pg_loss, config=cfg), opt, mesh=mesh,
                           state_sharding=sharding, batch_sharding=batch_sharding(mesh))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        state, m = step(state, batches[i % len(batches)])
        jax.block_until_ready(m)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(m["loss"])


def bench_torch(cfg, batches, steps, warmup, threads):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                     num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                     head_dim=cfg.head_dim, rope_theta=cfg.rope_theta,
                     rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_embeddings,
                     max_position_embeddings=cfg.max_position_embeddings)
    model = LlamaForCausalLM(hf).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for i in range(warmup + steps):
        b = {k: torch.from_numpy(v) for k, v in batches[i % len(batches)].items()}
        t0 = time.perf_counter()
        logits = model(input_ids=b["input_ids"].long(),
                       attention_mask=b["attention_mask"]).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(
            -1, b["input_ids"][:, 1:].long().unsqueeze(-1)).squeeze(-1)
        mask = b["loss_mask"][:, 1:].float()
        loss = -(b["advantages"][:, 1:] * logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(loss.detach())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    dev = jax.devices()[0]
    return (f"{len(jax.devices())} × {dev.platform} ({dev.device_kind}); host CPU: {cpu}, "
            f"{os.cpu_count()} cores; jax {jax.__version__}, python {platform.python_version()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--matmul-n", type=int, default=1024)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    if args.tiny:
        cfg = ModelConfig.tiny(vocab_size=256, hidden_size=64, intermediate_size=128,
                               num_heads=4, num_kv_heads=2, head_dim=16)
        name = "tiny random Llama"
    else:
        cfg = ModelConfig.smollm2_135m()
        name = "SmolLM2-135M (random init, same shapes)"
    batches = [make_batch(i, args.batch, args.seq, cfg.vocab_size) for i in range(2)]
    tokens = args.batch * args.seq
    n_params = cfg.num_params()
    peak = measure_matmul_flops(n=args.matmul_n)
    jt, jloss = bench_jax(cfg, batches, args.steps, args.warmup)
    mfu = 6 * n_params * tokens / jt / peak
    rows = [("jaxrl_llm (jit, sharded step)", jt, tokens / jt, f"{100 * mfu:.1f}%")]
    if not args.no_torch:
        tt, _ = bench_torch(cfg, batches, args.steps, args.warmup, args.threads)
        ttf = 6 * n_params * tokens / tt / peak
        rows.append((f"transformers + torch eager ({args.threads} threads)", tt, tokens / tt,
                     f"{100 * ttf:.1f}%"))
    lines = [
        f"## Train step: token-level PG loss, AdamW, float32 — {name}",
        "",
        f"Command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        f"Machine: {machine()}",
        f"Model: {n_params / 1e6:.1f} M params; batch {args.batch} × {args.seq} = {tokens} "
        f"tokens; median of {args.steps} steps after {args.warmup} warm-up.",
        f"Measured matmul rate ({args.matmul_n}² f32, one device): {peak / 1e9:.1f} GFLOP/s "
        f"(MFU = 6 · params · tokens / time / this rate).",
        "",
        "| implementation | step time (s) | tokens/s | MFU |",
        "|---|---|---|---|",
    ] + [f"| {n} | {t:.3f} | {tps:.0f} | {m} |" for n, t, tps, m in rows]
    if len(rows) == 2:
        lines += ["", f"Speed-up of jaxrl_llm over torch eager: {rows[1][1] / rows[0][1]:.2f}×"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: one policy-gradient train step (token-level PG loss, random advantages, AdamW,
float32) with jaxrl_llm's sharded jitted step vs transformers + torch eager on the same model.

Reports tokens/s for both and MFU against a measured jnp matmul rate on one device
(MFU = 6 · params · tokens / step time / (devices · matmul FLOP/s)). The weights are random
(same shapes as the named model): the step's cost does not depend on their values. Torch runs
on the GPU when it sees one, else on the CPU. Writes a markdown section (with the exact command
and a machine description) to --out and its headline numbers to the .json next to it.

Full run:    python tools/bench/bench_train_step.py --out tools/bench/results/train_step.md
Smoke test:  python tools/bench/bench_train_step.py --model tiny --steps 2 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import ops
from jaxrl_llm.models import apply, init_params, param_logical_axes
from jaxrl_llm.parallel import batch_sharding, make_mesh
from jaxrl_llm.train import create_train_state, make_train_step, measure_matmul_flops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def pg_loss(params, batch, *, config):
    """Token-level policy gradient: −Σ A_t log π(y_t) m_t / Σ m_t."""
    out = apply(params, batch["input_ids"], config=config, attention_mask=batch["attention_mask"])
    logp = ops.token_logprobs_from_hidden(
        out.hidden[:, :-1], out.unembed, batch["input_ids"][:, 1:]
    )
    mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
    adv = batch["advantages"][:, 1:]
    den = batch.get("loss_denominator", jnp.sum(mask))
    return -ops.masked_sum(adv * logp, mask) / den, {}


def make_batch(seed: int, b: int, t: int, vocab: int) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab, size=(b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    loss = np.zeros((b, t), np.int32)
    loss[:, t // 4 :] = 1  # first quarter is the prompt
    adv = rs.randn(b, t).astype(np.float32) * loss
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss, "advantages": adv}


def bench_jax(cfg, batches, steps, warmup):
    opt = optax.adamw(1e-5)
    mesh = make_mesh(data=-1)
    state, sharding = create_train_state(
        functools.partial(init_params, cfg),
        opt,
        mesh,
        param_axes=param_logical_axes(cfg),
        rng=jax.random.PRNGKey(0),
    )
    step = make_train_step(
        functools.partial(pg_loss, config=cfg),
        opt,
        mesh=mesh,
        state_sharding=sharding,
        batch_sharding=batch_sharding(mesh),
    )
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        state, m = step(state, batches[i % len(batches)])
        jax.block_until_ready(m)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(m["loss"])


def bench_torch(cfg, batches, steps, warmup, threads, device="cpu"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if device == "cuda":  # the matmul precision XLA uses for float32 on GPU by default
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    hf = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    model = LlamaForCausalLM(hf).float().train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        b = {k: torch.from_numpy(v).to(device) for k, v in batches[i % len(batches)].items()}
        logits = (
            model(input_ids=b["input_ids"].long(), attention_mask=b["attention_mask"])
            .logits[:, :-1]
            .float()
        )
        logp = (
            torch.log_softmax(logits, -1)
            .gather(-1, b["input_ids"][:, 1:].long().unsqueeze(-1))
            .squeeze(-1)
        )
        mask = b["loss_mask"][:, 1:].float()
        loss = -(b["advantages"][:, 1:] * logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(loss.detach())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="whose shapes to use: an alias/path, or 'tiny' (smoke test)",
    )
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    p.add_argument("--matmul-n", type=int, default=1024)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    cfg = common.model_config(args.model)
    name = f"{args.model} (random init, same shapes)"
    batches = [make_batch(i, args.batch, args.seq, cfg.vocab_size) for i in range(2)]
    tokens = args.batch * args.seq
    n_params = cfg.num_params()
    n_dev = len(jax.devices())
    sheet = common.datasheet()
    if sheet is None:  # CPU: the limit is a measured matmul
        peak = measure_matmul_flops(n=args.matmul_n) * n_dev
        peak_note = f"Measured matmul rate ({args.matmul_n}² f32, {n_dev} device(s))"
    else:  # an accelerator: its datasheet; f32 matmuls run as TF32 under XLA's default
        peak = sheet[0]["tf32"] * n_dev
        peak_note = f"Datasheet TF32 rate ({jax.devices()[0].device_kind}, {n_dev} device(s))"
    jt, jloss = bench_jax(cfg, batches, args.steps, args.warmup)
    mfu = 6 * n_params * tokens / jt / peak
    rows = [("jaxrl_llm (jit, sharded step)", jt, tokens / jt, f"{100 * mfu:.1f}%")]
    metrics = {
        "jax_step_s": jt,
        "jax_tokens_per_s": tokens / jt,
        "jax_mfu": mfu,
        "matmul_flops": peak,
    }
    torch_missing = not (common.have("torch") and common.have("transformers"))
    if not args.no_torch and torch_missing:
        common.log("torch eager not run: torch/transformers are not installed")
    if not args.no_torch and not torch_missing:
        device = common.torch_device()
        tt, _ = bench_torch(cfg, batches, args.steps, args.warmup, args.threads, device)
        ttf = 6 * n_params * tokens / tt / peak
        where = "GPU" if device == "cuda" else f"{args.threads} threads"
        rows.append((f"transformers + torch eager ({where})", tt, tokens / tt, f"{100 * ttf:.1f}%"))
        metrics.update(
            torch_step_s=tt, torch_tokens_per_s=tokens / tt, torch_mfu=ttf, speedup_vs_torch=tt / jt
        )
    body = [
        f"Model: {common.fmt_params(n_params)} params; batch {args.batch} × {args.seq} = {tokens} "
        f"tokens; median of {args.steps} steps after {args.warmup} warm-up.",
        f"{peak_note}: {peak / 1e9:.1f} GFLOP/s (MFU = 6 · params · tokens / time / this rate).",
        "",
        *common.markdown_table(
            ["implementation", "step time (s)", "tokens/s", "MFU"],
            [[n, f"{t:.3f}", f"{tps:,.0f}", m] for n, t, tps, m in rows],
            align="lrrr",
        ),
    ]
    if len(rows) == 2:
        body += ["", f"Speed-up of jaxrl_llm over torch eager: {rows[1][1] / rows[0][1]:.2f}×"]
    elif not args.no_torch:
        body += [
            "",
            "torch eager not run: torch/transformers are not installed (`pip install -e .[dev]`).",
        ]
    return common.report(
        args.out,
        __file__,
        argv,
        title=f"Train step: token-level PG loss, AdamW, float32 — {name}",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())

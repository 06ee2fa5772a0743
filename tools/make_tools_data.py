"""Generate the calculator-tool demo data in ``data/tools_mult/`` (deterministic for a seed).

Problems are 3-digit × 3-digit multiplications "a × b" (100 ≤ a, b ≤ 999), which
SmolLM2-135M-Instruct cannot do in its head. The (a, b) pairs are split once: the held-out
problems never appear in a training split.

Written files (JSONL):

- ``heldout.jsonl`` — 200 RL prompts (``prompt``: one user message, ``answer``).
- ``train.jsonl`` — RL prompts for GRPO in the ``tools`` environment.
- ``sft.jsonl`` — the SFT warm start: tool-use transcripts of other problems, two examples
  each (the ``prompt`` holds the conversation so far, the ``completion`` the assistant's next
  turn): the tool call, then — after the tool's answer — the final answer. The system
  message is exactly what the ``tools`` environment's ``reset`` writes, so the warm start
  sees the prompts GRPO will see.

Usage: ``python tools/make_tools_data.py [--out data/tools_mult] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTION = "What is {a} × {b}?"
SIZES = {"heldout": 200, "train": 2000, "sft": 96}


def tool_call(a: int, b: int) -> str:
    """The assistant's tool-call turn for ``a × b``."""
    args = {"name": "calculate", "arguments": {"expression": f"{a} * {b}"}}
    return f"<tool_call>{json.dumps(args)}</tool_call>"


def main(argv=None) -> int:
    from jaxrl_llm.envs import ToolEnv

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/tools_mult")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < sum(SIZES.values()):
        ab = (rng.randint(100, 999), rng.randint(100, 999))
        if ab not in seen:
            seen.add(ab)
            pairs.append(ab)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = ToolEnv(tools=["calculator"])
    start = 0
    for split, n in SIZES.items():
        rows = []
        for a, b in pairs[start : start + n]:
            question = QUESTION.format(a=a, b=b)
            if split != "sft":
                rows.append(
                    {"prompt": [{"role": "user", "content": question}], "answer": str(a * b)}
                )
                continue
            chat = env.reset({"prompt": question})
            call = tool_call(a, b)
            rows.append({"prompt": chat, "completion": call})
            rows.append(
                {
                    "prompt": chat
                    + [
                        {"role": "assistant", "content": call},
                        {"role": "tool", "content": str(a * b)},
                    ],
                    "completion": f"{a} × {b} = {a * b}",
                }
            )
        start += n
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{path}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

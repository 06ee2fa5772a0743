"""Generate the small demo data sets in ``data/`` (deterministic for a given seed).

All sets are built from 2-digit addition problems "a + b" (10 ≤ a, b ≤ 99). The (a, b) pairs
are split once into a held-out pool and a training pool, and every data set draws its
``heldout`` split from the first and its ``train`` split from the second, so no held-out
problem appears in any training split.

Written files (JSONL; prompts are chat messages lists with one user message):

- ``addition/{train,heldout}.jsonl`` — RL prompts: ``prompt``, ``answer`` (GRPO demo).
- ``arith_prefs/{train,heldout}.jsonl`` — ``prompt``, ``chosen`` (correct), ``rejected``
  (a wrong number): DPO / IPO / ORPO / SimPO / reward model.
- ``arith_kto/{train,heldout}.jsonl`` — ``prompt``, ``completion``, ``label`` (true iff correct).
- ``arith_rank/{train,heldout}.jsonl`` — ``prompt``, 4 ``responses``, ``scores`` =
  −|response − answer| (higher is better; the correct answer scores 0).
- ``arith_sft/{train,heldout}.jsonl`` — ``prompt``, ``completion`` (the correct answer).

Usage: ``python tools/make_demo_data.py [--out data] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PROMPT = "What is {a} + {b}? Reply with just the number."
SIZES = {  # (train, heldout) examples per data set
    "addition": (2000, 256),
    "arith_prefs": (1000, 200),
    "arith_kto": (1000, 200),
    "arith_rank": (400, 100),
    "arith_sft": (600, 200),
}
HELDOUT_POOL = 600  # (a, b) pairs reserved for held-out splits


def _prompt(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPT.format(a=a, b=b)}]


def _wrong(rng: random.Random, answer: int) -> int:
    """A plausible wrong answer: off by a small amount or by a carry (±10)."""
    while True:
        w = answer + rng.choice([-11, -10, -2, -1, 1, 2, 9, 10, 11, rng.randint(-30, 30)])
        if w != answer and w >= 0:
            return w


def _addition(a, b, rng):
    return {"prompt": _prompt(a, b), "answer": str(a + b)}


def _pref(a, b, rng):
    return {"prompt": _prompt(a, b), "chosen": str(a + b), "rejected": str(_wrong(rng, a + b))}


def _kto(a, b, rng):
    good = rng.random() < 0.5
    return {
        "prompt": _prompt(a, b),
        "completion": str(a + b if good else _wrong(rng, a + b)),
        "label": good,
    }


def _rank(a, b, rng):
    ans = a + b
    responses = [ans] + [_wrong(rng, ans) for _ in range(3)]
    while len(set(responses)) < 4:
        responses = [ans] + [_wrong(rng, ans) for _ in range(3)]
    rng.shuffle(responses)
    return {
        "prompt": _prompt(a, b),
        "responses": [str(r) for r in responses],
        "scores": [float(-abs(r - ans)) for r in responses],
    }


def _sft(a, b, rng):
    return {"prompt": _prompt(a, b), "completion": str(a + b)}


_MAKERS = {
    "addition": _addition,
    "arith_prefs": _pref,
    "arith_kto": _kto,
    "arith_rank": _rank,
    "arith_sft": _sft,
}


def generate(seed: int = 0) -> dict[str, dict[str, list[dict]]]:
    """All demo data sets as ``{name: {"train": [...], "heldout": [...]}}`` (pure, seeded)."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    rng.shuffle(pairs)
    heldout_pool, train_pool = pairs[:HELDOUT_POOL], pairs[HELDOUT_POOL:]
    out = {}
    for name, (n_train, n_heldout) in SIZES.items():
        sub = random.Random(f"{seed}-{name}")
        splits = {}
        for split, pool, n in (
            ("train", train_pool, n_train),
            ("heldout", heldout_pool, n_heldout),
        ):
            chosen = sub.sample(pool, n)
            splits[split] = [_MAKERS[name](a, b, sub) for a, b in chosen]
        out[name] = splits
    return out


def to_jsonl(rows: list[dict]) -> str:
    """One compact JSON object per line, keys in insertion order, trailing newline."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)


def write(out_dir: str | Path, seed: int = 0) -> list[Path]:
    """Write every data set under ``out_dir``; returns the written paths."""
    written = []
    for name, splits in generate(seed).items():
        for split, rows in splits.items():
            path = Path(out_dir) / name / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(to_jsonl(rows), encoding="utf-8")
            written.append(path)
    return written


def main(argv=None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write(args.out, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

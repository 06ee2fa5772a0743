"""``jaxrl-llm eval MODEL``: score a model on held-out prompts with a run's rewards, no training
config needed.

MODEL is anything ``generate`` takes (a run directory, a checkpoint directory, a Hugging Face
directory, a PEFT adapter, a GGUF file, an alias or a hub id). A run or checkpoint directory
lends its run's ``config.yaml``: the rewards, the held-out data (``data.eval``), the rollout's
sampling settings and the ``eval`` section; the flags override them, and a model with no run
(or an offline run, which has no rewards) names them with ``--data`` and ``--reward``.

The evaluation is the training run's own (``Rollouts.evaluate``: the greedy mean of the first
reward and ``eval/pass@k``; :func:`jaxrl_llm.train.online.voting_eval.vote_eval`: ``eval/maj@k`` and the
per-sample file), so a number here is the number a run logs for the same weights. It prints a
table and writes ``OUT/eval.json`` (and ``OUT/samples-<step>.jsonl`` with ``--num-samples``);
``OUT`` is ``--output``, by default the run's ``eval/`` folder, else ``./eval``.

Example::

    jaxrl-llm eval runs/grpo --num-samples 8 --pass-at 1 8 --maj-at 8
    jaxrl-llm eval smollm2-135m-instruct --data data/add.jsonl --reward math_answer
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from jaxrl_llm.errors import ConfigError, ModelLoadError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``jaxrl-llm eval``."""
    parser.add_argument(
        "model",
        help="run directory, checkpoint directory, Hugging Face directory, PEFT adapter, "
        ".gguf file, alias or hub id",
    )
    parser.add_argument(
        "--data",
        metavar="FILE",
        help="held-out prompts (.jsonl / .parquet, TRL's prompt format: a 'prompt' column and "
        "the columns the rewards read, e.g. 'answer'; an SFT row's last assistant turn is its "
        "'answer'); default: the run's data.eval",
    )
    parser.add_argument(
        "--reward",
        action="append",
        metavar="NAME",
        help="a reward by its config name (math_answer, ...) or module:function; repeat for "
        "several (the first is the metric); default: the run's rewards",
    )
    parser.add_argument("--num-examples", type=int, metavar="N", help="held-out prompts used")
    parser.add_argument(
        "--num-samples",
        type=int,
        metavar="N",
        help="sampled completions per prompt besides the greedy one (for pass@k / maj@k)",
    )
    parser.add_argument("--pass-at", type=int, nargs="+", metavar="K", help="k of pass@k")
    parser.add_argument("--maj-at", type=int, nargs="+", metavar="K", help="k of maj@k")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens per completion")
    parser.add_argument("--max-length", type=int, metavar="N", help="longest prompt in tokens")
    parser.add_argument("--temperature", type=float, help="sampling temperature of the samples")
    parser.add_argument("--batch-size", type=int, metavar="N", help="prompts per generation call")
    parser.add_argument("--seed", type=int, help="the sampling seed (default: the run's, or 0)")
    parser.add_argument(
        "--output", metavar="DIR", help="where eval.json goes (default: RUN/eval, else ./eval)"
    )


def eval_config(args: argparse.Namespace, run_cfg: Any | None):
    """The :class:`~jaxrl_llm.train.config.run_config.RunConfig` an evaluation runs under:
    the run's rewards, data, rollout, env, eval section and seed (``run_cfg``, None for a
    model with no run), the flags over them; validated as a training config is.

    Raises:
      ConfigError: no held-out data or reward, or a value the config refuses (one line).
    """
    from jaxrl_llm.train.config.config_io import from_dict, to_dict
    from jaxrl_llm.train.config.run_config import RunConfig

    base = to_dict(run_cfg) if run_cfg is not None else {}
    data = dict(base.get("data") or {})
    data_file = args.data or data.get("eval")
    if not data_file:
        raise ConfigError(
            "--data: no held-out prompts: name a .jsonl / .parquet file of prompt rows"
            + (" (the run has no data.eval)" if run_cfg is not None else "")
        )
    if not isinstance(data_file, str) or not os.path.exists(data_file):
        raise ConfigError(f"--data: no such data file {data_file!r}")
    data.update(train=data_file, eval=data_file)
    rewards = [{"name": n} for n in args.reward] if args.reward else list(base.get("rewards") or [])
    online = run_cfg is not None and run_cfg.is_online
    env = base.get("env") if online else None
    if not rewards and env is None:
        raise ConfigError(
            "--reward: no reward to score with"
            + (
                f" (the run is {run_cfg.algorithm}, which trains without rewards)"
                if run_cfg is not None
                else ""
            )
            + "; name one, e.g. --reward math_answer or --reward my_module:my_reward"
        )
    rollout = dict(base.get("rollout") or {}) if online else {}
    ev = dict(base.get("eval") or {}) if online else {}
    ev["every"] = 0
    for flag, section, key in (
        ("num_examples", ev, "num_examples"),
        ("num_samples", ev, "num_samples"),
        ("pass_at", ev, "pass_at"),
        ("maj_at", ev, "maj_at"),
        ("batch_size", ev, "batch_size"),
        ("max_new_tokens", rollout, "max_new_tokens"),
        ("temperature", rollout, "temperature"),
        ("max_length", data, "max_length"),
    ):
        value = getattr(args, flag)
        if value is not None:
            section[key] = value
    ev["write_samples"] = bool(ev.get("num_samples"))
    model = dict(base.get("model") or {})
    merged = {
        "algorithm": "grpo",  # the sampling side only: no algorithm's own requirements
        "output_dir": args.output or ".",
        "max_steps": 1,
        "seed": args.seed if args.seed is not None else base.get("seed", 0),
        "model": {"source": args.model, "tokenizer": model.get("tokenizer", "auto")},
        "data": data,
        "rollout": rollout,
        "eval": ev,
        "rewards": rewards,
        "env": env,
    }
    try:
        return from_dict(RunConfig, {k: v for k, v in merged.items() if v is not None})
    except ConfigError as e:
        raise ConfigError(f"{_as_flag(str(e))}") from None


def _as_flag(message: str) -> str:
    """A config error about a key a flag sets, worded with the flag."""
    for key, flag in (
        ("eval.num_samples", "--num-samples"),
        ("eval.num_examples", "--num-examples"),
        ("eval.pass_at", "--pass-at"),
        ("eval.maj_at", "--maj-at"),
        ("eval.batch_size", "--batch-size"),
        ("rollout.max_new_tokens", "--max-new-tokens"),
        ("rollout.temperature", "--temperature"),
        ("data.max_length", "--max-length"),
    ):
        message = message.replace(key, flag)
    return message


def _output_dir(args: argparse.Namespace, source: Any) -> str:
    """``--output``, else the run's ``eval/`` folder, else ``./eval``."""
    if args.output:
        return str(args.output)
    if source.run_dir is not None:
        return os.path.join(str(source.run_dir), "eval")
    return "eval"


def _run_config(source: Any):
    """The run's config of a run or checkpoint directory, None for any other model."""
    from jaxrl_llm.cli.sources import RUN_CONFIG
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig

    if source.run_dir is None or not (source.run_dir / RUN_CONFIG).is_file():
        return None
    return load_config(RunConfig, str(source.run_dir / RUN_CONFIG))


def _reward_context(tok: Any, max_new_tokens: int):
    """The reward factories' :class:`~jaxrl_llm.rewards.RewardContext`: the model's tokenizer
    (``text -> ids``, no special tokens) and a loader of reward models with a scalar head."""
    from jaxrl_llm.rewards import RewardContext

    def encode(text: str):
        try:
            return tok.encode(text, add_special_tokens=False)
        except TypeError:  # a tokenizer without that option (the char test tokenizer)
            return tok.encode(text)

    def load_reward_model(path: str):
        from jaxrl_llm.interop import load_model

        loaded = load_model(path)
        if not loaded.config.num_labels:
            raise ConfigError(f"reward_model path {path!r} has no scalar head (num_labels=0)")
        rt = loaded.tokenizer
        enc = None if rt is None else (lambda s: rt.encode(s, add_special_tokens=False))
        return loaded.params, loaded.config, enc

    return RewardContext(
        tokenizer=encode, max_new_tokens=max_new_tokens, load_reward_model=load_reward_model
    )


def evaluate(args: argparse.Namespace) -> dict:
    """Load the model, evaluate it (module docstring); returns what ``eval.json`` holds."""
    import jax

    from jaxrl_llm.cli.sources import classify_source, describe, load_any
    from jaxrl_llm.data import Format, describe_prompt_splits, prepare_dataset
    from jaxrl_llm.data.formats import as_prompt_row
    from jaxrl_llm.data.readers import read_records
    from jaxrl_llm.rewards import build_reward_set
    from jaxrl_llm.train.online.rollout import Rollouts
    from jaxrl_llm.train.online.voting_eval import vote_eval

    source = classify_source(args.model)
    run_cfg = _run_config(source)
    args.output = _output_dir(args, source)
    cfg = eval_config(args, run_cfg)  # every flag checked before the model loads
    t0 = time.perf_counter()
    config, params, tok, restored = load_any(source, prefer_export=False)
    if tok is None:
        raise ModelLoadError(f"{args.model}: the model has no tokenizer files to encode prompts")
    found = describe(source, restored)
    print(
        f"loaded {found} ({config.num_params() / 1e6:.1f}M parameters) in "
        f"{time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    r = cfg.rollout
    rewards = build_reward_set(cfg.rewards, ctx=_reward_context(tok, r.max_new_tokens))
    d = cfg.data
    # an offline run's held-out SFT rows: the last assistant turn is the answer
    rows = [as_prompt_row(x).fields for x in read_records(d.eval)]
    held_out = prepare_dataset(
        rows, Format.PROMPT, tok, max_len=d.max_length, length_policy=d.length_policy
    )
    print(f"data: {describe_prompt_splits(None, held_out)}", file=sys.stderr, flush=True)
    weights = (jax.device_put(params), 0)
    rollouts = Rollouts(
        r,
        rewards if cfg.rewards else None,
        tokenizer=tok,
        model_config=config,
        weights_fn=lambda: weights,
        seed=cfg.seed,
        env=cfg.env,
        max_prompt_len=d.max_length,
    )
    metric = cfg.rewards[0].name if cfg.rewards else "env"
    step = restored.step if restored is not None and restored.step is not None else 0
    t0 = time.perf_counter()
    metrics = rollouts.evaluate(held_out.items, cfg.eval, metric)
    metrics.update(
        vote_eval(rollouts, held_out.items, cfg.eval, metric, step=step, folder=args.output)
    )
    took = time.perf_counter() - t0
    out = {
        "model": args.model,
        "found": found,
        "step": step,
        "data": d.eval,
        "rewards": [x.name for x in cfg.rewards],
        "eval": {
            "num_samples": cfg.eval.num_samples,
            "max_new_tokens": r.max_new_tokens,
            "temperature": r.temperature,
            "seed": cfg.seed,
        },
        "metrics": metrics,
        "eval_time_s": round(took, 3),
    }
    if cfg.eval.write_samples:
        out["samples"] = os.path.join(args.output, f"samples-{step}.jsonl")
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "eval.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, default=float)
    out["path"] = path
    return out


def format_table(metrics: dict) -> str:
    """The metrics as a two-column table, one per line, in the order given."""
    width = max((len(k) for k in metrics), default=6)
    lines = [f"{'metric':<{width}}  value"]
    for key, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jaxrl-llm eval``."""
    out = evaluate(args)
    print(format_table(out["metrics"]))
    print(f"wrote {out['path']}" + (f" and {out['samples']}" if "samples" in out else ""))
    return 0

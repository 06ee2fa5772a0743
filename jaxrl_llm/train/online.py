"""The online RL loop: rollout → reward → advantage → K epochs × minibatches of updates.

One loop serves every policy-gradient algorithm in the registry (GRPO, Dr. GRPO, DAPO, GSPO,
REINFORCE, REINFORCE++, RLOO, ReMax); the algorithm is data: its loss config (from
``jaxrl_llm.losses``) names the advantage estimator, the aggregation and the KL term, and the
``rollout`` section of the run config says how completions are drawn.

Per step:
1. ``prompts_per_step`` prompts from the resumable iterator; G samples each with the jitted
   sampler (each prompt prefilled once and its KV cache shared by its G rows), recording the
   sampling policy's per-token log-probs (these are the "old" log-probs).
2. Rewards from the configured functions (failures are contained: such a sample gets zero
   advantage and is counted in the metrics). DAPO's dynamic sampling keeps drawing prompts
   until the batch is full of groups whose rewards are not all equal.
3. Advantages from the estimator (group / leave-one-out / greedy baseline / whitened
   returns), DAPO's overlong shaping and truncation masking when configured.
4. Reference log-probs from the frozen reference (the base model with LoRA) when the loss has
   a KL term, computed with the same compiled forward.
5. ``epochs`` × ``minibatches`` jitted, sharded train steps (``make_train_step``).
6. Metrics (reward per function, accuracy, lengths, KL, entropy, clip fractions, advantage
   statistics, dropped groups, rollout tokens/s, time split, the data position), held-out
   evaluation, checkpoints.

Resuming (``resume=true``) restores the train state, the data position and the run's counters
from the latest finalised checkpoint; the sampling and minibatch seeds are functions of
(seed, step), so a run killed at any moment and resumed logs the same metrics and ends with
the same parameters as one that was never interrupted (``tests/train/test_kill_resume.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import time
import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives, ops, rewards as R
from jaxrl_llm.data import Format, make_iterator
from jaxrl_llm.errors import ConfigError, TrainingError
from jaxrl_llm.losses import AdvantageEstimator, critic_values, get_loss
from jaxrl_llm.parallel import batch_sharding
from jaxrl_llm.sampling import SamplingConfig, generate
from jaxrl_llm.train.faults import fault_point
from jaxrl_llm.train.run_config import RunConfig, loss_config, loss_name, update_micro_batches
from jaxrl_llm.train.setup import (NonFiniteGuard, Policy, build_policy, check_mesh,
                                   export_policy, load_policy_model, make_checkpointer,
                                   make_logger, read_splits, restore_latest, run_extra)
from jaxrl_llm.train.step import STEP_METRICS, is_loss_share, make_train_step

# Prompt-length buckets for rollouts: ~1.5x apart, so padding wastes at most a third while a run
# compiles only a few programs.
PROMPT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def _bind(fn: Callable, **kw) -> Callable:
    """``fn`` with the config's ``kwargs`` bound. Each must be a named parameter of ``fn``:
    a reward function's ``**fields`` are the data's columns, so a misspelt option would
    otherwise vanish into them. A keyword ``fn`` does not name is a TypeError at start-up,
    not a surprise minutes into a run."""
    if not kw:
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to check (a builtin): the call will tell
        return functools.partial(fn, **kw)
    named = [n for i, (n, p) in enumerate(params.items())
             if p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and i >= 2)]
    unknown = sorted(set(kw) - set(named))
    if unknown:
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(f"{name}() got an unexpected keyword argument "
                        f"{', '.join(repr(u) for u in unknown)}; it takes: "
                        f"{', '.join(named) or 'no options'}")
    return functools.partial(fn, **kw)


def _math_answer(**kw):
    return _bind(R.math_answer_reward, **kw)


def _reward_model(*, path: str, **kw):
    """A trained reward model (HF directory / checkpoint with a scalar head) as a reward."""
    from jaxrl_llm.interop import load_model

    loaded = load_model(path)
    if not loaded.config.num_labels:
        raise ConfigError(f"reward_model path {path!r} has no scalar head (num_labels=0); "
                          f"train one with configs/reward_model.yaml")
    tok = loaded.tokenizer
    encode = None if tok is None else (lambda s: tok.encode(s, add_special_tokens=False))
    return R.make_reward_model_reward(loaded.params, loaded.config, tokenizer=encode, **kw)


# Reward functions by config name -> factory(**kwargs) -> reward function. One explicit table.
REWARD_FUNCTIONS: dict[str, Callable[..., Callable]] = {
    "math_answer": _math_answer,
    "format": R.make_format_reward,
    "length_penalty": R.make_length_penalty,
    "overlong": R.make_overlong_reward,
    "code_execution": lambda **kw: _bind(R.code_execution_reward, **kw),
    "reward_model": _reward_model,
}


def _import_reward(path: str, key: str):
    """``"package.module:function"`` -> a factory binding ``kwargs`` to that reward function."""
    import importlib

    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key}: cannot import reward {path!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(f"{key}: {path!r} is not callable")
    return lambda **kw: _bind(fn, **kw)


def build_rewards(cfg: RunConfig) -> R.RewardSet:
    """The weighted :class:`~jaxrl_llm.rewards.RewardSet` of ``cfg.rewards``.

    A name is a key of :data:`REWARD_FUNCTIONS` or ``"package.module:function"`` for a reward
    function of your own (``fn(prompts, completions, **fields) -> list[float | None]``);
    ``kwargs`` are bound to it.
    """
    specs = []
    for i, item in enumerate(cfg.rewards):
        factory = REWARD_FUNCTIONS.get(item.name)
        if factory is None and ":" in item.name:
            factory = _import_reward(item.name, f"rewards[{i}].name")
        if factory is None:
            raise ConfigError(f"rewards[{i}].name: unknown reward {item.name!r}; available: "
                              f"{', '.join(sorted(REWARD_FUNCTIONS))}")
        try:
            fn = factory(**item.kwargs)
        except TypeError as e:
            raise ConfigError(f"rewards[{i}].kwargs: {e}") from None
        specs.append(R.RewardSpec(fn, weight=item.weight, name=item.name))
    return R.RewardSet(specs)


def _estimate_advantages(estimator: AdvantageEstimator, rewards: np.ndarray, *, group_size: int,
                         scale: str, mask: np.ndarray, baseline: np.ndarray | None) -> np.ndarray:
    """Per-sequence ``[N]`` or per-token ``[N, M]`` advantages for the estimator."""
    r = jnp.asarray(rewards, jnp.float32)
    if estimator == AdvantageEstimator.GRPO:
        return np.asarray(objectives.grpo_advantages(r, group_size=group_size, scale=scale))
    if estimator == AdvantageEstimator.GRPO_NO_STD:
        return np.asarray(objectives.grpo_advantages(r, group_size=group_size, scale="none"))
    if estimator == AdvantageEstimator.RLOO:
        return np.asarray(objectives.rloo_advantages(r, group_size=group_size))
    if estimator == AdvantageEstimator.REMAX:
        return np.asarray(objectives.remax_advantages(r, jnp.asarray(baseline, jnp.float32)))
    m = jnp.asarray(mask, jnp.float32)
    if estimator == AdvantageEstimator.REINFORCE_PP:
        if group_size > 1:  # REINFORCE++ with its group baseline (mean of the group)
            return np.asarray(objectives.reinforce_pp_baseline_advantages(
                r, m, group_size=group_size))
        last = jnp.maximum(m.sum(-1).astype(jnp.int32) - 1, 0)
        token_r = jnp.zeros_like(m).at[jnp.arange(m.shape[0]), last].set(r)
        return np.asarray(objectives.reinforce_pp_advantages(token_r, m))
    if estimator == AdvantageEstimator.REWARD:
        return np.asarray(r)
    raise ConfigError(f"advantage estimator {estimator.value!r} needs a critic: use "
                      f"algorithm: ppo")


def token_step_ids(tokenizer, tokens: np.ndarray, lengths: np.ndarray, texts: list[str],
                   delimiter: str) -> tuple[np.ndarray, list[list[tuple[str, int, int]]]]:
    """``[N, M]`` index of the reasoning step each completion token belongs to (−1: none).

    Steps are the character spans of :func:`jaxrl_llm.rewards.split_steps`; token i covers the
    characters between the decoded lengths of ``tokens[:i]`` and ``tokens[:i+1]`` and belongs
    to the first step that ends after its first character (delimiter tokens join the step
    that follows them; tokens after the last step get −1).
    """
    n, m = tokens.shape
    out = np.full((n, m), -1, np.int32)
    spans = []
    for i in range(n):
        steps = R.split_steps(texts[i], delimiter=delimiter)
        spans.append(steps)
        ends = [len(tokenizer.decode(tokens[i, :j + 1].tolist(), skip_special_tokens=True))
                for j in range(int(lengths[i]))]
        start = 0
        for j, end in enumerate(ends):
            for s, (_, _, s_end) in enumerate(steps):
                if start < s_end:
                    out[i, j] = s
                    break
            start = end
    return out, spans


class RolloutBatch:
    """One step's rollouts on the host: tokens, masks, old log-probs, rewards, texts."""

    def __init__(self, rollout, texts, prompts, rewards, valid, metrics, extras,
                 per_function=None):
        self.rollout = rollout
        self.texts = texts
        self.prompts = prompts
        self.rewards = rewards
        self.valid = valid
        self.metrics = metrics
        self.extras = extras
        self.per_function = per_function  # reward name -> [N] raw scores (from sample())


def _rl_batch(rb: RolloutBatch, advantages: np.ndarray, loss_weight: np.ndarray) -> dict:
    """Training batch in the losses' layout: prompt (left-padded) + completion per row."""
    ro = rb.rollout
    p_tok, p_mask = np.asarray(ro.prompt_tokens), np.asarray(ro.prompt_mask)
    c_tok, c_mask = np.asarray(ro.tokens), np.asarray(ro.mask)
    n, p = p_tok.shape
    m = c_tok.shape[1]
    input_ids = np.concatenate([p_tok, c_tok], 1).astype(np.int32)
    attn = np.concatenate([p_mask, c_mask], 1).astype(np.int32)
    lmask = np.concatenate([np.zeros_like(p_mask), c_mask * loss_weight[:, None]], 1)
    old = np.concatenate([np.zeros((n, p), np.float32), np.asarray(ro.logprobs, np.float32)], 1)
    if advantages.ndim == 1:
        adv_c = np.repeat(advantages[:, None], m, 1)
    else:
        adv_c = advantages
    adv = np.concatenate([np.zeros((n, p), np.float32), adv_c.astype(np.float32)], 1)
    lmask = lmask.astype(np.int32)
    return {"input_ids": input_ids, "attention_mask": attn, "loss_mask": lmask,
            "old_logp": old * lmask, "advantages": adv * lmask}


class OnlineTrainer:
    """State of one online run; :meth:`run` trains it. Built from a validated RunConfig."""

    def __init__(self, cfg: RunConfig, *, policy: Policy | None = None, log_stream=None):
        self.cfg = cfg
        self.log_stream = log_stream or sys.stderr
        self.spec = get_loss(loss_name(cfg))
        self.loss_config = loss_config(cfg)
        d = cfg.data
        r = cfg.rollout
        self.online_dpo = cfg.algorithm == "online_dpo"
        # Rewards and data are built and checked before anything compiles: a bad reward
        # keyword or data line costs no model build.
        self.rewards = build_rewards(cfg)
        # The batch splits over the mesh: checked once, before any model loads.
        check_mesh(cfg, mesh=policy.mesh if policy is not None else None)
        if policy is None:
            config, params, tok = load_policy_model(cfg)
        else:
            tok = policy.tokenizer
        self.train_data, self.eval_data = read_splits(
            cfg, Format.PROMPT, tok, per_step=r.prompts_per_step,
            per_step_key="rollout.prompts_per_step", unit="prompts")
        self._say(f"data: {self.train_data.stats['kept']} training prompts"
                  + (f", {self.eval_data.stats['kept']} held-out" if self.eval_data else ""))
        self.policy = policy or build_policy(cfg, config=config, params=params, tokenizer=tok)
        p = self.policy
        self.sampling = SamplingConfig(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                       min_p=r.min_p)
        self.estimator = getattr(self.loss_config, "advantage", None)
        self.step_scorer = None
        if cfg.process_reward is not None:
            self.step_scorer = self._build_step_scorer(cfg.process_reward)
        self.needs_ref = (not self.loss_config.reference_free if self.online_dpo
                          else self.loss_config.kl_coef > 0)
        self.ref_params = None
        if self.needs_ref:
            # LoRA: the base (adapters off) is the reference. Full fine-tuning: a frozen copy.
            self.ref_params = (p.base if p.lora is not None
                               else jax.tree.map(jnp.copy, p.state.params))
        # Groups whose advantages are all zero add nothing to the update: with
        # rollout.skip_zero_advantage the step runs micro-batches of whole groups and skips
        # those (exact; see losses.policy_gradient_zero_batch).
        self.update_micro_batches = update_micro_batches(
            cfg, self.loss_config, shards=int(p.mesh.shape["data"] * p.mesh.shape["fsdp"]))
        zero_fn = (self.spec.zero_batch_fn(self.loss_config)
                   if self.update_micro_batches > 1 else None)
        if zero_fn is not None:
            self._say(f"update: {self.update_micro_batches} micro-batches of whole groups per "
                      f"minibatch; those whose advantages are all zero are skipped "
                      f"(rollout.skip_zero_advantage)")
        self.step_fn = make_train_step(
            p.loss_fn(self.spec.loss_fn, loss_config=self.loss_config), p.optimizer,
            mesh=p.mesh, state_sharding=p.state_sharding,
            batch_sharding=batch_sharding(p.mesh), micro_batches=self.update_micro_batches,
            denominator_fn=functools.partial(self.spec.denominator_fn, config=self.loss_config),
            grad_clip=cfg.optim.grad_clip, frozen_sharding=p.frozen_sharding, skip_fn=zero_fn)
        self._ref_fn = jax.jit(functools.partial(self.spec.reference_fn, apply_fn=p.apply_fn,
                                                 config=self.loss_config)) \
            if self.spec.reference_fn is not None else None
        self.critic = None
        if cfg.algorithm == "ppo":
            self._build_critic()
        self.iterator = make_iterator(self.train_data.items, batch_size=r.prompts_per_step,
                                      seed=cfg.seed, shuffle=d.shuffle)
        self.ckpt = make_checkpointer(cfg, p)
        # PPO's critic (weights + optimizer state) is checkpointed beside the policy, at the
        # same steps, so a resumed PPO run continues with the critic it had.
        self.critic_ckpt = None if self.critic is None else make_checkpointer(
            cfg, self.critic, subdir="critic_checkpoints")
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, self.ckpt)
        self.start_step = 0
        self.resumed: dict | None = None  # the extra of the checkpoint resumed from
        self.train_time = 0.0
        self.logger = None

    def _build_critic(self) -> None:
        """PPO: a value head on a copy of the policy (its own optimizer and train step), and a
        frozen reference for the KL-shaped reward."""
        cfg, p = self.cfg, self.policy
        ccfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim,
                                                                  lr=cfg.ppo.critic_lr))
        config = dataclasses.replace(p.config, num_labels=1)
        params = dict(jax.device_get(p.state.params))
        params["score_head"] = {"kernel": np.zeros((config.hidden_size, 1), np.float32)}
        self.critic = build_policy(ccfg, config=config, params=params, tokenizer=p.tokenizer)
        spec = get_loss("ppo_critic")
        ccfg_loss = spec.preset(value_clip=cfg.ppo.value_clip)
        self.critic_step = make_train_step(
            self.critic.loss_fn(spec.loss_fn, loss_config=ccfg_loss), self.critic.optimizer,
            mesh=self.critic.mesh, state_sharding=self.critic.state_sharding,
            batch_sharding=batch_sharding(self.critic.mesh), micro_batches=1,
            denominator_fn=functools.partial(spec.denominator_fn, config=ccfg_loss),
            grad_clip=cfg.optim.grad_clip)
        self._values_fn = jax.jit(functools.partial(critic_values, apply_fn=self.critic.apply_fn))
        if self.ref_params is None:
            self.ref_params = jax.tree.map(jnp.copy, p.state.params)
            self.needs_ref = True

    def _build_step_scorer(self, section):
        if section.name == "outcome_as_process":
            return R.outcome_as_process(self.rewards.specs[0].fn, delimiter=section.delimiter)
        return _import_reward(section.name, "process_reward.name")(**section.kwargs)

    def _process_advantages(self, rb: RolloutBatch) -> tuple[np.ndarray, dict]:
        """Token-level ``[N, M]`` GRPO process-supervision advantages from step scores."""
        sec, g = self.cfg.process_reward, self.cfg.rollout.group_size
        fields = {k: [e.get(k) for e in rb.extras] for k in sorted({k for e in rb.extras
                                                                    for k in e})}
        try:
            scores = R.process_rewards(self.step_scorer, rb.prompts, rb.texts,
                                       delimiter=sec.delimiter, **fields)
        except Exception as e:  # noqa: BLE001 - a failing scorer must not kill the run
            self._say(f"process reward failed for the whole batch ({type(e).__name__}: {e})")
            scores = [None] * len(rb.texts)
        scores = [None if s is None or not np.all(np.isfinite(s)) else s for s in scores]
        step_r, step_m = R.pad_step_rewards(scores)
        ro = rb.rollout
        ids, _ = token_step_ids(self.policy.tokenizer, np.asarray(ro.tokens),
                                np.asarray(ro.lengths), rb.texts, sec.delimiter)
        ids = np.where(ids < step_r.shape[1], ids, -1)
        adv = objectives.process_advantages(jnp.asarray(step_r), jnp.asarray(step_m),
                                            jnp.asarray(ids), group_size=g)
        return np.asarray(adv), {"process/steps_mean": float(step_m.sum(1).mean()),
                                 "process/failed": sum(s is None for s in scores)}

    def _ppo_advantages(self, batch: dict, scores: np.ndarray) -> dict:
        """KL-shaped token rewards → GAE with the critic's values (whitened advantages)."""
        ppo = self.cfg.ppo
        jb = {k: jnp.asarray(v) for k, v in batch.items()}
        mask = jb["loss_mask"]
        values = self._values_fn(self.critic.state.params, jb)
        token_r = objectives.kl_shaped_rewards(jnp.asarray(scores, jnp.float32), jb["old_logp"],
                                               jb["ref_logp"], mask, kl_coef=ppo.kl_coef,
                                               kind=ppo.kl_kind)
        adv, returns = objectives.gae(token_r, values, mask, gamma=ppo.gamma, lam=ppo.lam)
        if ppo.whiten_advantages:
            adv = objectives.whiten(adv, mask)
        kl = objectives.kl_penalty(jb["old_logp"], jb["ref_logp"], kind=ppo.kl_kind)
        return {"advantages": np.asarray(adv * mask), "values": np.asarray(values),
                "returns": np.asarray(returns * mask),
                "_kl": float(ops.masked_mean(kl, mask)),
                "_value_mean": float(ops.masked_mean(values, mask))}

    # ----- helpers --------------------------------------------------------------------------
    def _say(self, msg: str) -> None:
        if jax.process_index() == 0:
            print(msg, file=self.log_stream, flush=True)

    def _frozen(self) -> dict:
        return {"base": self.policy.base} if self.policy.lora is not None else {}

    def _prompt_texts(self, items) -> list[str]:
        tok = self.policy.tokenizer
        return [tok.decode(list(x.prompt_ids)) for x in items]

    def sample(self, items, *, seed: int, greedy: bool = False, num_samples: int | None = None
               ) -> RolloutBatch:
        """Generate for ``items`` and score the completions."""
        r = self.cfg.rollout
        g = r.group_size if num_samples is None else num_samples
        sampling = SamplingConfig(greedy=True) if greedy else self.sampling
        params = self.policy.full_params()
        ro = generate(params, self.policy.config, [list(x.prompt_ids) for x in items],
                      sampling=sampling, num_samples=g, seed=seed,
                      max_new_tokens=r.max_new_tokens, prompt_buckets=PROMPT_BUCKETS)
        ro = jax.tree.map(np.asarray, ro)
        tok = self.policy.tokenizer
        texts = [tok.decode(ro.tokens[i, :ro.lengths[i]].tolist(), skip_special_tokens=True)
                 for i in range(ro.tokens.shape[0])]
        prompts = [t for t in self._prompt_texts(items) for _ in range(g)]
        extras = [dict(x.extras) for x in items for _ in range(g)]
        fields: dict[str, list] = {}
        for k in sorted({k for e in extras for k in e}):
            fields[k] = [e.get(k) for e in extras]
        t0 = time.perf_counter()
        out = self.rewards(prompts, texts, **fields)
        metrics = {**out.metrics, "time/reward_s": time.perf_counter() - t0}  # inside rollout_s
        return RolloutBatch(ro, texts, prompts, np.asarray(out.rewards, np.float32),
                            np.asarray(out.valid, bool), metrics, extras, out.per_function)

    def evaluate(self) -> dict[str, float]:
        """Greedy decoding on the held-out prompts: mean of the first reward function."""
        if self.eval_data is None:
            return {}
        e = self.cfg.eval
        items = self.eval_data.items[: e.num_examples or None]
        first = self.cfg.rewards[0].name
        scores, lengths, n_valid = [], [], 0
        for i in range(0, len(items), e.batch_size):
            rb = self.sample(items[i:i + e.batch_size], seed=0, greedy=True, num_samples=1)
            vals = np.asarray(rb.per_function[first])  # scored once, by sample()
            ok = np.isfinite(vals)
            scores.extend(vals[ok].tolist())
            n_valid += int(ok.sum())
            lengths.extend(rb.rollout.lengths.tolist())
        acc = float(np.mean(scores)) if scores else float("nan")
        return {f"eval/{first}": acc, "eval/num_examples": len(items),
                "eval/valid": n_valid, "eval/completion_length": float(np.mean(lengths))}

    def _collect(self, step: int) -> tuple[RolloutBatch, dict]:
        """One step's rollouts, with DAPO dynamic sampling when configured."""
        r = self.cfg.rollout
        g = r.group_size
        want = r.prompts_per_step
        kept: list[RolloutBatch] = []
        reserve: list[RolloutBatch] = []
        dropped = rounds = crc = 0
        while True:
            items = next(self.iterator)
            for x in items:
                crc = zlib.crc32(np.asarray(x.prompt_ids, np.int32).tobytes(), crc)
            rb = self.sample(items, seed=self.cfg.seed * 1_000_003 + step * 101 + rounds)
            rounds += 1
            if not r.dynamic_sampling:
                kept.append(rb)
                break
            info = np.array(objectives.informative_groups(jnp.asarray(rb.rewards),
                                                          group_size=g))
            info &= rb.valid.reshape(-1, g).all(-1)
            dropped += int((~info).sum())
            if info.any():
                kept.append(_select_groups(rb, info, g))
            if (~info).any():
                reserve.append(_select_groups(rb, ~info, g))
            have = sum(len(k.rewards) // g for k in kept)
            if have >= want or rounds >= r.max_sampling_rounds:
                break
        have = sum(len(k.rewards) // g for k in kept)
        filled = 0
        if have < want:
            # Out of sampling rounds: top up with uninformative groups (zero advantage, so no
            # gradient) to keep the batch shape, and so the compiled step, fixed.
            filled = want - have
            kept.extend(reserve)
        rb = _concat_batches(kept, g, want) if len(kept) > 1 or r.dynamic_sampling else kept[0]
        fault_point("rollout", step)
        it = self.iterator.state()
        return rb, {"dynamic/groups_dropped": dropped, "dynamic/rounds": rounds,
                    "dynamic/groups_kept": want - filled, "dynamic/groups_filled": filled,
                    # where the run is in its data, and a fingerprint of the prompts drawn
                    # (equal across runs that drew the same prompts in the same order)
                    "data/epoch": it["epoch"] + it["position"] / self.iterator.steps_per_epoch,
                    "data/prompts_crc32": crc}

    # ----- one step -------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        """Rollout → reward → advantages → updates; returns the step's metrics."""
        cfg, r, p = self.cfg, self.cfg.rollout, self.policy
        g = r.group_size
        t0 = time.perf_counter()
        rb, dyn = self._collect(step)
        t_rollout = time.perf_counter() - t0
        if rb is None or len(rb.rewards) == 0:
            self._say(f"step {step}: no informative group after {dyn['dynamic/rounds']} "
                      f"sampling rounds; skipping the update")
            return {**dyn, "skipped": 1}
        ro = rb.rollout
        lengths = np.asarray(ro.lengths)
        truncated = np.asarray(ro.truncated, bool)
        rewards = rb.rewards.copy()
        if r.overlong_buffer:
            pen = np.asarray(objectives.overlong_penalty(
                jnp.asarray(lengths), max_len=r.max_new_tokens, buffer=r.overlong_buffer))
            rewards = rewards + r.overlong_penalty_factor * pen
        if self.online_dpo:
            t2 = time.perf_counter()
            out, times = self._online_dpo_update(rb, rewards)
            out.update(rb.metrics)
            out.update({**dyn, **times,
                        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
                        "reward/failed": int((~rb.valid).sum()),
                        "completion/length_mean": float(lengths.mean()),
                        "completion/length_max": int(lengths.max()),
                        "completion/truncated_frac": float(truncated.mean()),
                        "time/rollout_s": t_rollout, "time/update_s": time.perf_counter() - t2,
                        "time/step_s": time.perf_counter() - t0,
                        "rollout/tokens_per_s": int(lengths.sum()) / max(t_rollout, 1e-9)})
            return out
        baseline = None
        if self.estimator == AdvantageEstimator.REMAX:
            items = [it for it in self._last_items(rb, g)]
            greedy = self.sample(items, seed=0, greedy=True, num_samples=1)
            baseline = np.repeat(greedy.rewards, g)
        process_stats = {}
        if self.critic is not None:  # PPO: GAE with the critic, below, once ref_logp exists
            adv = np.zeros(len(rewards), np.float32)
        elif self.step_scorer is not None:
            adv, process_stats = self._process_advantages(rb)
        else:
            adv = _estimate_advantages(self.estimator, rewards, group_size=g,
                                       scale=r.advantage_scale, mask=np.asarray(ro.mask),
                                       baseline=baseline)
        # A failed reward gives its sample zero advantage (and it is counted in the metrics).
        invalid = ~rb.valid
        if adv.ndim == 1:
            adv = np.where(invalid, 0.0, adv)
        else:
            adv = np.where(invalid[:, None], 0.0, adv)
        weight = np.ones(len(rewards), np.int32)
        if r.mask_truncated:
            weight = (~truncated).astype(np.int32)
        batch = _rl_batch(rb, adv, weight)
        t1 = time.perf_counter()
        frozen = self._frozen()
        if self.needs_ref:
            ref = self._ref_fn(self.ref_params, {k: jnp.asarray(v) for k, v in batch.items()})
            batch["ref_logp"] = np.asarray(ref["ref_logp"])
        t_ref = time.perf_counter() - t1
        ppo_stats = {}
        if self.critic is not None:
            extra = self._ppo_advantages(batch, np.where(invalid, 0.0, rewards))
            ppo_stats = {"kl_to_ref": extra.pop("_kl"), "vf/value_mean": extra.pop("_value_mean")}
            batch.update(extra)
            adv = extra["advantages"]
            batch.pop("ref_logp")  # the KL is in the reward, not in the actor loss
        t2 = time.perf_counter()
        n = len(rewards)
        mb = n // r.minibatches
        loss_metrics: list[dict] = []
        rng = np.random.default_rng(cfg.seed * 7919 + step)
        for _ in range(r.epochs):
            # whole groups per minibatch when the loss shares prompts or groups are skipped
            order = _minibatch_order(rng, n, r.minibatches,
                                     g if self.update_micro_batches > 1 else
                                     getattr(self.loss_config, "prompt_group_size", 1))
            for j in range(r.minibatches):
                idx = order[j * mb:(j + 1) * mb]
                sub = {k: v[idx] for k, v in batch.items()}
                if self.update_micro_batches > 1:
                    sub = _skippable_layout(sub, g, self.update_micro_batches)
                actor = {k: v for k, v in sub.items() if k not in ("values", "returns")}
                p.state, m = self.step_fn(p.state, actor, frozen)
                fault_point("update", step)
                if self.critic is not None:
                    critic = {k: v for k, v in sub.items() if k not in ("old_logp", "advantages")}
                    self.critic.state, cm = self.critic_step(self.critic.state, critic, {})
                    m = {**m, **{f"critic/{k}": v for k, v in cm.items()}}
                loss_metrics.append(m)
        loss_metrics = jax.device_get(loss_metrics)
        t_update = time.perf_counter() - t2
        comp_tokens = int(lengths.sum())
        out = _mean_metrics(loss_metrics)
        out["nonfinite"] = float(max(float(m["nonfinite"]) for m in loss_metrics))
        if "computed_micro_batches" in out:  # the fraction of update micro-batches that ran
            out["update/computed_frac"] = out.pop("computed_micro_batches") \
                / self.update_micro_batches
        out.update(rb.metrics)
        out.update(ppo_stats)
        out.update(process_stats)
        flat_adv = adv if adv.ndim == 1 else adv[batch["loss_mask"].astype(bool)] \
            if adv.shape == batch["loss_mask"].shape else adv[np.asarray(ro.mask, bool)]
        out.update({
            **dyn,
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
            "reward/failed": int(invalid.sum()),
            "completion/length_mean": float(lengths.mean()),
            "completion/length_max": int(lengths.max()),
            "completion/truncated_frac": float(truncated.mean()),
            "advantage/mean": float(np.mean(flat_adv)), "advantage/std": float(np.std(flat_adv)),
            "advantage/max": float(np.max(flat_adv)), "advantage/min": float(np.min(flat_adv)),
            "time/rollout_s": t_rollout, "time/reference_s": t_ref, "time/update_s": t_update,
            "time/step_s": time.perf_counter() - t0,
            "rollout/tokens_per_s": comp_tokens / max(t_rollout, 1e-9),
        })
        return out

    def _online_dpo_update(self, rb: RolloutBatch, rewards: np.ndarray) -> tuple[dict, dict]:
        """Online / iterative DPO (Guo et al. 2024, https://arxiv.org/abs/2402.04792; Xiong et
        al. 2024): in each group the best-scored sample is "chosen" and the worst "rejected";
        groups whose samples all score the same (or failed) give no pair (masked out)."""
        g = self.cfg.rollout.group_size
        ro = rb.rollout
        n_groups = len(rewards) // g
        r = np.where(rb.valid, rewards, np.nan).reshape(n_groups, g)
        has = np.isfinite(r).sum(1) >= 2
        rr = np.where(np.isfinite(r), r, 0.0)
        best = np.argmax(np.where(np.isfinite(r), r, -np.inf), 1)
        worst = np.argmin(np.where(np.isfinite(r), r, np.inf), 1)
        has &= rr[np.arange(n_groups), best] > rr[np.arange(n_groups), worst]
        p_tok, p_mask = np.asarray(ro.prompt_tokens), np.asarray(ro.prompt_mask)
        c_tok, c_mask = np.asarray(ro.tokens), np.asarray(ro.mask)
        batch = {}
        for side, pick in (("chosen", best), ("rejected", worst)):
            rows = np.arange(n_groups) * g + pick
            ids = np.concatenate([p_tok[rows], c_tok[rows]], 1).astype(np.int32)
            attn = np.concatenate([p_mask[rows], c_mask[rows]], 1).astype(np.int32)
            lm = np.concatenate([np.zeros_like(p_mask[rows]), c_mask[rows] * has[:, None]], 1)
            batch.update({f"{side}_input_ids": ids, f"{side}_attention_mask": attn,
                          f"{side}_loss_mask": lm.astype(np.int32)})
        t1 = time.perf_counter()
        if self.needs_ref:
            ref = self._ref_fn(self.ref_params, {k: jnp.asarray(v) for k, v in batch.items()})
            batch.update({k: np.asarray(v) for k, v in ref.items()})
        t_ref = time.perf_counter() - t1
        metrics = []
        for _ in range(self.cfg.rollout.epochs):
            self.policy.state, m = self.step_fn(self.policy.state, batch, self._frozen())
            metrics.append(m)
        metrics = jax.device_get(metrics)
        out = {k: float(np.mean([float(m[k]) for m in metrics])) for k in metrics[0]}
        out["nonfinite"] = float(max(float(m["nonfinite"]) for m in metrics))
        out["dpo/pairs"] = int(has.sum())
        return out, {"time/reference_s": t_ref}

    def _last_items(self, rb: RolloutBatch, g: int):
        from jaxrl_llm.data.tokenize import TokenizedPrompt

        ro = rb.rollout
        items = []
        for i in range(0, len(rb.rewards), g):
            ids = np.asarray(ro.prompt_tokens[i])[np.asarray(ro.prompt_mask[i], bool)]
            items.append(TokenizedPrompt(prompt_ids=tuple(int(t) for t in ids),
                                         extras=rb.extras[i]))
        return items

    # ----- the run --------------------------------------------------------------------------
    def maybe_resume(self) -> None:
        """Restore the latest checkpoint (state, iterator position) when ``resume`` is set."""
        if not self.cfg.resume:
            return
        step = None
        if self.critic_ckpt is not None and self.ckpt.latest_step() is not None:
            # the newest step both writes finished (a kill can land between the two)
            both = sorted(set(self.ckpt.all_steps()) & set(self.critic_ckpt.all_steps()))
            if not both:
                raise TrainingError(
                    f"{self.cfg.output_dir}: no step has both a policy and a critic checkpoint "
                    f"(policy: {self.ckpt.all_steps()}, critic: "
                    f"{self.critic_ckpt.all_steps()}); start a fresh run or restore one")
            step = both[-1]
            restore_latest(self.critic_ckpt, self.critic, step)
        extra = restore_latest(self.ckpt, self.policy, step)
        if extra is None:
            return
        self.iterator = make_iterator(self.train_data.items,
                                      batch_size=self.cfg.rollout.prompts_per_step,
                                      seed=self.cfg.seed, shuffle=self.cfg.data.shuffle,
                                      state=extra.get("data"))
        self.start_step = int(extra.get("step", int(self.policy.state.step)))
        self._last_saved = self.start_step  # on disk already: saving it again would fail
        self.guard.restore(extra)
        self.train_time = float(extra.get("train_time_s", 0.0))
        self.resumed = extra
        self._say(f"resumed from step {self.start_step}")

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoint the state, the data position and the run's counters (see
        :func:`~jaxrl_llm.train.setup.run_extra`); a step already saved is skipped."""
        if step == getattr(self, "_last_saved", None):
            return
        self._last_saved = step
        if self.critic_ckpt is not None:  # first, so a policy step implies its critic
            self.critic_ckpt.save(step, self.critic.state, force=force, extra={"step": step})
        self.ckpt.save(step, self.policy.state, force=force,
                       extra=run_extra(step, iterator=self.iterator, logger=self.logger,
                                       guard=self.guard, train_time_s=self.train_time))
        fault_point("checkpoint", step)

    def run(self) -> dict:
        """Train for ``max_steps`` (or from a resumed step); returns the summary dict."""
        cfg = self.cfg
        os.makedirs(cfg.output_dir, exist_ok=True)
        self.maybe_resume()
        self.logger = logger = make_logger(
            cfg, progress_keys=("reward/mean", "loss", "eval/" + cfg.rewards[0].name,
                                "time/step_s"),
            stream=self.log_stream, resumed=self.resumed)
        summary: dict[str, Any] = {}
        t_start = time.perf_counter()
        if cfg.eval.before and self.eval_data is not None and self.start_step == 0:
            ev = self.evaluate()
            summary["eval_before"] = ev
            logger.log(0, ev)
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            t = time.perf_counter()
            metrics = self.train_step(step)
            self.train_time += time.perf_counter() - t
            metrics["time/train_elapsed_s"] = self.train_time
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.max_steps:
                metrics.update(self.evaluate())
            bad = metrics.get("nonfinite", 0.0)
            metrics.update(self.guard.update(step, bad))
            if step % cfg.logging.log_every == 0 or step == cfg.max_steps or bad:
                logger.log(step, metrics)
            if self.guard.consecutive:
                self.guard.check(step)
            elif cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0:
                self.save(step)
        final = cfg.max_steps
        # Saved before the final evaluation, so that a run resumed from this checkpoint
        # evaluates (and logs) it exactly once.
        self.save(final, force=True)
        if self.eval_data is not None:
            ev = self.evaluate()
            summary["eval_after"] = ev
            logger.log(final, ev, progress=False)
        self.ckpt.wait_until_finished()
        if self.critic_ckpt is not None:
            self.critic_ckpt.wait_until_finished()
        if cfg.checkpoint.export_hf:
            summary["hf_export"] = export_policy(self.policy, cfg)
        summary.update(train_time_s=self.train_time,
                       total_time_s=time.perf_counter() - t_start, steps=final)
        logger.close()
        return summary

    def close(self) -> None:
        """Release the checkpoint manager."""
        self.ckpt.close()
        if self.critic_ckpt is not None:
            self.critic_ckpt.close()


def _minibatch_order(rng: np.random.Generator, n: int, minibatches: int, group: int):
    """Row order for splitting a rollout batch into minibatches: a random permutation, of
    whole groups when the loss shares each prompt across its group (``prompt_group_size``)."""
    if minibatches <= 1:
        return np.arange(n)
    if group <= 1:
        return rng.permutation(n)
    groups = rng.permutation(n // group)
    return (groups[:, None] * group + np.arange(group)[None, :]).reshape(-1)


def _mean_metrics(per_update: list[dict]) -> dict[str, float]:
    """The step's metrics over a step's updates (minibatches × epochs). The loss's own
    metrics are averaged over the micro-batches that ran (``computed_micro_batches``), and
    left out when none ran (all groups skipped): a 0 entropy or ratio would be misread."""
    out = {}
    w = np.array([float(m.get("computed_micro_batches", 1.0)) for m in per_update])
    for k in per_update[0]:
        v = np.array([float(m[k]) for m in per_update])
        if k in STEP_METRICS or is_loss_share(k):
            out[k] = float(v.mean())
        elif w.sum() > 0:
            out[k] = float((v * w).sum() / w.sum())
    return out


def _skippable_layout(batch: dict, group: int, micro_batches: int) -> dict:
    """Reorder a minibatch of whole groups (``group`` consecutive rows each) for a train step
    with ``micro_batches`` strided micro-batches (``train.step.split_micro_batches``: micro-batch
    m holds rows m, m + M, …) so that each micro-batch holds whole groups, the groups with a
    nonzero advantage first: the micro-batches left with only zero-advantage groups are then
    skipped by the step. A permutation of rows, so the summed loss is the same."""
    n = len(batch["loss_mask"])
    adv = np.asarray(batch["advantages"]).reshape(n, -1)
    mask = np.asarray(batch["loss_mask"]).reshape(n, -1).astype(bool)
    informative = np.any((adv != 0) & mask, axis=1).reshape(-1, group).any(axis=1)
    groups = np.argsort(~informative, kind="stable")  # informative groups first
    rows = (groups[:, None] * group + np.arange(group)[None, :]).reshape(micro_batches, -1)
    order = rows.T.reshape(-1)  # batch row i*M + m = row i of micro-batch m
    return {k: v[order] for k, v in batch.items()}


def _select_groups(rb: RolloutBatch, keep_groups: np.ndarray, g: int) -> RolloutBatch:
    rows = np.repeat(keep_groups, g)
    ro = jax.tree.map(lambda x: x[rows], rb.rollout)
    pick = lambda xs: [x for x, k in zip(xs, rows) if k]
    per_function = None if rb.per_function is None else {
        k: np.asarray(v)[rows] for k, v in rb.per_function.items()}
    return RolloutBatch(ro, pick(rb.texts), pick(rb.prompts), rb.rewards[rows], rb.valid[rows],
                        rb.metrics, pick(rb.extras), per_function)


def _concat_batches(batches: list[RolloutBatch], g: int, want_groups: int) -> RolloutBatch | None:
    if not batches:
        return None
    n = want_groups * g

    def cat(xs):
        return np.concatenate(xs, 0)[:n]

    # Prompt widths can differ between rounds (bucketing): left-pad to the widest.
    width = max(b.rollout.prompt_tokens.shape[1] for b in batches)

    def widen(ro):
        pad = width - ro.prompt_tokens.shape[1]
        if not pad:
            return ro
        return ro._replace(prompt_tokens=np.pad(ro.prompt_tokens, ((0, 0), (pad, 0))),
                           prompt_mask=np.pad(ro.prompt_mask, ((0, 0), (pad, 0))))

    ros = [widen(b.rollout) for b in batches]
    ro = jax.tree.map(lambda *xs: cat(xs), *ros)
    metrics = batches[0].metrics
    per_function = None
    if all(b.per_function is not None for b in batches):
        per_function = {k: cat([np.asarray(b.per_function[k]) for b in batches])
                        for k in batches[0].per_function}
    return RolloutBatch(ro, sum((b.texts for b in batches), [])[:n],
                        sum((b.prompts for b in batches), [])[:n], cat([b.rewards for b in batches]),
                        cat([b.valid for b in batches]), metrics,
                        sum((b.extras for b in batches), [])[:n], per_function)


def train_online(cfg: RunConfig, *, log_stream=None) -> dict:
    """Run an online RL config end to end; returns the summary (eval before/after, timings)."""
    trainer = OnlineTrainer(cfg, log_stream=log_stream)
    try:
        return trainer.run()
    finally:
        trainer.close()

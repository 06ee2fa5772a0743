"""The offline trainer: data → loss → sharded train step → logging → checkpoint.

One small loop serves SFT, the reward model, the DPO family (sigmoid / IPO / hinge / robust /
cDPO), KTO, ORPO, SimPO and the group pairwise-rank loss: the algorithm is a registry entry
(``jaxrl_llm.losses.LOSSES``) and a data format, not a class.

Reference log-probs (DPO, KTO) come from the frozen reference — the base weights with LoRA, a
frozen copy of the initial weights otherwise — either computed for every batch
(``train.reference: on_the_fly``) or computed once per example and cached
(``precompute``), as users of DPO ask for.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.data import Format, Padding, collate_fn_for, make_iterator
from jaxrl_llm.losses import get_loss
from jaxrl_llm.parallel import batch_sharding
from jaxrl_llm.train.run_config import OFFLINE_FORMATS, RunConfig, loss_config
from jaxrl_llm.train.setup import (NonFiniteGuard, Policy, build_policy, check_mesh,
                                   export_policy, load_policy_model,
                                   make_checkpointer, make_logger, read_splits, restore_latest,
                                   run_extra)
from jaxrl_llm.train.step import make_train_step

# Metrics that summarise held-out quality per algorithm family (higher is better).
EVAL_KEYS = ("rewards/accuracies", "rewards/margins", "nll", "loss")


def _with_score_head(config: models.ModelConfig, params: dict, seed: int):
    """Add a zero-initialised scalar head (reward model) to a language model."""
    if config.num_labels:
        return config, params
    config = dataclasses.replace(config, num_labels=1)
    params = dict(params)
    params["score_head"] = {"kernel": jnp.zeros((config.hidden_size, 1), jnp.float32)}
    return config, params


class ReferenceCache:
    """Reference quantities per example, computed once (``precompute``) or per batch."""

    def __init__(self, ref_fn, ref_params, *, cache: bool):
        self.ref_fn = ref_fn
        self.ref_params = ref_params
        self.cache = cache
        self.store: dict[str, dict[str, float]] = {}
        self.hits = self.misses = 0

    @staticmethod
    def _row_keys(batch: dict) -> list[str]:
        ids = [k for k in sorted(batch) if k.endswith("input_ids")]
        b = batch[ids[0]].shape[0]
        out = []
        for i in range(b):
            h = hashlib.sha1()
            for k in ids:
                h.update(np.ascontiguousarray(batch[k][i]).tobytes())
            out.append(h.hexdigest())
        return out

    def __call__(self, batch: dict) -> dict:
        if not self.cache:
            ref = self.ref_fn(self.ref_params, batch)
            return {k: np.asarray(v) for k, v in ref.items()}
        keys = self._row_keys(batch)
        if all(k in self.store for k in keys):
            self.hits += len(keys)
        else:
            self.misses += len(keys)
            ref = {k: np.asarray(v) for k, v in self.ref_fn(self.ref_params, batch).items()}
            for i, key in enumerate(keys):
                self.store[key] = {k: v[i] for k, v in ref.items()}
        names = self.store[keys[0]].keys()
        return {n: np.asarray([self.store[k][n] for k in keys]) for n in names}


class OfflineTrainer:
    """State of one offline run; :meth:`run` trains it."""

    def __init__(self, cfg: RunConfig, *, log_stream=None):
        self.cfg = cfg
        self.log_stream = log_stream or sys.stderr
        self.spec = get_loss(cfg.algorithm)
        self.loss_config = loss_config(cfg)
        d, t = cfg.data, cfg.train
        check_mesh(cfg)  # before the model loads
        config, params, tok = load_policy_model(cfg)
        # The data is read and checked before anything compiles: a bad line costs no compile.
        self.format = Format(OFFLINE_FORMATS[cfg.algorithm])
        self.train_data, self.eval_data = read_splits(
            cfg, self.format, tok, per_step=t.batch_size, per_step_key="train.batch_size",
            unit="examples")
        self._say(f"data: {self.train_data.stats} (train)"
                  + (f", {self.eval_data.stats} (held-out)" if self.eval_data else ""))
        if cfg.algorithm == "reward_model":
            config, params = _with_score_head(config, params, cfg.seed)
        self.policy: Policy = build_policy(cfg, config=config, params=params, tokenizer=tok)
        p = self.policy
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.padding = Padding(pad_id=pad_id, multiple=16, max_len=d.max_length)
        pack_rows = None
        if d.packing:
            pack_rows = max(1, t.batch_size // 2)
        self.collate = collate_fn_for(self.format, padding=self.padding, pack_rows=pack_rows)
        self.eval_collate = collate_fn_for(self.format, padding=self.padding)
        self.iterator = make_iterator(self.train_data.items, batch_size=t.batch_size,
                                      collate_fn=self.collate, seed=cfg.seed, shuffle=d.shuffle)
        needs_ref = self.spec.reference_fn is not None
        self.reference = None
        if needs_ref:
            ref_params = p.base if p.lora is not None else jax.tree.map(jnp.copy, p.state.params)
            ref_fn = jax.jit(functools.partial(self.spec.reference_fn, apply_fn=p.apply_fn,
                                               config=self.loss_config))
            self.reference = ReferenceCache(ref_fn, ref_params,
                                            cache=t.reference == "precompute")
        loss = p.loss_fn(self.spec.loss_fn, loss_config=self.loss_config)
        self.step_fn = make_train_step(
            loss, p.optimizer, mesh=p.mesh, state_sharding=p.state_sharding,
            batch_sharding=batch_sharding(p.mesh), micro_batches=t.micro_batches,
            denominator_fn=functools.partial(self.spec.denominator_fn, config=self.loss_config),
            grad_clip=cfg.optim.grad_clip, frozen_sharding=p.frozen_sharding)
        self.eval_fn = jax.jit(lambda params, batch, frozen: loss(params, batch, **frozen)[1])
        self.ckpt = make_checkpointer(cfg, p)
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, self.ckpt)
        self.start_step = 0
        self.resumed: dict | None = None  # the extra of the checkpoint resumed from
        self.train_time = 0.0
        self.logger = None

    def _say(self, msg: str) -> None:
        if jax.process_index() == 0:
            print(msg, file=self.log_stream, flush=True)

    def _frozen(self) -> dict:
        return {"base": self.policy.base} if self.policy.lora is not None else {}

    def _prepare(self, batch: dict) -> dict:
        batch = {k: np.asarray(v) for k, v in batch.items()}
        if self.reference is not None:
            batch.update(self.reference(batch))
        return batch

    def evaluate(self) -> dict[str, float]:
        """Loss metrics on the held-out split (mean over its batches)."""
        if self.eval_data is None:
            return {}
        t = self.cfg.train
        items = self.eval_data.items
        bs = t.batch_size
        rows: list[dict] = []
        n_batches = len(items) // bs
        if t.eval_batches:
            n_batches = min(n_batches, t.eval_batches)
        for i in range(max(n_batches, 1)):
            chunk = items[i * bs:(i + 1) * bs]
            if len(chunk) < bs:
                break
            batch = self._prepare(self.eval_collate(chunk))
            rows.append(jax.device_get(self.eval_fn(self.policy.state.params, batch,
                                                    self._frozen())))
        if not rows:
            return {}
        return {f"eval/{k}": float(np.mean([float(r[k]) for r in rows])) for k in rows[0]}

    def maybe_resume(self) -> None:
        """Restore the latest checkpoint and the data position when ``resume`` is set."""
        extra = restore_latest(self.ckpt, self.policy) if self.cfg.resume else None
        if extra is None:
            return
        self.iterator = make_iterator(self.train_data.items, batch_size=self.cfg.train.batch_size,
                                      collate_fn=self.collate, seed=self.cfg.seed,
                                      shuffle=self.cfg.data.shuffle, state=extra.get("data"))
        self.start_step = int(extra.get("step", int(self.policy.state.step)))
        self._last_saved = self.start_step  # on disk already: saving it again would fail
        self.guard.restore(extra)
        self.train_time = float(extra.get("train_time_s", 0.0))
        self.resumed = extra
        self._say(f"resumed from step {self.start_step}")

    def run(self) -> dict:
        """Train for ``max_steps``; returns the summary dict (held-out metrics before/after)."""
        cfg = self.cfg
        os.makedirs(cfg.output_dir, exist_ok=True)
        self.maybe_resume()
        keys = ("loss", "rewards/accuracies", "eval/rewards/accuracies", "eval/loss",
                "tokens_per_s")
        self.logger = logger = make_logger(cfg, progress_keys=keys, stream=self.log_stream,
                                           resumed=self.resumed)
        summary: dict[str, Any] = {}
        if self.start_step == 0 and self.eval_data is not None:
            summary["eval_before"] = self.evaluate()
            logger.log(0, summary["eval_before"])
        t_start = time.perf_counter()
        p = self.policy
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            batch = self._prepare(next(self.iterator))
            p.state, metrics = self.step_fn(p.state, batch, self._frozen())
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            dt = time.perf_counter() - t0
            self.train_time += dt
            metrics.update({"time/step_s": dt, "tokens_per_s": metrics["tokens"] / dt,
                            "time/train_elapsed_s": self.train_time})
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 \
                    and step < cfg.max_steps:
                metrics.update(self.evaluate())
            metrics.update(self.guard.update(step, metrics["nonfinite"]))
            if step % cfg.logging.log_every == 0 or step == cfg.max_steps or metrics["nonfinite"]:
                logger.log(step, metrics)
            if self.guard.consecutive:
                self.guard.check(step)
            elif cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0:
                self.save(step)
        # Saved before the final evaluation, so that a run resumed from this checkpoint
        # evaluates (and logs) it exactly once.
        self.save(cfg.max_steps, force=True)
        if self.eval_data is not None:
            summary["eval_after"] = self.evaluate()
            logger.log(cfg.max_steps, summary["eval_after"], progress=False)
        self.ckpt.wait_until_finished()
        if cfg.checkpoint.export_hf:
            summary["hf_export"] = export_policy(self.policy, cfg)
        if self.reference is not None and self.reference.cache:
            summary["reference_cache"] = {"hits": self.reference.hits,
                                          "misses": self.reference.misses}
        summary.update(train_time_s=self.train_time, total_time_s=time.perf_counter() - t_start,
                       steps=cfg.max_steps)
        logger.close()
        return summary

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoint the state, the data position and the run's counters (see
        :func:`~jaxrl_llm.train.setup.run_extra`); a step already saved is skipped."""
        if step == getattr(self, "_last_saved", None):
            return
        self._last_saved = step
        self.ckpt.save(step, self.policy.state, force=force,
                       extra=run_extra(step, iterator=self.iterator, logger=self.logger,
                                       guard=self.guard, train_time_s=self.train_time))

    def close(self) -> None:
        """Release the checkpoint manager."""
        self.ckpt.close()


def train_offline(cfg: RunConfig, *, log_stream=None) -> dict:
    """Run an offline config end to end; returns the summary."""
    trainer = OfflineTrainer(cfg, log_stream=log_stream)
    try:
        return trainer.run()
    finally:
        trainer.close()

"""The offline trainer: data → loss → sharded train step → logging → checkpoint.

One small loop serves SFT, the reward model, the DPO family (sigmoid / IPO / hinge / robust /
cDPO), KTO, ORPO, SimPO and the group pairwise-rank loss: the algorithm is a registry entry
(``jaxrl_llm.losses.ALGORITHMS``: its loss, data format, whether it trains a reward head), not a
class. Resume, checkpoints, evaluation and logging are the shared run loop
(:class:`~jaxrl_llm.train.run.loop.RunLoop`).

Reference log-probs (DPO, KTO) come from the frozen reference — the base weights with LoRA, a
frozen copy of the initial weights otherwise — either computed for every batch
(``train.reference: on_the_fly``) or computed once per example and cached
(``precompute``), as users of DPO ask for.

Context parallelism (``mesh.context: C > 1``): batches are right-padded to a multiple of
lcm(16, C) tokens (``data.max_length`` must be a multiple of C, checked before the model
loads), and the step splits every row's tokens over the ``context`` axis, its attention going
round the ring (:mod:`jaxrl_llm.train.programs.step`). The reference forward runs the same ring
attention (the policy's ``apply_fn`` carries the mesh) on batches not split beforehand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.data import Format, Padding, collate_fn_for, make_iterator
from jaxrl_llm.parallel import context_size
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.preflight import check_mesh, read_splits
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.builder import build_programs
from jaxrl_llm.train.programs.policy import Policy, build_policy, load_policy_model
from jaxrl_llm.train.run.faults import fault_point
from jaxrl_llm.train.run.loop import RunLoop
from jaxrl_llm.train.run.progress import bar, phase
from jaxrl_llm.train.run.run_state import NonFiniteGuard, make_checkpointer
from jaxrl_llm.train.run.signals import held

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
        """The reference's entries for ``batch`` (cached by row content when precomputed)."""
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


class OfflineTrainer(RunLoop):
    """One offline run; :meth:`run` trains it."""

    progress_keys = (
        "loss",
        "rewards/accuracies",
        "eval/rewards/accuracies",
        "eval/loss",
        "tokens_per_s",
    )

    def __init__(self, cfg: RunConfig, *, log_stream=None):
        super().__init__(cfg, log_stream=log_stream)
        algo = cfg.algo
        self.plan = plan = plan_run(cfg, check_mesh(cfg))  # before the model loads
        d, t = cfg.data, cfg.train
        self.eval_every = t.eval_every
        with phase(f"model load ({cfg.model.source})"):
            config, params, tok = load_policy_model(cfg)
        # The data is read and checked before anything compiles: a bad line costs no compile.
        self.format = Format(algo.data_format)
        self.train_data, self.eval_data = read_splits(
            cfg,
            self.format,
            tok,
            per_step=t.batch_size,
            per_step_key="train.batch_size",
            unit="examples",
        )
        self.say(
            f"data: {self.train_data.describe('training examples')}"
            + (f", {self.eval_data.describe('held-out')}" if self.eval_data else "")
        )
        if algo.trains_reward_head:
            config, params = _with_score_head(config, params, cfg.seed)
        self.policy: Policy = build_policy(
            cfg, config=config, params=params, tokenizer=tok, plan=plan
        )
        p = self.policy
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        # rows split over the context axis: T a multiple of C (data.max_length is one too)
        multiple = math.lcm(16, context_size(p.mesh))
        self.padding = Padding(pad_id=pad_id, multiple=multiple, max_len=d.max_length)
        pack_rows = None  # SFT: B examples in B/2 rows; pairs: the rows each batch needs
        if d.packing and self.format != Format.PREFERENCE:
            pack_rows = max(1, t.batch_size // 2)
        self.collate = collate_fn_for(
            self.format,
            padding=self.padding,
            pack_rows=pack_rows,
            pack=d.packing,
            micro_batches=t.micro_batches,
            row_multiple=int(p.mesh.shape["data"] * p.mesh.shape["fsdp"]),
        )
        self.eval_collate = collate_fn_for(self.format, padding=self.padding)
        self.iterator = self.make_iterator()
        programs = build_programs(plan, p)
        self.step_fn, self.eval_fn = programs.train, programs.evaluate
        self.reference = None
        if programs.reference is not None:
            self.reference = ReferenceCache(
                programs.reference, p.reference_params(), cache=t.reference == "precompute"
            )
        self.ckpt = make_checkpointer(cfg, p)
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, self.ckpt)

    def make_iterator(self, state: dict | None = None):
        """The collated batch iterator (``train.batch_size`` examples), at a checkpoint's
        position."""
        return make_iterator(
            self.train_data.items,
            batch_size=self.cfg.train.batch_size,
            collate_fn=self.collate,
            seed=self.cfg.seed,
            shuffle=self.cfg.data.shuffle,
            state=state,
        )

    def _prepare(self, batch: dict) -> dict:
        batch = {k: np.asarray(v) for k, v in batch.items()}
        if self.reference is not None:
            batch.update(self.reference(batch))
        return batch

    def train_step(self, step: int) -> dict:
        """One optimizer step on the next batch; returns its metrics."""
        p = self.policy
        t0 = time.perf_counter()
        batch = self._prepare(next(self.iterator))
        with held():  # the update, once begun, finishes and is logged: a stop inside saves it
            p.state, metrics = self.step_fn(p.state, batch, p.frozen())
            fault_point("update", step)
            out: dict[str, float] = {k: float(v) for k, v in jax.device_get(metrics).items()}
        dt = time.perf_counter() - t0
        out.update({"time/step_s": dt, "tokens_per_s": out["tokens"] / dt})
        return out

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
        for i in bar(range(max(n_batches, 1)), total=max(n_batches, 1), desc="eval batches"):
            chunk = items[i * bs : (i + 1) * bs]
            if len(chunk) < bs:
                break
            batch = self._prepare(self.eval_collate(chunk))
            rows.append(
                jax.device_get(self.eval_fn(self.policy.state.params, batch, self.policy.frozen()))
            )
        if not rows:
            return {}
        return {f"eval/{k}": float(np.mean([float(r[k]) for r in rows])) for k in rows[0]}

    def summary_extras(self) -> dict:
        """The reference cache's hits and misses (``train.reference: precompute``)."""
        if self.reference is not None and self.reference.cache:
            return {
                "reference_cache": {"hits": self.reference.hits, "misses": self.reference.misses}
            }
        return {}


def train_offline(cfg: RunConfig, *, log_stream=None) -> dict:
    """Run an offline config end to end; returns the summary."""
    trainer = OfflineTrainer(cfg, log_stream=log_stream)
    try:
        return trainer.run()
    finally:
        trainer.close()

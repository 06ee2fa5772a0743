"""The online RL trainer: rollout → experience → learner, one step per loop iteration.

Per step (:meth:`OnlineTrainer.train_step`)::

    exp, info = rollouts.collect(iterator, step)       # rollout.py: sample G per prompt, score
    buffer.put(exp); exp = buffer.get(version)         # experience.py: the rollout/learner seam
                                                       # (max_staleness >= 1: producer.py)
    prepared = strategy.prepare(exp, reference)        # algorithms.py: advantages → batch
    batch, m = corrector(prepared.batch)               # correction.py (rollout.correction)
    metrics = learner.update(policy, prepared.batch)   # learner.py: epochs × minibatches

The algorithm is data: its registry entry (``jaxrl_llm.losses.ALGORITHMS``) names the loss,
the family (which strategy), the advantage estimator and what it needs (groups, reference,
critic, pairs, a greedy baseline). Resume, checkpoints, evaluation and logging are the shared
run loop (:class:`~jaxrl_llm.train.run.loop.RunLoop`).
"""

from __future__ import annotations

import time

import jax
import numpy as np
import optax

from jaxrl_llm import models
from jaxrl_llm.data import Format, describe_prompt_splits, make_iterator
from jaxrl_llm.parallel import check_host_blocks
from jaxrl_llm.parallel.decode_model import device_chip
from jaxrl_llm.parallel.host_rows import EXCHANGED
from jaxrl_llm.parallel.sampler_copy import SamplerCopy
from jaxrl_llm.rewards import RewardContext, build_reward_set
from jaxrl_llm.train.compile.aot_inputs import per_device_bytes
from jaxrl_llm.train.config.plan import RunPlan, plan_for_model, plan_run
from jaxrl_llm.train.config.preflight import check_mesh, read_splits
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.algorithms import make_strategy
from jaxrl_llm.train.online.correction import RolloutCorrector
from jaxrl_llm.train.online.episode_sampler import check_environment, episode_records
from jaxrl_llm.train.online.experience import Experience, ExperienceBuffer
from jaxrl_llm.train.online.learner import Learner, context_padded
from jaxrl_llm.train.online.producer import Producer, WeightBox, snapshot
from jaxrl_llm.train.online.rollout import Rollouts
from jaxrl_llm.train.online.step_metrics import share_experience, share_prepared
from jaxrl_llm.train.online.teacher import load_teacher
from jaxrl_llm.train.programs.builder import build_programs
from jaxrl_llm.train.programs.policy import Policy, build_policy, load_policy_model
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.logging import SamplesLog
from jaxrl_llm.train.run.loop import RunLoop
from jaxrl_llm.train.run.progress import phase
from jaxrl_llm.train.run.run_state import NonFiniteGuard, make_checkpointer
from jaxrl_llm.train.run.signals import held


def _encoder(tok):
    """``text -> ids`` of a tokenizer, without special tokens (None when it cannot encode)."""
    encode = getattr(tok, "encode", None)
    if encode is None:
        return None

    def fn(text: str):
        try:
            return encode(text, add_special_tokens=False)
        except TypeError:  # a tokenizer without that option (the char test tokenizer)
            return encode(text)

    return fn


def _reward_model_loader(path: str):
    """``path -> (params, model_config, encode)`` of a reward model with a scalar head."""
    from jaxrl_llm.errors import ConfigError
    from jaxrl_llm.interop import load_model

    loaded = load_model(path)
    if not loaded.config.num_labels:
        raise ConfigError(
            f"reward_model path {path!r} has no scalar head (num_labels=0); "
            f"train one with configs/reward_model.yaml"
        )
    tok = loaded.tokenizer
    encode = None if tok is None else (lambda s: tok.encode(s, add_special_tokens=False))
    return loaded.params, loaded.config, encode


class OnlineTrainer(RunLoop):
    """One online run (see the module docstring); :meth:`run` trains it."""

    def __init__(self, cfg: RunConfig, *, policy: Policy | None = None, log_stream=None):
        super().__init__(cfg, log_stream=log_stream)
        r = cfg.rollout
        _check_processes(cfg)
        # The batch splits over the mesh and the config resolves: before any model loads.
        self.plan = plan = plan_run(cfg, check_mesh(cfg, mesh=policy.mesh if policy else None))
        self.eval_every, self.eval_before = cfg.eval.every, cfg.eval.before
        # the held-out metric: the first reward function (an env-only run: the env's reward)
        self.eval_metric = cfg.rewards[0].name if cfg.rewards else "env"
        self.progress_keys = ("reward/mean", "loss", "eval/" + self.eval_metric, "time/step_s")
        if policy is None:
            with phase(f"model load ({cfg.model.source})"):
                loaded = load_policy_model(cfg)
        else:
            loaded = None
        tok = policy.tokenizer if policy is not None else loaded[2]  # type: ignore[index]
        rewards = self._read_inputs(tok)  # rewards, data, env: checked before anything compiles
        if policy is None:
            config, params, tok = loaded  # type: ignore[misc]
            policy = build_policy(cfg, config=config, params=params, tokenizer=tok, plan=plan)
        self.policy = p = policy
        # host-local rows: process p's devices must hold the p-th block of every batch
        check_host_blocks(p.mesh, int(np.prod([p.mesh.shape[a] for a in ("data", "fsdp")])))
        self.plan = plan = self._place_sampler(plan, p)
        self._sampler_weights: tuple[int, object] | None = None
        self.rollouts = Rollouts(
            r,
            rewards,
            tokenizer=p.tokenizer,
            model_config=p.config,
            weights_fn=self.sampler_weights,
            seed=cfg.seed,
            env=cfg.env,
            max_prompt_len=cfg.data.max_length,
            mesh=self.sampler.engine_mesh,
        )
        self.samples: SamplesLog | None = None  # samples.jsonl, opened by the first step
        # distillation: the frozen teacher (loaded again on resume: it is never checkpointed)
        self.teacher = None
        if plan.needs.teacher:
            self.teacher = load_teacher(cfg, p, full_vocab=plan.needs.teacher_in_loss)
        if self.teacher is not None:
            assert cfg.teacher is not None
            self.say(
                f"teacher: {cfg.teacher.source} ({self.teacher.config.num_params() / 1e6:.1f}M "
                f"params, {cfg.teacher.dtype}"
                + (", with its own system prompt" if cfg.teacher.system_prompt else "")
                + ")"
            )
        self.strategy = make_strategy(plan, p, self.rollouts, log=self.say, teacher=self.teacher)
        self.buffer = ExperienceBuffer(max_staleness=0)
        # rollout.max_staleness >= 1: the background rollout thread, started by the first
        # step (after a resume has restored the data position)
        self.producer: Producer | None = None
        self.programs = programs = build_programs(plan, p, teacher=self.teacher, local_rows=True)
        self.step_fn = programs.train
        if plan.needs.skip_zero:
            self.say(
                f"update: {plan.rows.micro_batches} micro-batches of whole groups per "
                f"minibatch; those whose advantages are all zero are skipped "
                f"(rollout.skip_zero_advantage)"
            )
        self.corrector = None
        if r.correction is not None:
            assert programs.recompute is not None
            self.corrector = RolloutCorrector(
                r.correction, p, programs.recompute, group_size=r.group_size
            )
        self.ref_params = p.reference_params() if plan.needs.reference else None
        companions = self.strategy.companions()
        self.learner = Learner(
            self.step_fn,
            plan.rows,
            seed=cfg.seed,
            companions=tuple(c.update for c in companions),
            actor_drop=tuple(f.name for f in plan.companion_fields),
            pack=plan.pack,
        )
        self.schedules = {
            s.name: _schedule(s, getattr(plan.loss_config, s.name), cfg.max_steps)
            for s in cfg.schedules
        }
        self.iterator = self.make_iterator()
        self.ckpt = make_checkpointer(cfg, p)
        # a companion (PPO's critic: weights + optimizer state) is checkpointed beside the
        # policy, at the same steps, so a resumed run continues with the one it had
        self.companions = [
            (make_checkpointer(cfg, c.policy, subdir=c.name), c.policy) for c in companions
        ]
        self.guard = NonFiniteGuard(cfg.max_nonfinite_steps, self.ckpt)

    def _place_sampler(self, plan: RunPlan, p: Policy) -> RunPlan:
        """The plan with the sampler's placement chosen for the loaded model (the sampler
        decodes on its own copy of the weights, in its own layout; ``rollout.tensor: auto`` is
        chosen here, now that the model is known); sets :attr:`sampler` and says the layout."""
        plan = plan_for_model(
            plan,
            p.config,
            chip=device_chip(p.mesh.devices.flat[0]),
            resident_bytes=per_device_bytes(p.state) + per_device_bytes(p.base),
        )
        self.sampler = SamplerCopy(plan.placement.sampler, models.param_logical_axes(p.config))
        merged = (
            "; LoRA adapters merged into the copy once per version (decode then reads the "
            "weights once per token, not base + adapters)"
            if p.lora is not None
            else ""
        )
        self.say(
            f"sampler: {plan.placement.sampler.describe()}; learner: "
            f"{plan.placement.learner.describe()} ({plan.placement.why}){merged}"
        )
        return plan

    def _read_inputs(self, tok):
        """Build the reward set and read the prompts (and probe the environment) before
        anything compiles: a bad reward keyword, data line or environment costs no model
        build. Returns the reward set (None for an env-only run)."""
        cfg, r = self.cfg, self.cfg.rollout
        ctx = RewardContext(
            tokenizer=_encoder(tok),
            max_new_tokens=r.max_new_tokens,
            load_reward_model=_reward_model_loader,
        )
        rewards = build_reward_set(cfg.rewards, ctx=ctx) if cfg.rewards else None
        self.train_data, self.eval_data = read_splits(
            cfg,
            Format.PROMPT,
            tok,
            per_step=r.prompts_per_step,
            per_step_key="rollout.prompts_per_step",
            unit="prompts",
        )
        self.say(f"data: {describe_prompt_splits(self.train_data, self.eval_data)}")
        if cfg.env is not None:  # a broken environment fails here, before anything compiles
            check_environment(cfg.env, self.train_data.items[0])
            self.say(
                f"env: {cfg.env.name}, at most {cfg.env.max_turns} turns and "
                f"{r.max_new_tokens} completion-side tokens per episode"
            )
        return rewards

    def make_iterator(self, state: dict | None = None):
        """The prompt iterator (``prompts_per_step`` per step), at a checkpoint's position."""
        return make_iterator(
            self.train_data.items,
            batch_size=self.cfg.rollout.prompts_per_step,
            seed=self.cfg.seed,
            shuffle=self.cfg.data.shuffle,
            state=state,
        )

    def _epoch(self) -> float:
        """The data epoch the iterator is in (fractional; 0 when it cannot say)."""
        state = getattr(self.iterator, "state", None)
        per_epoch = getattr(self.iterator, "steps_per_epoch", 0)
        if not callable(state) or not per_epoch:
            return 0.0
        pos = state()
        return float(pos.get("epoch", 0) + pos.get("position", 0) / per_epoch)

    def sampler_weights(self) -> tuple[object, int]:
        """``(the sampler's copy, version)``: made once per policy version (the previous
        copy's buffers reused; :class:`~jaxrl_llm.parallel.sampler_copy.SamplerCopy`)."""
        version = int(self.policy.state.step)
        if self._sampler_weights is None or self._sampler_weights[0] != version:
            self._sampler_weights = None  # its buffers go to the new copy
            copy = self.sampler(self.policy.full_params(), reuse=True)
            self._sampler_weights = (version, copy)
        return self._sampler_weights[1], version

    def frozen(self) -> dict:
        """The train step's frozen arguments: the policy's (LoRA's base) and, when the loss
        runs it (GKD), the teacher's weights."""
        out = self.policy.frozen()
        if self.plan.needs.teacher_in_loss:
            assert self.teacher is not None
            out["teacher"] = self.teacher.params
        return out

    def reference(self, batch: dict) -> dict:
        """The frozen reference's batch entries (``ref_logp`` or the pair log-probs), as
        numpy; its time adds to this step's ``time/reference_s``."""
        ref_fn = self.programs.reference
        assert ref_fn is not None
        t = time.perf_counter()
        out = jax.device_get(
            context_padded(
                lambda b: ref_fn(self.ref_params, {k: np.asarray(v) for k, v in b.items()}),
                batch,
                self.policy,
            )
        )
        self._t_ref += time.perf_counter() - t
        return out

    def evaluate(self) -> dict[str, float]:
        """Greedy decoding on the held-out prompts: mean of the first reward function."""
        if self.eval_data is None:
            return {}
        return self.rollouts.evaluate(self.eval_data.items, self.cfg.eval, self.eval_metric)

    def hparams(self, step: int) -> dict[str, float] | None:
        """This step's scheduled loss hyperparameters (``schedules``), or None."""
        if not self.schedules:
            return None
        return {k: float(f(step - 1)) for k, f in self.schedules.items()}

    def experience(self, step: int) -> tuple[Experience, dict]:
        """This step's experience and rollout metrics: sampled now with the current weights
        (``rollout.max_staleness: 0``), or taken from the background producer (at most
        ``max_staleness`` steps old; :mod:`jaxrl_llm.train.online.producer`)."""
        r, p = self.cfg.rollout, self.policy
        if not r.max_staleness:
            t0 = time.perf_counter()
            exp, info = self.rollouts.collect(self.iterator, step)
            t_rollout = time.perf_counter() - t0
            self.buffer.put(exp)
            fresh = self.buffer.get(int(p.state.step))
            assert fresh is not None  # synchronous: the batch just put, sampled by these weights
            return fresh, {**info, "time/rollout_s": t_rollout}
        if self.producer is None:
            box = WeightBox(*snapshot(p, self.sampler))
            sampler = Rollouts(
                r,
                self.rollouts.rewards,
                tokenizer=p.tokenizer,
                model_config=p.config,
                weights_fn=box.get,
                seed=self.cfg.seed,
                env=self.cfg.env,
                partial=r.partial,
                max_prompt_len=self.cfg.data.max_length,
                mesh=self.sampler.engine_mesh,
            )
            self.producer = Producer(
                sampler,
                self.iterator,
                box,
                max_staleness=r.max_staleness,
                updates_per_step=self.plan.rows.epochs * self.plan.rows.minibatches,
                staleness=r.staleness,
                first_step=step,
                last_step=self.cfg.max_steps,
            )
        exp, info = self.producer.next_batch(step, int(p.state.step))
        self.iterator = self.producer.position  # what a checkpoint records
        return exp, info

    def close(self) -> None:
        """Stop the rollout thread (if any), then release the checkpoint managers."""
        if self.producer is not None:
            self.producer.close()
        close_episodes = getattr(self.rollouts.episodes, "close", None)
        if close_episodes is not None:  # an openai_agent run's endpoint
            close_episodes()
        super().close()

    def _write_samples(self, step: int, exp: Experience) -> None:
        """``logging.samples_every``: this step's episodes to ``samples.jsonl`` (across
        processes each writes its own rows: ``samples.process-k.jsonl`` for k > 0)."""
        every = self.cfg.logging.samples_every
        if not every:
            return
        if self.samples is None:
            self.samples = SamplesLog(
                paths.log_dir(self.cfg),  # local: output_dir may be a bucket
                every,
                resume_step=self.start_step if self.resumed else None,
                process_index=jax.process_index(),  # each process its own rows
            )
        if step % every == 0:
            self.samples.write(step, episode_records(exp))

    def train_step(self, step: int) -> dict:
        """Rollout → experience → learner batch → updates; returns the step's metrics."""
        t0 = time.perf_counter()
        sent, calls = EXCHANGED
        if self.rollouts.rewards is not None:  # the reward functions' trainer_state
            self.rollouts.rewards.advance(step, self._epoch(), self.cfg.max_steps)
        exp, info = self.experience(step)
        # host-local rows: one prompt width, the metrics and row numbers of every process's
        exp, info, rows, tokens = share_experience(exp, info)
        t_rollout = info.pop("time/rollout_s")
        t1 = time.perf_counter()
        self._t_ref = 0.0
        prepared = self.strategy.prepare(
            exp, self.reference if self.programs.reference is not None else None
        )
        self.plan.handover_layout.check(prepared.batch, where=type(self.strategy).__name__)
        correction: dict[str, float] = {}
        if self.corrector is not None:
            prepared.batch, correction = self.corrector(prepared.batch)
        t2 = time.perf_counter()
        hp = self.hparams(step)
        # the updates, once begun, finish and the step is logged: a stop inside saves it
        with held():
            out = self.learner.update(
                self.policy, prepared.batch, step, frozen=self.frozen(), hparams=hp
            )
            t_update = time.perf_counter() - t2
            if self.producer is not None:
                self.producer.box.publish(*snapshot(self.policy, self.sampler))
            self._write_samples(step, exp)
            prepared_metrics, advantages = share_prepared(prepared, exp)
            out.update(exp.metrics)
            out.update(prepared_metrics)
            out.update(correction)
            out.update(self.sampler.metrics())
            out.update({f"hparams/{k}": v for k, v in (hp or {}).items()})
            out.update(
                {
                    **info,
                    **rows,
                    "time/rollout_s": t_rollout,
                    "time/reference_s": self._t_ref,
                    "time/prepare_s": t2
                    - t1
                    - self._t_ref
                    - correction.get("time/recompute_s", 0.0),
                    "time/update_s": t_update,
                    "time/step_s": time.perf_counter() - t0,
                    "rollout/tokens_per_s": tokens / max(t_rollout, 1e-9),
                }
            )
            out.update(advantages)
            if jax.process_count() > 1:  # what this step sent other hosts outside its programs
                out["hosts/exchanged_bytes"] = EXCHANGED[0] - sent
                out["hosts/collectives"] = EXCHANGED[1] - calls
            return out


def _check_processes(cfg: RunConfig) -> None:
    """What a multi-process online run does not do yet, refused in one line each."""
    if jax.process_count() == 1:
        return
    from jaxrl_llm.errors import ConfigError

    r, n = cfg.rollout, jax.process_count()
    if r.prompts_per_step % n:
        raise ConfigError(
            f"rollout.prompts_per_step={r.prompts_per_step} must divide over the {n} processes "
            f"(each samples and keeps an equal share of the step's prompts)"
        )
    if r.max_staleness and r.dynamic_sampling:
        raise ConfigError(
            f"rollout.dynamic_sampling with max_staleness across {n} processes is not built: "
            f"the processes agree on each round's count, which the background sampler "
            f"cannot do beside the learner; use max_staleness: 0"
        )
    if cfg.logprobs.pack:
        raise ConfigError(
            f"logprobs.pack across {n} processes is not built (packing moves rows between "
            f"hosts' shares); use logprobs.pack: false"
        )
    if r.max_staleness and r.staleness == "drop":
        raise ConfigError(
            f"rollout.staleness=drop across {n} processes is not built: each process would "
            f"drop batches by its own clock; use staleness: wait"
        )
    if r.devices:
        raise ConfigError(
            f"rollout.devices={r.devices} across {n} processes is not built (placement "
            f"within one host only); use rollout.devices: 0"
        )


def _schedule(item, init: float, max_steps: int):
    """The optax schedule of a ``schedules`` item, from the loss value ``init``."""
    steps = item.steps or max_steps
    if item.kind == "cosine":
        alpha = item.end / init if init else 0.0
        return optax.cosine_decay_schedule(init, steps, alpha=alpha)
    return optax.linear_schedule(init, item.end, steps)


def train_online(cfg: RunConfig, *, log_stream=None) -> dict:
    """Run an online RL config end to end; returns the summary (eval before/after, timings)."""
    trainer = OnlineTrainer(cfg, log_stream=log_stream)
    try:
        return trainer.run()
    finally:
        trainer.close()

"""One builder of a run's programs from its plan: what the trainers run and the compiler lowers.

:func:`build_programs` turns a :class:`~jaxrl_llm.train.config.plan.RunPlan` and a
:class:`~jaxrl_llm.train.programs.policy.Policy` into the run's jitted programs: the policy's train
step, the reference forward, the correction's recompute forward, the evaluation metrics, and
(PPO) the critic's train step and value forward (:func:`build_critic`). The trainers call it
with a real policy; ``jaxrl-llm compile`` (:mod:`jaxrl_llm.train.compile.aot`) with an abstract one
(:func:`~jaxrl_llm.train.programs.policy.policy_on_mesh` without weights) and lowers the same
functions on abstract arguments. So what compiles for a TPU slice is what trains.

The sampler's decode loop is not built here: the engines own their programs
(:mod:`jaxrl_llm.sampling`), and the compiler lowers :func:`jaxrl_llm.sampling.decode`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl_llm.losses import critic_values, get_loss, sequence_logps
from jaxrl_llm.parallel import batch_sharding, constrain_batch, on_processes, to_host, under_mesh
from jaxrl_llm.parallel.context import batch_split, context_size
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.programs.policy import Policy, policy_on_mesh
from jaxrl_llm.train.programs.step import make_train_step
from jaxrl_llm.train.programs.teacher import Teacher


@dataclasses.dataclass(frozen=True)
class Programs:
    """A run's jitted programs (module docstring).

    Attributes:
      train: ``train(state, batch, frozen, hparams=None) -> (state, metrics)``
        (:func:`~jaxrl_llm.train.programs.step.make_train_step`; ``train.jitted`` lowers).
      evaluate: ``evaluate(params, batch, frozen) -> metrics`` of the loss, no update.
      reference: ``reference(ref_params, batch) -> {entry: array}``, the frozen reference's
        batch entries; None when the plan needs no reference.
      recompute: ``recompute(params, batch, **frozen) -> logp [B, T]``, the learner's
        log-probs of the sampled tokens before the update (``rollout.correction``); None off.
    """

    train: Callable[..., Any]
    evaluate: Callable[..., Any]
    reference: Callable[..., Any] | None
    recompute: Callable[..., Any] | None


@dataclasses.dataclass(frozen=True)
class TeacherPrograms:
    """Distillation's forwards outside the step (reverse-KL advantages).

    Attributes:
      teacher: ``teacher(teacher_params, batch) -> logp [B, T]``, the frozen teacher's
        log-probs of a batch's tokens, sharded and prompt-shared as the reference's forward.
      student: ``student(params, batch, **frozen) -> logp [B, T]``, the policy's, from the
        same log-prob code before the update (LoRA attached as in the step).
    """

    teacher: Callable[..., Any]
    student: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class CriticPrograms:
    """PPO's critic programs.

    Attributes:
      train: the critic's train step (the ``ppo_critic`` loss, its own optimizer).
      values: ``values(params, batch) -> [B, T]`` per-token values.
    """

    train: Callable[..., Any]
    values: Callable[..., Any]


def forward_under_mesh(fn: Callable[..., Any], mesh: jax.sharding.Mesh) -> Callable[..., Any]:
    """A forward program ``fn(params, batch, ...)`` as the train step runs its loss on a
    context mesh: traced under the mesh, the batch's tokens split over ``context`` (ring
    attention). On a mesh that splits rows (:func:`~jaxrl_llm.parallel.batch_split` > 1)
    traced under it too, so its activations are placed by rows; ``fn`` itself otherwise."""
    if context_size(mesh) <= 1:
        return under_mesh(fn, mesh) if batch_split(mesh) > 1 else fn

    def split(params, batch, *rest, **kw):
        return fn(params, constrain_batch(batch, mesh), *rest, **kw)

    return under_mesh(split, mesh)


def build_programs(
    plan: RunPlan, policy: Policy, teacher: Teacher | None = None, *, local_rows: bool = False
) -> Programs:
    """The policy's programs for ``plan`` (module docstring); ``teacher``: the frozen teacher
    when the plan needs one (its forward, and its weights as the step's frozen ``teacher``
    argument when the loss runs it). ``local_rows``: across processes each passes its own
    rows (the online loop's host-local batches) and gets its own rows' results back;
    otherwise every process passes the whole batch (offline: every host reads it)."""
    spec, lc, lp = plan.spec, plan.loss_config, plan.logprobs
    loss_fn = spec.loss_fn
    frozen_sharding = policy.frozen_sharding
    if plan.needs.teacher_in_loss:
        assert teacher is not None
        loss_fn = functools.partial(loss_fn, teacher_apply_fn=teacher.apply_fn)
        frozen_sharding = {**frozen_sharding, "teacher": teacher.sharding}
    loss = policy.loss_fn(loss_fn, loss_config=lc, logprobs=lp)
    train = make_train_step(
        loss,
        policy.optimizer,
        mesh=policy.mesh,
        state_sharding=policy.state_sharding,
        batch_sharding=batch_sharding(policy.mesh),
        micro_batches=plan.rows.micro_batches,
        denominator_fn=functools.partial(spec.denominator_fn, config=lc),
        grad_clip=plan.cfg.optim.grad_clip,
        frozen_sharding=frozen_sharding,
        skip_fn=plan.zero_batch_fn(),
    )
    reference = None
    if plan.needs.reference:
        assert spec.reference_fn is not None
        ref_fn = functools.partial(
            spec.reference_fn, apply_fn=policy.apply_fn, config=lc, logprobs=lp
        )
        reference = jax.jit(forward_under_mesh(ref_fn, policy.mesh))
    recompute = None
    if plan.needs.correction is not None:
        recompute = policy.logps_fn(
            functools.partial(sequence_logps, **lp.kwargs()),
            wrap=lambda fn: forward_under_mesh(fn, policy.mesh),
        )
    evaluate = jax.jit(lambda params, batch, frozen: loss(params, batch, **frozen)[1])
    # On a mesh spanning processes, host batches enter as global arrays split by rows, and
    # per-row results come back (parallel/host_rows.py: on_processes).
    wrap = functools.partial(on_processes, mesh=policy.mesh, local_rows=local_rows)
    return Programs(
        train=wrap(train, gather=False),
        evaluate=wrap(evaluate, gather=True),
        reference=None if reference is None else wrap(reference, gather=True),
        recompute=None if recompute is None else wrap(recompute, gather=True),
    )


def build_teacher_programs(plan: RunPlan, policy: Policy, teacher: Teacher) -> TeacherPrograms:
    """The teacher's and the student's log-prob forwards with the plan's settings (τ, the
    completion window, the shared prompt), traced as the reference's forward is
    (:func:`forward_under_mesh` on the policy's mesh)."""
    lp = plan.logprobs
    t_fn = functools.partial(sequence_logps, apply_fn=teacher.apply_fn, **lp.kwargs())
    student = policy.logps_fn(
        functools.partial(sequence_logps, **lp.kwargs()),
        wrap=lambda fn: forward_under_mesh(fn, policy.mesh),
    )
    wrap = functools.partial(on_processes, mesh=policy.mesh, gather=True, local_rows=True)
    return TeacherPrograms(
        teacher=wrap(jax.jit(forward_under_mesh(t_fn, policy.mesh))), student=wrap(student)
    )


def critic_policy(plan: RunPlan, policy: Policy, *, abstract: bool = False) -> Policy:
    """PPO's critic: the policy's trunk with a zero-initialised scalar head, its own optimizer
    at ``ppo.critic_lr``, on the policy's mesh; ``abstract``: shapes only (the compiler)."""
    cfg = plan.cfg
    ccfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=cfg.ppo.critic_lr))
    config = dataclasses.replace(policy.config, num_labels=1)
    params = None
    if not abstract:
        params = dict(jax.device_get(to_host(policy.state.params)))
        params["score_head"] = {"kernel": np.zeros((config.hidden_size, 1), np.float32)}
    rows = plan.rows
    return policy_on_mesh(
        ccfg,
        config,
        policy.mesh,
        params=params,
        tokenizer=policy.tokenizer,
        updates_per_step=rows.epochs * rows.minibatches,  # one critic update per minibatch
    )


def build_critic(plan: RunPlan, critic: Policy) -> CriticPrograms:
    """PPO's critic programs on ``critic`` (a scalar-head copy of the policy, its optimizer at
    ``ppo.critic_lr``; real or abstract)."""
    spec = get_loss("ppo_critic")
    closs = spec.preset(value_clip=plan.cfg.ppo.value_clip)
    train = make_train_step(
        critic.loss_fn(spec.loss_fn, loss_config=closs),
        critic.optimizer,
        mesh=critic.mesh,
        state_sharding=critic.state_sharding,
        batch_sharding=batch_sharding(critic.mesh),
        micro_batches=1,
        denominator_fn=functools.partial(spec.denominator_fn, config=closs),
        grad_clip=plan.cfg.optim.grad_clip,
    )
    values = jax.jit(functools.partial(critic_values, apply_fn=critic.apply_fn))
    wrap = functools.partial(on_processes, mesh=critic.mesh, local_rows=True)
    return CriticPrograms(train=wrap(train, gather=False), values=wrap(values, gather=True))

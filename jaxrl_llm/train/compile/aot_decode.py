"""The sampler's programs compiled ahead of time: the reshard into the sampler's copy and the
decode loop, as :func:`jaxrl_llm.train.compile.aot.compile_run` lowers them beside the train
step. Each comes back as a :class:`~jaxrl_llm.train.compile.aot_report.ProgramMemory` whose
resident bytes are what the step keeps alive beside it (``others``: a callable over the
resident table, as :mod:`~jaxrl_llm.train.compile.aot` passes it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm import models
from jaxrl_llm.parallel import DEFAULT_RULES
from jaxrl_llm.parallel.sampler_copy import SamplerCopy
from jaxrl_llm.train.compile.aot_inputs import (
    compile_program,
    decode_state_sharding,
    per_device_bytes,
)
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.programs.policy import Policy

__all__ = ["SAMPLER_COPY", "compile_decode", "compile_reshard", "compile_sampler", "run_sampling"]

SAMPLER_COPY = "sampler copy (rollout dtype)"


def compile_reshard(plan: RunPlan, policy: Policy, copy: SamplerCopy, others):
    """The program that makes the sampler's copy from the learner's weights once per policy
    version (:meth:`SamplerCopy.program`): the learner's master params (LoRA: the merged
    weights, as a fresh argument) in, the sampler's layout and dtype out. Only colocated: a
    sampler on devices of its own receives the copy by a transfer, not a program."""
    full = policy.full_shapes()
    # the previous copy is donated to the new one: the output, not a resident array
    resident = others(SAMPLER_COPY)
    if policy.lora is None:
        resident -= per_device_bytes(full)
    return compile_program(
        "reshard", copy.program(full), (full,), resident, num_devices=copy.mesh.size
    )


def compile_decode(
    plan: RunPlan, policy: Policy, copy: SamplerCopy, others, seq_len: int, prompt_len: int
):
    """The sampler's decode loop as the run's sampler runs it: on one process's part of the
    sampler's layout (its replicas × tensor; :attr:`SamplerCopy.local_mesh`), with that
    process's rows, the copy's weights in the rollout dtype, the run's sampling settings and
    the model's stop ids; rows split over the replicas, the mesh bound as the ambient mesh
    (:func:`jaxrl_llm.sampling.rows.on_rows_mesh`) so the loop's own placements apply. Its
    ``while_loop`` stops on data; its work is counted for ``seq_len − prompt_len`` steps
    (every row to the end). The paged engine's chunked programs are not lowered: a run with
    ``rollout.engine: paged`` is modeled by this loop."""
    from jaxrl_llm.sampling import decode as decode_loop
    from jaxrl_llm.sampling import init_decode_state, stop_token_ids
    from jaxrl_llm.sampling.rows import on_rows_mesh
    from jaxrl_llm.sampling.slots import cast_for_rollout

    mesh = copy.local_mesh
    r = plan.cfg.rollout
    processes = copy.mesh.size // mesh.size
    n_prompts, gen_len = -(-r.prompts_per_step // processes), seq_len - prompt_len
    full = policy.full_shapes()
    weights = copy.abstract(full, local=True)
    _, config = cast_for_rollout(None, policy.config, copy.layout.dtype)
    sampling = run_sampling(r)

    def init(last_logits, cache, pos, ids):
        return init_decode_state(
            last_logits,
            cache,
            pos,
            ids,
            seed=0,
            num_samples=plan.rows.group,
            gen_len=gen_len,
            max_new_tokens=gen_len,
        )

    dstate = jax.eval_shape(
        init,
        jax.ShapeDtypeStruct((n_prompts, config.vocab_size), jnp.float32),
        jax.eval_shape(
            lambda: models.init_cache(
                config, n_prompts, seq_len, layered=models.layered_cache_supported(config)
            )
        ),
        jax.ShapeDtypeStruct((n_prompts,), jnp.int32),
        jax.ShapeDtypeStruct((n_prompts,), jnp.int32),
    )
    # rows over the replicas, the cache's KV heads over tensor, its slots whole
    dsharding = decode_state_sharding(dstate, mesh, {**DEFAULT_RULES, "length": None})
    stop = stop_token_ids(config, sampling)
    dec = jax.jit(
        lambda p, s: decode_loop(p, s, config=config, sampling=sampling, stop_ids=stop, pad_id=0),
        in_shardings=(jax.tree.map(lambda x: x.sharding, weights), dsharding),
        out_shardings=dsharding,
        donate_argnums=(1,),
    )
    abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), dstate, dsharding
    )
    with on_rows_mesh(mesh):
        out = compile_program(
            "decode",
            dec,
            (weights, abstract_state),
            others(SAMPLER_COPY),  # the learner's state stays; the copy is the argument
            num_devices=mesh.size,
            unknown_trips=gen_len,
        )
    cache_bytes = float(per_device_bytes(abstract_state.cache))
    # slots written by step t (1-based): the prompt's and t new tokens' (every row to the end)
    written_slots = gen_len * prompt_len + gen_len * (gen_len + 1) / 2
    # the prefill (not lowered): 2 N FLOPs per prompt token, the weights read once
    n = config.num_params(active=True)
    if not config.tie_embeddings:  # the input embedding is a lookup
        n -= config.vocab_size * config.hidden_size
    split = dict(
        prefill_flops=2.0 * n * n_prompts * prompt_len / mesh.size,
        prefill_bytes=float(per_device_bytes(weights)),
        weight_bytes=float(per_device_bytes(weights)) * gen_len,
        kv_bytes=cache_bytes * gen_len,
        kv_written_bytes=cache_bytes * written_slots / seq_len,
    )
    return dataclasses.replace(out, notes=split)


def compile_sampler(
    plan: RunPlan, policy: Policy, copy: SamplerCopy, others, seq_len: int, prompt_len: int
) -> list:
    """The sampler's programs as a step runs them: the reshard into its copy (colocated, a
    copy of its own) and the decode loop (:func:`compile_reshard`, :func:`compile_decode`)."""
    out = []
    if plan.placement.colocated and not plan.placement.sampler_reads_learner:
        out.append(compile_reshard(plan, policy, copy, others))
    out.append(compile_decode(plan, policy, copy, others, seq_len, prompt_len))
    return out


def run_sampling(r) -> Any:
    """The run's :class:`~jaxrl_llm.sampling.SamplingConfig` (``rollout``'s settings)."""
    from jaxrl_llm.sampling import SamplingConfig

    return SamplingConfig(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, min_p=r.min_p)

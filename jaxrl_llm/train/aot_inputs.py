"""The abstract inputs of ``jaxrl-llm compile``: batches, shardings and run configs as
``ShapeDtypeStruct``s (nothing allocated), the decode state's shardings, and the analytic FLOPs
(see :mod:`jaxrl_llm.train.aot`)."""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_spec
from jaxrl_llm.train.aot_report import ProgramMemory

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def _per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with NamedShardings (its shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def _abstract(shapes: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )


def _program(name: str, jitted, args: tuple, resident: int) -> ProgramMemory:
    """Compile ``jitted`` for ``args`` and read its memory, cost and ring transfers.

    Raises:
      ConfigError: the TPU compiler refuses a program whose temporaries alone exceed a
        device's HBM (XLA's RESOURCE_EXHAUSTED, one line with its numbers).
    """
    try:
        compiled = jitted.lower(*args).compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        xla = str(e).strip().splitlines()[0].rstrip(".")
        raise ConfigError(
            f"the {name} program does not fit one device ({xla}); split it over more "
            f"devices (--mesh, --topology) or lower --batch / --seq-len"
        ) from None
    ma = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return ProgramMemory(
        name=name,
        argument_bytes=int(ma.argument_size_in_bytes),
        output_bytes=int(ma.output_size_in_bytes),
        alias_bytes=int(ma.alias_size_in_bytes),
        temp_bytes=int(ma.temp_size_in_bytes),
        code_bytes=int(ma.generated_code_size_in_bytes),
        flops=float((cost or {}).get("flops", 0.0)),
        resident_bytes=resident,
        collective_permutes=len(_COLLECTIVE_PERMUTE.findall(compiled.as_text() or "")),
    )


# a collective-permute op in compiled HLO text (synchronous, or the start of an async one):
# ring attention's neighbour transfers (jaxrl_llm.models.ring_attention), among others
_COLLECTIVE_PERMUTE = re.compile(r"\bcollective-permute(?:-start)?\(")


# ----- abstract batches, one builder per loss batch layout (LossSpec.batch_kind) --------------


def _seq(rows: int, t: int, prefix: str = "") -> dict:
    i = lambda: jax.ShapeDtypeStruct((rows, t), jnp.int32)
    return {f"{prefix}input_ids": i(), f"{prefix}attention_mask": i(), f"{prefix}loss_mask": i()}


def _f32(*shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _rl_batch(rows, t, *, with_ref):
    out = {**_seq(rows, t), "old_logp": _f32(rows, t), "advantages": _f32(rows, t)}
    return {**out, "ref_logp": _f32(rows, t)} if with_ref else out


def _preference_batch(rows, t, *, with_ref):
    out = {**_seq(rows, t, "chosen_"), **_seq(rows, t, "rejected_")}
    if with_ref:
        out.update(ref_chosen_logps=_f32(rows), ref_rejected_logps=_f32(rows))
    return out


def _kto_batch(rows, t, *, with_ref):
    out = {**_seq(rows, t), **_seq(rows, t, "kl_"), "label": _f32(rows)}
    return {**out, "ref_logps": _f32(rows), "ref_kl_logps": _f32(rows)} if with_ref else out


def _rank_batch(rows, t, *, with_ref):
    return {**_seq(rows, t), "scores": _f32(rows)}


def _sequence_batch(rows, t, *, with_ref):
    return _seq(rows, t)


BATCHES = {
    "rl": _rl_batch,
    "preference": _preference_batch,
    "kto": _kto_batch,
    "rank": _rank_batch,
    "sequence": _sequence_batch,
}


def correction_entries(rows: int, t: int, *, decoupled: bool) -> dict:
    """The entries ``rollout.correction`` adds to an ``rl`` batch before the update
    (:func:`jaxrl_llm.train.correction.correct_batch`): the proximal log-probs (decoupled PPO)
    or the importance weights, ``[rows, t]`` float32."""
    return {"proximal_logp" if decoupled else "is_weights": _f32(rows, t)}


def _critic_batch(rows, t):
    return {**_seq(rows, t), "values": _f32(rows, t), "returns": _f32(rows, t)}


# ----- the run ---------------------------------------------------------------------------------


def _run_config(
    algorithm,
    *,
    batch_size,
    group_size,
    gen_len,
    prompt_len,
    minibatches,
    micro_batches,
    remat,
    dtype,
    lora_rank,
    mesh,
    correction=None,
):
    from jaxrl_llm.losses import ALGORITHMS as LOSS_ALGORITHMS
    from jaxrl_llm.train.run_config import RunConfig
    from jaxrl_llm.train.sections import (
        DataSection,
        LogprobSection,
        LoRASection,
        MeshSection,
        ModelSection,
        RewardItem,
        RolloutSection,
        TrainSection,
    )

    if algorithm not in LOSS_ALGORITHMS:
        raise ConfigError(
            f"algorithm {algorithm!r} has no trainer; trainable: "
            f"{', '.join(sorted(LOSS_ALGORITHMS))}"
        )
    online = LOSS_ALGORITHMS[algorithm].online
    if correction is not None and not online:
        raise ConfigError(
            f"rollout.correction corrects an online rollout; {algorithm!r} is trained offline"
        )
    return RunConfig(
        output_dir="(compile)",
        max_steps=1,
        algorithm=algorithm,
        model=ModelSection(
            source="(preset)",
            compute_dtype=_DTYPES[dtype],
            remat=remat,
            lora=LoRASection(rank=lora_rank) if lora_rank else None,
        ),
        mesh=MeshSection(**mesh),
        # context parallelism needs every row's own forward (train.preflight.check_context)
        logprobs=LogprobSection(shared_prompt=mesh.get("context", 1) <= 1),
        data=DataSection(train="(compile)", max_length=prompt_len + gen_len),
        rollout=RolloutSection(
            prompts_per_step=batch_size,
            group_size=group_size,
            max_new_tokens=gen_len,
            minibatches=minibatches,
            correction=correction,
        ),
        train=TrainSection(batch_size=batch_size, micro_batches=micro_batches),
        rewards=(RewardItem("math_answer"),) if online else (),
    )


_DECODE_AXES = {  # logical names of DecodeState / KVCache dimensions
    "logits": ("batch", None),
    "tokens": ("batch", None),
    "logprobs": ("batch", None),
    "positions": ("batch",),
    "done": ("batch",),
    "lengths": ("batch",),
    "keys": ("batch", None),
    "step": (),
    "max_new_tokens": (),
}
_CACHE_AXES = {
    "k": ("layers", "batch", "length", "kv_heads", "head_dim"),
    "v": ("layers", "batch", "length", "kv_heads", "head_dim"),
    "mask": ("batch", "length"),
    "positions": ("batch", "length"),
    "index": (),
}


def _decode_state_sharding(dstate, mesh, rules=DEFAULT_RULES):
    """Rows over the batch axes, KV heads over ``tensor``: how a sharded sampler lays out its
    loop state (``DecodeState`` fields by name), by the rule table ``rules``."""

    def named(axes, x, name):
        return NamedSharding(mesh, logical_to_spec(axes, mesh, rules, shape=x.shape, name=name))

    fields = {}
    for f, x in dstate._asdict().items():
        if f == "cache":
            fields[f] = type(x)(
                **{k: named(_CACHE_AXES[k], v, f"cache.{k}") for k, v in x._asdict().items()}
            )
        else:
            fields[f] = named(_DECODE_AXES[f], x, f)
    return type(dstate)(**fields)


def analytic_train_flops(config: models.ModelConfig, tokens: int, *, remat: str) -> float:
    """Matmul FLOPs of one training pass over ``tokens`` tokens: 6·N·tokens (forward 2·N,
    backward 4·N; Kaplan et al. 2020, https://arxiv.org/abs/2001.08361) + 2·N·tokens more when
    every layer is recomputed (``remat='full'``). Attention's T² term is left out. For a
    mixture of experts N is the active parameters (the k experts a token runs)."""
    n = config.num_params(active=True)
    return (8.0 if remat == "full" else 6.0) * n * tokens

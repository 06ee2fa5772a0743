"""The preflight memory check of a run (:func:`check_step_memory`): the memory estimate of its
step against what a device has free, before any model loads. It lives with the sizing code it
calls (issue 51: ``train/config/`` imports nothing of ``train/compile/``)."""

from __future__ import annotations

import jax

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import free_memory
from jaxrl_llm.parallel.chips import GiB
from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, estimate_memory
from jaxrl_llm.train.config.preflight import known_model_config
from jaxrl_llm.train.config.run_config import RunConfig


def check_step_memory(cfg: RunConfig, plan, *, model_config=None, resident_bytes: int = 0) -> None:
    """Refuse a step whose memory estimate (:func:`jaxrl_llm.train.compile.memory.
    estimate_memory`, what ``jaxrl-llm memory`` prints) exceeds what a device has free:
    ``rollout.group_size=1000000`` stops here, before any model loads, instead of exhausting
    the machine. The model is ``model_config`` or the one :func:`~jaxrl_llm.train.config.preflight.known_model_config` knows
    (nothing is checked for another source before it loads); a run split over ``mesh.context``
    is not estimated (the estimate has no ring attention). On the CPU the devices share the
    host's free memory. ``resident_bytes``: what a loaded model already holds per device (its
    weights and optimizer state, which the estimate counts too), added back to what is free.

    Raises:
      ConfigError: one line with the rows, the estimate and the memory free.
    """
    config = model_config or known_model_config(cfg.model.source, cfg.model.tiny)
    mesh = dict(plan.mesh)
    if config is None or cfg.algorithm not in ALGORITHM_MEMORY or mesh.get("context", 1) > 1:
        return
    rows, gen = plan.rows, cfg.rollout.max_new_tokens if cfg.is_online else 0
    prompt = cfg.data.max_length or (1 if cfg.is_online else None)
    if prompt is None:
        return  # offline rows without data.max_length: their length is the data's
    estimate = estimate_memory(
        config,
        cfg.algorithm,
        batch_size=cfg.rollout.prompts_per_step if cfg.is_online else cfg.train.batch_size,
        seq_len=prompt + gen,
        prompt_len=prompt,
        group_size=cfg.rollout.group_size,
        dtype="fp32" if cfg.model.compute_dtype == "float32" else "bf16",
        lora_rank=cfg.model.lora.rank if cfg.model.lora else 0,
        lora_base_dtype=cfg.model.lora.base_dtype if cfg.model.lora else None,
        remat=cfg.model.remat,
        device="cpu",  # only its memory differs; the budget below is this machine's
        micro_batches=rows.micro_batches,
        minibatches=max(1, rows.per_step // max(rows.per_update, 1)),
        prompt_group_size=int(plan.logprobs.prompt_group_size),
        **{k: v for k, v in mesh.items() if k != "context"},
    )
    device = jax.local_devices()[0]
    free = free_memory(device)
    if device.platform == "cpu":
        free //= max(jax.local_device_count(), 1)
    free += resident_bytes
    need = estimate.total_bytes_per_device
    if need <= free:
        return
    what = (
        f"rollout.prompts_per_step x group_size = {cfg.rollout.prompts_per_step} x "
        f"{cfg.rollout.group_size} rows of {prompt + gen} tokens"
        if cfg.is_online
        else f"train.batch_size={cfg.train.batch_size} rows of {prompt} tokens"
    )
    lower = (
        "lower rollout.group_size or rollout.prompts_per_step, shorten rollout.max_new_tokens "
        "or raise rollout.minibatches"
        if cfg.is_online
        else "lower train.batch_size or data.max_length, or raise train.micro_batches"
    )
    raise ConfigError(
        f"{what} need ~{need / GiB:,.1f} GiB per device by the memory estimate (jaxrl-llm "
        f"memory --algorithm {cfg.algorithm}), more than the {free / GiB:,.1f} GiB a "
        f"{device.platform} device has free; {lower}"
    )

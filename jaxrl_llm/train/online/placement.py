"""Where rollouts sample: on the learner's mesh (colocated) or on devices of their own.

``rollout.devices: 0`` (the default) is the colocated placement: the sampler reads the
learner's parameters where they are, on the learner's mesh (no copy; the asynchronous
producer's snapshot copies only what the next update would overwrite in place).

``rollout.devices: n`` is the disaggregated placement of the asynchronous RL trainers (AReaL,
Fu et al. 2025, https://arxiv.org/abs/2505.24298; verl's one-step-off and fully-async
trainers; NeMo-RL's non-colocated mode): the last ``n`` devices form a rollout mesh, the
learner's mesh spans the others, and after each update the weights move to the rollout mesh
by a resharding ``jax.device_put`` onto the rollout mesh's shardings. With
``rollout.max_staleness ≥ 1`` generation (rollout mesh) and the update (learner mesh) then run
concurrently; with ``max_staleness: 0`` they alternate, and the split only costs the copy.

The rollout mesh has axes ``data`` × ``tensor`` (``rollout.tensor``, default 1: every rollout
device holds the whole model); the parameters are laid out on it by the same logical-axis
rules as on the learner's mesh (:data:`jaxrl_llm.parallel.DEFAULT_RULES`), so ``tensor: t`` splits
heads and MLP columns over ``t`` devices as tensor-parallel inference engines do.

Each copy's seconds and bytes are reported as ``time/weight_sync_s`` and
``rollout/weight_sync_bytes`` (``tools/bench/bench_weight_sync.py`` measures it for SmolLM2).
Single-process runs only: on several hosts the split would have to follow host boundaries,
which is not built.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh


class RolloutPlacement:
    """Puts the weights the sampler reads where it samples.

    Args:
      model_config: the policy's model config (its parameters' logical axes).
      devices: the rollout mesh's devices; empty = colocated (``put`` returns its input).
      tensor: the rollout mesh's tensor axis (must divide ``len(devices)``).
    """

    def __init__(self, model_config: Any, devices: list, *, tensor: int = 1):
        self.config = model_config
        self.mesh = None
        self.last_seconds, self.last_bytes = 0.0, 0
        self._shardings = None
        if devices:
            if tensor < 1 or len(devices) % tensor:
                raise ConfigError(
                    f"rollout.tensor={tensor} must divide rollout.devices={len(devices)}"
                )
            self.mesh = make_mesh(data=-1, tensor=tensor, devices=devices)

    @property
    def split(self) -> bool:
        """True when rollouts sample on devices of their own."""
        return self.mesh is not None

    def put(self, params: Any) -> Any:
        """``params`` laid out on the rollout mesh (a new copy; blocks until it is there, and
        records its seconds and bytes), or ``params`` itself when colocated."""
        if self.mesh is None:
            return params
        if self._shardings is None:
            axes = models.param_logical_axes(self.config)
            self._shardings = logical_to_sharding(axes, self.mesh, DEFAULT_RULES, shapes=params)
        t = time.perf_counter()
        out = jax.block_until_ready(jax.device_put(params, self._shardings))
        self.last_seconds = time.perf_counter() - t
        self.last_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
        return out

    def metrics(self) -> dict[str, float]:
        """The last copy's ``time/weight_sync_s`` and ``rollout/weight_sync_bytes`` ({} when
        colocated)."""
        if self.mesh is None:
            return {}
        return {
            "time/weight_sync_s": self.last_seconds,
            "rollout/weight_sync_bytes": float(self.last_bytes),
        }

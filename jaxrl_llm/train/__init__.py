"""Training: the train-state pytree and its sharded creation, the jitted sharded train step with
exact gradient accumulation, throughput metrics, orbax checkpoints, run configs, the shared run
loop and the offline and online trainers (the online one as rollout → experience → learner),
run logging and the memory estimator. Batches are batch-major ``[B, T]`` dicts (see
``jaxrl_llm.losses``); docs/ARCHITECTURE.md maps the modules."""

import sys
import types

from jaxrl_llm.train.api import build_config, check_run, run_training, train
from jaxrl_llm.train.compile.aot import compile_preset, compile_run
from jaxrl_llm.train.compile.aot_inputs import analytic_train_flops
from jaxrl_llm.train.compile.aot_report import CompileReport, ProgramMemory, Roofline
from jaxrl_llm.train.compile.hlo_cost import HloCost, hlo_cost
from jaxrl_llm.train.compile.memory import estimate_memory
from jaxrl_llm.train.config.config_io import load_config
from jaxrl_llm.train.config.plan import RunPlan, plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.offline.trainer import OfflineTrainer, train_offline
from jaxrl_llm.train.online.experience import Experience, ExperienceBuffer
from jaxrl_llm.train.online.learner import Learner
from jaxrl_llm.train.online.rollout import Rollouts
from jaxrl_llm.train.online.trainer import OnlineTrainer, train_online
from jaxrl_llm.train.programs.builder import Programs, build_programs
from jaxrl_llm.train.programs.policy import build_policy
from jaxrl_llm.train.programs.state import (
    TrainState,
    abstract_train_state,
    create_train_state,
    state_sharding_from_params,
)
from jaxrl_llm.train.programs.step import count_tokens, make_train_step, split_micro_batches
from jaxrl_llm.train.run.checkpoint import CheckpointManager, restore_model
from jaxrl_llm.train.run.logging import MetricsLogger
from jaxrl_llm.train.run.loop import RunLoop
from jaxrl_llm.train.run.throughput import measure_matmul_flops, mfu, timed_step
from jaxrl_llm.train.trainers import Trainer

__all__ = [
    "CheckpointManager",
    "CompileReport",
    "Experience",
    "ExperienceBuffer",
    "HloCost",
    "Learner",
    "MetricsLogger",
    "OfflineTrainer",
    "OnlineTrainer",
    "ProgramMemory",
    "Programs",
    "Rollouts",
    "Roofline",
    "RunConfig",
    "RunLoop",
    "RunPlan",
    "TrainState",
    "Trainer",
    "abstract_train_state",
    "build_config",
    "analytic_train_flops",
    "build_policy",
    "build_programs",
    "check_run",
    "compile_preset",
    "compile_run",
    "count_tokens",
    "create_train_state",
    "estimate_memory",
    "hlo_cost",
    "load_config",
    "make_train_step",
    "measure_matmul_flops",
    "mfu",
    "plan_run",
    "restore_model",
    "run_training",
    "split_micro_batches",
    "state_sharding_from_params",
    "timed_step",
    "train",
    "train_offline",
    "train_online",
]


class _CallableModule(types.ModuleType):
    """``jaxrl_llm.train`` is callable: ``jaxrl_llm.train(config, **overrides)`` is
    :func:`jaxrl_llm.train.api.train` (a YAML path, a dict or a ``RunConfig``)."""

    def __call__(self, config, /, **kwargs):
        return train(config, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

"""Training: the train-state pytree and its sharded creation, the jitted sharded train step with
exact gradient accumulation, throughput metrics, orbax checkpoints, run configs, the offline
and online trainers, run logging and the memory estimator. Batches are batch-major ``[B, T]``
dicts (see ``jaxrl_llm.losses``)."""

from jaxrl_llm.train.checkpoint import CheckpointManager
from jaxrl_llm.train.checkpoint import restore_model
from jaxrl_llm.train.config_io import load_config
from jaxrl_llm.train.logging import MetricsLogger
from jaxrl_llm.train.memory import estimate_memory
from jaxrl_llm.train.offline import OfflineTrainer
from jaxrl_llm.train.offline import train_offline
from jaxrl_llm.train.online import OnlineTrainer
from jaxrl_llm.train.online import train_online
from jaxrl_llm.train.run_config import RunConfig
from jaxrl_llm.train.setup import build_policy
from jaxrl_llm.train.state import TrainState
from jaxrl_llm.train.state import abstract_train_state
from jaxrl_llm.train.state import create_train_state
from jaxrl_llm.train.state import state_sharding_from_params
from jaxrl_llm.train.step import count_tokens
from jaxrl_llm.train.step import make_train_step
from jaxrl_llm.train.step import split_micro_batches
from jaxrl_llm.train.throughput import measure_matmul_flops
from jaxrl_llm.train.throughput import mfu
from jaxrl_llm.train.throughput import timed_step

__all__ = [
    "CheckpointManager",
    "MetricsLogger",
    "OfflineTrainer",
    "OnlineTrainer",
    "RunConfig",
    "TrainState",
    "abstract_train_state",
    "build_policy",
    "count_tokens",
    "create_train_state",
    "estimate_memory",
    "load_config",
    "make_train_step",
    "measure_matmul_flops",
    "mfu",
    "restore_model",
    "split_micro_batches",
    "state_sharding_from_params",
    "timed_step",
    "train_offline",
    "train_online",
]

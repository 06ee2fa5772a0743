"""Training building blocks: the train-state pytree and its sharded creation, the jitted
sharded train step with exact gradient accumulation, throughput metrics and orbax
checkpoints. Batches are batch-major ``[B, T]`` dicts (see ``jaxrl_llm.losses``)."""

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
    "TrainState",
    "abstract_train_state",
    "count_tokens",
    "create_train_state",
    "make_train_step",
    "measure_matmul_flops",
    "mfu",
    "split_micro_batches",
    "state_sharding_from_params",
    "timed_step",
]

"""jaxrl_llm: post-training language models with RL and preference optimisation, in JAX.

Conventions used across the package:

* Token data is batch-major ``[B, T]``. ``mask`` is ``[B, T]`` with 1 for a real token and
  0 for padding; it is always passed explicitly.
* Groups (G samples of one prompt) are consecutive rows of ``group_size``.
* Losses are minimised: ``loss = -objective``.

Layers (imports point up this list, never down): ops, objectives, models, interop, sampling,
rewards, losses, parallel, train, data, cli. ``docs/ARCHITECTURE.md`` in the repository maps the layers.

Training from Python (:mod:`jaxrl_llm.train.api`, the same code path as ``jaxrl-llm train``)::

    jaxrl_llm.train("configs/grpo.yaml", max_steps=50)
    jaxrl_llm.GRPOTrainer(model=..., reward_funcs=[fn], train_dataset=rows, args={...}).train()
    jaxrl_llm.GRPOTrainer(..., args=jaxrl_llm.GRPOConfig(output_dir=..., learning_rate=...))

The trainer classes load on first use, so ``import jaxrl_llm`` stays light.
"""

__version__ = "0.1.0"

#: The trainer classes, imported from :mod:`jaxrl_llm.train.trainers` on first use.
TRAINERS = (
    "Trainer",
    "GRPOTrainer",
    "PPOTrainer",
    "RLOOTrainer",
    "OnlineDPOTrainer",
    "SFTTrainer",
    "DPOTrainer",
    "KTOTrainer",
    "ORPOTrainer",
    "RewardTrainer",
)

#: The typed configs with TRL's names, imported from :mod:`jaxrl_llm.train.trl_config` on first
#: use (``GRPOConfig(learning_rate=..., num_generations=..., peft_config=LoraConfig(...))``).
CONFIGS = (
    "TrainingConfig",
    "GRPOConfig",
    "RLOOConfig",
    "OnlineDPOConfig",
    "SFTConfig",
    "DPOConfig",
    "KTOConfig",
    "ORPOConfig",
    "RewardConfig",
)
#: The trainers' hooks (:mod:`jaxrl_llm.train.api`).
HOOKS = ("Callback", "StepInfo")

__all__ = ["CONFIGS", "HOOKS", "TRAINERS", "__version__", *TRAINERS, *CONFIGS, *HOOKS]


def __getattr__(name: str):
    """The trainer classes (:data:`TRAINERS`, from :mod:`jaxrl_llm.train.trainers`), the typed
    configs (:data:`CONFIGS`), the hooks (:data:`HOOKS`) and the
    sub-packages (``jaxrl_llm.train(...)`` after a plain ``import jaxrl_llm``), on first use."""
    import importlib

    if name in TRAINERS:
        return getattr(importlib.import_module("jaxrl_llm.train.trainers"), name)
    if name in HOOKS:
        return getattr(importlib.import_module("jaxrl_llm.train.api"), name)
    if name in CONFIGS:
        return getattr(importlib.import_module("jaxrl_llm.train.trl_config"), name)
    try:
        return importlib.import_module(f"jaxrl_llm.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"jaxrl_llm.{name}":
            raise
    raise AttributeError(f"module 'jaxrl_llm' has no attribute {name!r}")

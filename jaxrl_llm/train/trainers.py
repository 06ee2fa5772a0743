"""The Python trainers in TRL's shape: ``jaxrl_llm.GRPOTrainer(model=..., reward_funcs=[...],
train_dataset=..., args=...).train()`` (:class:`Trainer` and one subclass per algorithm), with
:meth:`~Trainer.evaluate`, :meth:`~Trainer.save_model`, :attr:`~Trainer.model` and callbacks
(:class:`~jaxrl_llm.train.api.Callback`). They build their config and run it through the same
code as :func:`jaxrl_llm.train.api.train` and ``jaxrl-llm train`` (module docstring of
:mod:`jaxrl_llm.train.api`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.api import (
    Callback,
    StepInfo,
    build_config,
    check_loaded_step_memory,
    check_run,
    start_line,
    stopped_summary,
    write_run_outputs,
)
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.voting_eval import voting_online_trainer
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.output_dir import check_output_dir, jax_main_process, made_output_dir


class _Hook(Callback):
    """A function ``fn(StepInfo)`` run after every ``every`` steps (:meth:`Trainer.add_hook`)."""

    def __init__(self, fn: Callable[[StepInfo], Any], every: int):
        if every < 1:
            raise ConfigError(f"add_hook: every must be >= 1, got {every}")
        self.fn, self.every = fn, every

    def on_step_end(self, info: StepInfo) -> None:
        """Run the function."""
        self.fn(info)


class Trainer:
    """A run from Python in TRL's shape: ``Trainer(model=..., reward_funcs=[...],
    train_dataset=..., args=...).train()``; the algorithm is the class's (``GRPOTrainer``,
    ``DPOTrainer``, ...) or ``algorithm=``.

    Besides :meth:`train`: :meth:`evaluate`, :meth:`save_model` (a Hugging Face directory),
    :attr:`model` (the parameters) and callbacks (:class:`Callback`, :meth:`add_hook`). The
    model loads (and the programs compile) on first use of any of them.

    Args:
      model: ``model.source`` (an alias, HF directory, GGUF file, hub id, PEFT adapter, run
        directory), or a dict for the ``model`` section.
      reward_funcs: Python reward functions (or ``(fn, weight)``), any callable: a function
        imports back on a resume; a lambda, ``functools.partial`` or bound method is held in
        this process (a resume in a new process asks for it again).
      environment, train_dataset, eval_dataset: as :func:`train` takes them.
      args: the rest of the config: a typed config with TRL's names
        (:class:`~jaxrl_llm.train.trl_config.GRPOConfig`, ...), a dict, a YAML path or a
        ``RunConfig``; ``output_dir`` is required, and ``max_steps`` unless a typed config
        trains ``num_train_epochs`` over ``train_dataset`` (TRL's default).
      callbacks: :class:`Callback` objects.
      **overrides: config keys, as :func:`train` takes them.
    """

    algorithm: str | None = None

    def __init__(
        self,
        model: str | Mapping[str, Any] | None = None,
        *,
        reward_funcs: Iterable[Callable | tuple[Callable, float]] = (),
        environment: type | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        args: Any = None,
        algorithm: str | None = None,
        callbacks: Iterable[Callback] = (),
        **overrides: Any,
    ):
        from jaxrl_llm.train.trl_config import TrainingConfig, dataset_rows

        model, base = _trainer_arguments(type(self).__name__, model, args, algorithm)
        if isinstance(base, TrainingConfig):
            wanted = algorithm or self.algorithm
            if wanted and base.algorithm != wanted:
                raise ConfigError(
                    f"args: a {type(base).__name__} is for {base.algorithm}, this trainer runs "
                    f"{wanted}"
                )
            base = base.to_dict(num_rows=dataset_rows(train_dataset))
        if not isinstance(base, (str, RunConfig)):
            base = dict(base)
            base.setdefault("algorithm", algorithm or self.algorithm)
        if model is not None:
            overrides["model"] = {"source": model} if isinstance(model, str) else model
        self.config = build_config(
            base,
            reward_funcs=reward_funcs,
            environment=environment,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            **overrides,
        )
        self.plan = check_run(self.config)
        self.callbacks: list[Callback] = list(callbacks)
        self._loop: Any = None
        self.step = 0  # the last step trained

    def add_callback(self, callback: Callback) -> None:
        """Add a :class:`Callback` (TRL's name)."""
        self.callbacks.append(callback)

    def add_hook(self, fn: Callable[[StepInfo], Any], *, every: int = 1) -> None:
        """Run ``fn(StepInfo)`` after every ``every`` steps (levanter's ``add_hook``)."""
        self.callbacks.append(_Hook(fn, every))

    @property
    def loop(self) -> Any:
        """The run loop (:class:`~jaxrl_llm.train.online.trainer.OnlineTrainer` or the
        offline one), built on first use: the model loads and the programs compile."""
        if self._loop is None:
            if jax_main_process():
                print(start_line(self.config), file=sys.stderr, flush=True)
            with made_output_dir(self.config.output_dir):
                loop = _hooked_loop(self.config.is_online)(self.config, owner=self)
                try:
                    check_loaded_step_memory(loop)
                except BaseException:
                    loop.close()
                    raise
                self._loop = loop
        return self._loop

    @property
    def model(self) -> Any:
        """The policy's parameters (a pytree of arrays; LoRA adapters merged into the base)."""
        return self.loop.policy.full_params()

    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer."""
        return self.loop.policy.tokenizer

    _started = False  # train() was called
    _finished = False  # ... and ran to the end

    def train(self) -> dict:
        """Run to the end; the summary (held-out metrics before / after, timings), also
        written to ``output_dir/summary.json``. Called again after a stop (Ctrl-C, an error),
        it continues the run as ``--resume`` does; after a run that ended, it is refused (one
        line)."""
        if self._finished:
            raise ConfigError(
                f"{type(self).__name__}.train(): this trainer's run already ended "
                f"(max_steps={self.config.max_steps} in {self.config.output_dir!r}); to train "
                f"further, build a new trainer with args resume=True and a larger max_steps"
            )
        if self._started:  # the first call stopped: a fresh loop resumes its newest checkpoint
            self.config = dataclasses.replace(self.config, resume=True)
            self._loop = None
        self._started = True
        check_output_dir(self.config)  # again: another run may have written checkpoints since
        from jaxrl_llm.train.run.signals import RunStopped

        loop = self.loop
        try:
            summary = loop.run()
        except RunStopped as e:  # the steps it finished are logged: plots and a summary too
            write_run_outputs(self.config, stopped_summary(e, loop.start_step))
            raise
        finally:
            loop.close()
        summary["start_step"] = loop.start_step
        write_run_outputs(self.config, summary)
        self._finished = True
        return summary

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics now (``eval/...``; empty without ``eval_dataset`` / ``data.eval``);
        online runs add ``eval/maj@k`` and ``eval/samples-<step>.jsonl`` as ``eval`` asks."""
        return self.loop.evaluate()

    def save_model(self, output_dir: str | None = None) -> str:
        """Write the policy (LoRA adapters merged) as a Hugging Face directory, default
        ``output_dir/hf`` (``hf/`` of the local log directory when ``output_dir`` is a URI,
        :func:`~jaxrl_llm.train.run.paths.log_dir`); returns its path."""
        import jax

        from jaxrl_llm.interop import export_hf
        from jaxrl_llm.parallel import to_host

        policy = self.loop.policy
        run = self.config.output_dir
        out = output_dir or os.path.join(
            paths.log_dir(self.config) if paths.is_remote(run) else run, "hf"
        )
        params = jax.device_get(to_host(policy.full_params()))
        tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
        export_hf(out, config=policy.config, params=params, tokenizer=tok)
        return out

    # ----- what the run loop reports (the hooked loop calls these) ------------------------
    def _info(self, metrics: Mapping[str, Any]) -> StepInfo:
        return StepInfo(self.step, self.config.max_steps, dict(metrics), self)

    def _step_ended(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.step = step
        info = self._info(metrics)
        for cb in self.callbacks:
            if step % max(int(getattr(cb, "every", 1)), 1) == 0:
                cb.on_step_end(info)

    def _evaluated(self, metrics: Mapping[str, float]) -> None:
        info = self._info({})
        for cb in self.callbacks:
            cb.on_evaluate(info, metrics)

    def _saved(self, step: int) -> None:
        path = paths.join(paths.resolve(self.config.output_dir), "checkpoints", str(step))
        info = dataclasses.replace(self._info({}), step=step)
        for cb in self.callbacks:
            cb.on_save(info, path)


_HOOKED: dict[bool, type] = {}


def _hooked_loop(online: bool) -> type:
    """The online or offline run loop with :class:`Trainer`'s reports around its step,
    evaluation and save (a subclass, made on first use so that importing this module loads
    no JAX program)."""
    if online in _HOOKED:
        return _HOOKED[online]
    from jaxrl_llm.train.offline.trainer import OfflineTrainer

    Base: type = voting_online_trainer() if online else OfflineTrainer

    class Hooked(Base):  # type: ignore[valid-type,misc]
        def __init__(self, cfg: RunConfig, *, owner: Trainer):
            self.owner = owner
            self.saved: set[int] = set()
            super().__init__(cfg)

        def train_step(self, step: int) -> dict:
            metrics = super().train_step(step)
            self.owner._step_ended(step, metrics)
            return metrics

        def evaluate(self) -> dict[str, float]:
            metrics = super().evaluate()
            self.owner._evaluated(metrics)
            return metrics

        def save(self, step: int, *, force: bool = False, data: dict | None = None) -> None:
            super().save(step, force=force, data=data)
            if step not in self.saved:
                self.saved.add(step)
                if self.owner.callbacks:  # the write is asynchronous: on_save sees it done
                    self.ckpt.wait_until_finished()
                    self.owner._saved(step)

    Hooked.__name__ = Hooked.__qualname__ = f"Hooked{Base.__name__}"
    _HOOKED[online] = Hooked
    return Hooked


class GRPOTrainer(Trainer):
    """GRPO from Python (:class:`Trainer`; ``algorithm: grpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.GRPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "grpo"


class PPOTrainer(Trainer):
    """PPO with its critic from Python (:class:`Trainer`; ``algorithm: ppo``)."""

    algorithm = "ppo"


class RLOOTrainer(Trainer):
    """RLOO from Python (:class:`Trainer`; ``algorithm: rloo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.RLOOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "rloo"


class OnlineDPOTrainer(Trainer):
    """Online DPO from Python (:class:`Trainer`; ``algorithm: online_dpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.OnlineDPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "online_dpo"


class SFTTrainer(Trainer):
    """Supervised fine-tuning from Python (:class:`Trainer`; ``algorithm: sft``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.SFTConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "sft"


class DPOTrainer(Trainer):
    """DPO from Python (:class:`Trainer`; ``algorithm: dpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.DPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "dpo"


class KTOTrainer(Trainer):
    """KTO from Python (:class:`Trainer`; ``algorithm: kto``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.KTOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "kto"


class ORPOTrainer(Trainer):
    """ORPO from Python (:class:`Trainer`; ``algorithm: orpo``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.ORPOConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "orpo"


class RewardTrainer(Trainer):
    """A reward model (scalar head, preference pairs) from Python (:class:`Trainer`; ``algorithm: reward_model``).

    ``args``: a :class:`~jaxrl_llm.train.trl_config.RewardConfig` (TRL's names), a dict, a YAML
    path or a ``RunConfig``. Methods: ``train()``, ``evaluate()``, ``save_model(dir)``,
    ``.model``, callbacks (:class:`Callback`, ``add_hook``).
    """

    algorithm = "reward_model"


def _trainer_arguments(
    name: str, model: Any, args: Any, algorithm: Any
) -> tuple[str | dict | None, Any]:
    """A trainer class's ``model`` and ``args`` checked (one line each) and made plain:
    ``(model, base config)``."""
    if model is not None and not isinstance(model, (str, os.PathLike, Mapping)):
        raise ConfigError(
            f"{name}: model: expected a model source (an alias, a path, a hub id) or a dict for "
            f"the model section, got {type(model).__name__}"
        )
    from jaxrl_llm.train.trl_config import TrainingConfig

    if args is not None and not isinstance(
        args, (str, os.PathLike, Mapping, RunConfig, TrainingConfig)
    ):
        raise ConfigError(
            f"{name}: args: expected a dict, a YAML path, a RunConfig or a TrainingConfig, got "
            f"{type(args).__name__}"
        )
    if algorithm is not None and not isinstance(algorithm, str):
        raise ConfigError(f"{name}: algorithm: expected a string, got {type(algorithm).__name__}")
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    base = os.fspath(args) if isinstance(args, os.PathLike) else args
    return (dict(model) if isinstance(model, Mapping) else model), ({} if base is None else base)

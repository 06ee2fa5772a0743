"""The checks of the typed configs (:mod:`jaxrl_llm.train.trl_config`) at construction.

Every field's type and range is checked when a config is built, with the one-line
:class:`~jaxrl_llm.errors.ConfigError` a YAML config gets (``num_generations: expected an
integer >= 1, got 0``), so a misuse fails where it is written, not as a ``ZeroDivisionError``
steps later. A string is never taken for a flag (``bf16="false"`` is refused: it is truthy). A
keyword that TRL has and this package does not (``use_vllm``, ``fp16``, ``deepspeed``, ...) is
named as such, with what to do instead; any other unknown keyword gets the closest field's name.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean

_SAMPLING = "sampling runs in JAX on the training devices (extra={'rollout': {'engine': ...}})"
_STRATEGY = "steps are the only strategy here: eval_steps, save_steps, logging_steps"
_MESH = "parallelism is the run config's mesh and placement (extra={'mesh': {...}})"
_HUB = "save_model() writes a Hugging Face directory; upload it with huggingface_hub"
_DATA = "the trainer reads the dataset's columns itself (docs/data.md)"

#: Names TRL's configs (and transformers' ``TrainingArguments``) have that this package does
#: not, with what to do instead.
TRL_LACKS: dict[str, str] = {
    **dict.fromkeys(
        (
            "use_vllm",
            "vllm_mode",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_gpu_memory_utilization",
            "vllm_tensor_parallel_size",
            "generation_batch_size",
            "steps_per_generation",
        ),
        _SAMPLING,
    ),
    **dict.fromkeys(("eval_strategy", "save_strategy", "logging_strategy"), _STRATEGY),
    **dict.fromkeys(("deepspeed", "fsdp", "fsdp_config", "ddp_backend"), _MESH),
    **dict.fromkeys(("push_to_hub", "hub_model_id", "hub_token", "hub_strategy"), _HUB),
    **dict.fromkeys(
        ("dataloader_num_workers", "remove_unused_columns", "dataset_text_field", "label_names"),
        _DATA,
    ),
    "fp16": "float16 is not offered; bf16=True computes in bfloat16",
    "tf32": "no TF32 switch: XLA picks matmul precision (bf16=True for bfloat16)",
    "optim": "AdamW is the default; extra={'optim': {'name': 'adam' | 'sgd'}}",
    "lr_scheduler_kwargs": "extra={'optim': {...}} holds the schedule's settings",
    "gradient_checkpointing_kwargs": "gradient_checkpointing=True recomputes every layer",
    "logging_dir": "logs go to output_dir (or logging.dir in extra)",
    "loss_type": "the loss and its variants are extra={'loss': {...}} (docs/algorithms.md)",
    "reward_weights": "reward_funcs takes (function, weight) pairs",
    "use_liger_kernel": "XLA fuses the loss; there is no kernel switch",
}

# (check, words) of each field's range; a field not listed takes any value of its type.
_AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
_AT_LEAST_0 = (lambda v: v >= 0, ">= 0")
_ABOVE_0 = (lambda v: v > 0, "> 0")
_UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_steps": (lambda v: v >= 1 or v == -1, ">= 1 (or -1: num_train_epochs decides)"),
    "num_train_epochs": _ABOVE_0,
    "learning_rate": _ABOVE_0,
    "warmup_steps": _AT_LEAST_0,
    "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": _AT_LEAST_0,
    "adam_beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "adam_beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "adam_epsilon": _ABOVE_0,
    "max_grad_norm": _ABOVE_0,
    "per_device_train_batch_size": _AT_LEAST_1,
    "gradient_accumulation_steps": _AT_LEAST_1,
    "seed": _AT_LEAST_0,
    "logging_steps": _AT_LEAST_1,
    "save_steps": _AT_LEAST_0,
    "save_total_limit": _AT_LEAST_1,
    "eval_steps": _AT_LEAST_0,
    "num_generations": _AT_LEAST_1,
    "prompts_per_step": _AT_LEAST_1,
    "max_completion_length": _AT_LEAST_1,
    "max_prompt_length": _AT_LEAST_1,
    "temperature": _ABOVE_0,
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": _AT_LEAST_0,
    "min_p": _UNIT,
    "num_iterations": _AT_LEAST_1,
    "beta": _AT_LEAST_0,
    "epsilon": _ABOVE_0,
    "eval_num_samples": _AT_LEAST_0,
    "pass_at": _AT_LEAST_1,
    "maj_at": _AT_LEAST_1,
    "max_length": _AT_LEAST_1,
    "batch_size": _AT_LEAST_1,
}


def type_words(tp: Any) -> str:
    """How a message names type ``tp`` (as the YAML loader does: ``an integer``, ``true or
    false``, ``one of 'a', 'b'``, ``a list of an integer``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"a list of {type_words(typing.get_args(tp)[0])}"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp is type(None):
        return "None"
    if tp in (dict, Mapping) or origin in (dict, Mapping):
        return "a dict"
    return words.get(tp, getattr(tp, "__name__", str(tp)))


_NO = object()  # a value that does not have the type


def typed(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (an int for a float field, a tuple for a list), or ``_NO``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            got = None if a is type(None) and value is None else typed(value, a)
            if got is not _NO and (got is not None or value is None):
                return got
        return _NO
    if tp is type(None):
        return None if value is None else _NO
    if origin is typing.Literal:
        return value if value in typing.get_args(tp) else _NO
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return _NO
        items = [typed(v, typing.get_args(tp)[0]) for v in value]
        return _NO if _NO in items else (tuple(items) if origin is tuple else items)
    if tp in (dict, Mapping) or origin in (dict, Mapping):
        return dict(value) if isinstance(value, Mapping) else _NO
    if isinstance(value, bool):
        return value if tp is bool else _NO
    if tp is float and isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else _NO
    return value if isinstance(value, tp) else _NO


def check_fields(config: Any) -> None:
    """Check (and normalise: ints for float fields, tuples for lists) every field of a typed
    config in place.

    Raises:
      ConfigError: one line naming the config, the field, what it takes and the value.
    """
    name = type(config).__name__
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, tp = getattr(config, field.name), hints[field.name]
        got = typed(value, tp)
        check, words = RANGES.get(field.name, (lambda v: True, ""))
        items = got if isinstance(got, (list, tuple)) else [got]
        if got is _NO or not all(v is None or check(v) for v in items):
            union = typing.get_origin(tp) in (typing.Union, types.UnionType)
            args = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
            optional = union and len(args) < len(typing.get_args(tp))
            kind = " or ".join(type_words(a) for a in args)
            kind += (f" {words}" if words else "") + (" or None" if optional else "")
            raise ConfigError(f"{name}: {field.name}: expected {kind}, got {value!r}")
        object.__setattr__(config, field.name, got)


def checked_init(cls: type) -> type:
    """Wrap a typed config's ``__init__``: positional arguments, TRL names this package lacks,
    unknown and missing keywords are one-line :class:`ConfigError`s."""
    init = vars(cls)["__init__"]  # the dataclass's own
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        name = type(self).__name__
        if args:
            raise ConfigError(f"{name}: takes keyword arguments only (output_dir=..., ...)")
        for key in kwargs:
            if key in fields:
                continue
            if key in TRL_LACKS:
                raise ConfigError(
                    f"{name}: {key!r} is TRL's name for something this package does not "
                    f"have: {TRL_LACKS[key]}"
                )
            raise ConfigError(
                f"{name}: unknown argument {key!r}{did_you_mean(key, fields)}; the run "
                f"config's other keys go in extra={{'section': {{...}}}}"
            )
        missing = [k for k in required if k not in kwargs]
        if missing:
            raise ConfigError(f"{name}: missing {', '.join(missing)}")
        init(self, **kwargs)

    cls.__init__ = checked  # type: ignore[misc]
    return cls

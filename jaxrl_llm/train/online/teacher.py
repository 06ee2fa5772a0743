"""Loading the teacher of on-policy distillation (``teacher:``) and building what it reads.

* :func:`load_teacher` — ``teacher.source`` loaded as ``model.source`` is
  (:func:`~jaxrl_llm.train.programs.policy.load_policy_model`: HF directory, GGUF, PEFT adapter
  merged onto its base, alias, hub id, ``tiny``) or, for a jaxrl_llm run or checkpoint
  directory, its ``hf/`` export or newest checkpoint; refused with one line when its
  tokenizer is not the student's; placed on the learner's mesh
  (:func:`~jaxrl_llm.train.programs.teacher.teacher_on_mesh`).
* :func:`teacher_batch` — the teacher's rows: the student's, or (context distillation,
  ``teacher.system_prompt``) the teacher's own prompt, left-padded, followed by the same
  completion columns, so the completion's log-probs line up column for column.
* :func:`with_data_completions` — GKD's off-policy steps (``loss.lmbda`` < 1): the data rows'
  own completions in place of the samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.data import CharTokenizer, encode_completion, encode_prompt, is_conversational
from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.interop.peft import is_peft_adapter
from jaxrl_llm.parallel import free_memory
from jaxrl_llm.train.compile.memory_terms import params_per_device
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.experience import Experience
from jaxrl_llm.train.programs.policy import Policy, load_policy_model, tokenizer_size
from jaxrl_llm.train.programs.teacher import Teacher, teacher_on_mesh
from jaxrl_llm.train.run.checkpoint import restore_model

_RUN_EXPORT, _CHECKPOINTS = "hf", "checkpoints"


def _describe(tokenizer: Any) -> str:
    return f"{type(tokenizer).__name__} with {tokenizer_size(tokenizer)} tokens"


def same_tokenizer(a: Any, b: Any) -> bool:
    """True when two tokenizers map the same strings to the same ids: the same vocabulary
    (``get_vocab()``) when both have one, else the same class and size."""
    if a is b:
        return True
    va, vb = getattr(a, "get_vocab", None), getattr(b, "get_vocab", None)
    if va is not None and vb is not None:
        return va() == vb()
    return type(a) is type(b) and tokenizer_size(a) == tokenizer_size(b)


def check_teacher_tokenizer(cfg: RunConfig, teacher_tok: Any, student_tok: Any) -> None:
    """Raise :class:`ConfigError` (one line naming both) unless the teacher's tokenizer is the
    student's: the teacher scores the student's token ids."""
    assert cfg.teacher is not None
    if not same_tokenizer(teacher_tok, student_tok):
        raise ConfigError(
            f"teacher.source={cfg.teacher.source!r} has another tokenizer "
            f"({_describe(teacher_tok)}) than model.source={cfg.model.source!r} "
            f"({_describe(student_tok)}); on-policy distillation scores the student's token "
            f"ids with the teacher, so both must share one tokenizer"
        )


def _restore(cfg: RunConfig, root: Path) -> tuple[Any, Any, Any]:
    """A jaxrl_llm checkpoint's full weights (a LoRA run's adapters are refused: merge them
    with ``jaxrl-llm convert`` first, or point at the run's ``hf/`` export)."""
    assert cfg.teacher is not None
    config, params, tok = restore_model(str(root))
    if "embed" not in params:
        raise ConfigError(
            f"teacher.source={cfg.teacher.source!r}: a LoRA checkpoint holds adapters only; "
            f"export the run (jaxrl-llm convert RUN OUT) and point teacher.source at OUT"
        )
    if cfg.teacher.tokenizer == "char" or tok is None:
        tok = CharTokenizer() if cfg.teacher.tokenizer == "char" else None
    if tok is None:
        raise ConfigError(
            f"teacher.source={cfg.teacher.source!r}: the checkpoint saved no tokenizer; set "
            f"teacher.tokenizer: char (a char run) or use the run's hf/ export"
        )
    return config, params, tok


def load_teacher_model(cfg: RunConfig) -> tuple[Any, Any, Any]:
    """``(ModelConfig, params, tokenizer)`` of ``cfg.teacher`` (module docstring)."""
    t = cfg.teacher
    assert t is not None
    path = Path(t.source).expanduser()
    source = t.source
    if path.is_dir() and not (path / "config.json").is_file() and not is_peft_adapter(path):
        if (path / _RUN_EXPORT / "config.json").is_file():
            source = str(path / _RUN_EXPORT)  # a run directory's export
        elif (path / _CHECKPOINTS).is_dir():
            return _restore(cfg, path / _CHECKPOINTS)
        elif any(p.name.isdigit() for p in path.iterdir()) or path.name.isdigit():
            return _restore(cfg, path)
    model = dataclasses.replace(
        cfg.model,
        source=source,
        tokenizer=t.tokenizer,
        tiny=t.tiny,
        lora=None,
        param_dtype="float32",
        compute_dtype=t.dtype,
    )
    return load_policy_model(dataclasses.replace(cfg, model=model))


def load_teacher(cfg: RunConfig, policy: Policy, *, full_vocab: bool = False) -> Teacher:
    """The run's teacher on the policy's mesh, its tokenizer checked against the student's
    (``full_vocab``: its vocabulary size too, for GKD's full distributions).

    Raises:
      ConfigError: the tokenizers differ (one line naming both sources), a GKD teacher's
        vocabulary size differs from the student's (full-vocabulary distributions), or its
        weights do not fit the device (:func:`check_teacher_fits`).
    """
    t = cfg.teacher
    assert t is not None
    config, params, tok = load_teacher_model(cfg)
    check_teacher_tokenizer(cfg, tok, policy.tokenizer)
    if full_vocab and config.vocab_size != policy.config.vocab_size:
        raise ConfigError(
            f"teacher.source={t.source!r} has a vocabulary of {config.vocab_size} logits, "
            f"model.source={cfg.model.source!r} of {policy.config.vocab_size}; loss.kind=gkd "
            f"compares the full next-token distributions, so they must be as wide"
        )
    check_teacher_fits(cfg, config, policy.mesh)
    return teacher_on_mesh(
        config,
        policy.mesh,
        params=params,
        dtype=t.dtype,
        tokenizer=tok,
        system_prompt=t.system_prompt,
    )


def check_teacher_fits(cfg: RunConfig, config: Any, mesh: Any) -> None:
    """Refuse, before its weights are placed, a teacher whose weights alone do not fit the
    memory the learner's first device has left (an accelerator's free HBM; on the CPU this
    machine's available memory): the weights are split as the policy's, over
    fsdp × context × tensor (experts over expert too).

    Raises:
      ConfigError: one line with the teacher's size, its share per device and what is free.
    """
    t = cfg.teacher
    assert t is not None
    axes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    shards = axes.get("fsdp", 1) * axes.get("context", 1) * axes.get("tensor", 1)
    per_device = params_per_device(config, weight_shards=shards, expert=axes.get("expert", 1))
    need = per_device * np.dtype(t.dtype).itemsize
    free = free_memory(mesh.devices.flat[0])
    if need > free:
        gib = 2**30
        raise ConfigError(
            f"teacher.source={t.source!r}: {config.num_params() / 1e9:.2f}B parameters in "
            f"{t.dtype} need {need / gib:.2f} GiB per device (split {shards} ways), more than "
            f"the {free / gib:.2f} GiB free there; use teacher.dtype: bfloat16, a larger "
            f"mesh.fsdp, or a smaller teacher"
        )


def with_system_prompt(prompt: Any, system_prompt: str) -> Any:
    """The teacher's view of a data row's prompt: a system message first (merged into an
    existing one) for a conversation, ``system_prompt`` and a blank line before a text."""
    if is_conversational(prompt):
        msgs = [dict(m) for m in prompt]
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = f"{system_prompt}\n\n{msgs[0]['content']}"
            return tuple(msgs)
        return ({"role": "system", "content": system_prompt}, *msgs)
    return f"{system_prompt}\n\n{prompt}"


def teacher_batch(
    batch: dict[str, np.ndarray],
    *,
    sources: list[Any] | None,
    completion_len: int,
    tokenizer: Any,
    system_prompt: str | None,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """The teacher's ``input_ids`` / ``attention_mask`` / ``loss_mask`` of a learner batch.

    Without ``system_prompt`` the student's rows. With it, each row's prompt (``sources``:
    the data rows' prompts) is re-encoded with :func:`with_system_prompt`, left-padded to the
    widest, and followed by the batch's last ``completion_len`` columns (the completion,
    its attention and loss masks), so column j of the completion is the same token in both.
    """
    keys = ("input_ids", "attention_mask", "loss_mask")
    if system_prompt is None:
        return {k: batch[k] for k in keys}
    if sources is None:
        raise ConfigError("teacher.system_prompt needs the rollout's prompts (a single-turn run)")
    prompts = [encode_prompt(tokenizer, with_system_prompt(s, system_prompt)) for s in sources]
    n, m = len(prompts), completion_len
    width = max(len(p) for p in prompts)
    ids = np.full((n, width), pad_id, np.int32)
    attn = np.zeros((n, width), np.int32)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        attn[i, width - len(p) :] = 1
    return {
        "input_ids": np.concatenate([ids, batch["input_ids"][:, -m:]], 1).astype(np.int32),
        "attention_mask": np.concatenate([attn, batch["attention_mask"][:, -m:]], 1).astype(
            np.int32
        ),
        "loss_mask": np.concatenate([np.zeros_like(attn), batch["loss_mask"][:, -m:]], 1).astype(
            np.int32
        ),
    }


COMPLETION_KEY = "completion"


def _completion_text(value: Any) -> str:
    """A data row's completion as text: a string, or the content of its (last) message."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[-1], Mapping):
        return str(value[-1].get("content", ""))
    raise DataError(
        f"{COMPLETION_KEY!r}: GKD's data steps (loss.lmbda < 1) take a text or a list of "
        f"messages, got {type(value).__name__}"
    )


def with_data_completions(exp: Experience, tokenizer: Any) -> Experience:
    """``exp`` with every row's completion replaced by its data row's ``completion`` (GKD's
    steps on the data set's outputs): encoded with EOS, cut to the rollout's M columns
    (``truncated`` then), right-padded; behaviour log-probs 0 (not sampled). The prompts,
    groups and rewards (of the samples) stay.

    Raises:
      DataError: a row without a ``completion`` field (one line naming it).
    """
    ro = exp.rollout
    n, m = np.shape(ro.tokens)
    tokens = np.zeros((n, m), np.int32)
    mask = np.zeros((n, m), np.int32)
    lengths = np.zeros(n, np.int32)
    truncated = np.zeros(n, bool)
    for i, extras in enumerate(exp.extras):
        if COMPLETION_KEY not in extras:
            raise DataError(
                f"loss.lmbda < 1 trains some steps on the data rows' {COMPLETION_KEY!r}, but a "
                f"training row has none (fields: {sorted(extras)}); add it or set loss.lmbda: 1"
            )
        ids = encode_completion(tokenizer, _completion_text(extras[COMPLETION_KEY]))
        truncated[i] = len(ids) > m
        ids = ids[:m]
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = 1
        lengths[i] = len(ids)
    host: Any = ro  # host numpy arrays
    rollout = host._replace(
        tokens=tokens,
        mask=mask,
        lengths=lengths,
        truncated=truncated,
        logprobs=np.zeros((n, m), np.float32),
    )
    return dataclasses.replace(exp, rollout=rollout, context_mask=None, token_version=None)

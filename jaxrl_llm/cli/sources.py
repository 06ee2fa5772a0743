"""What ``generate`` and ``convert`` were pointed at: a run directory, a checkpoint directory,
a Hugging Face directory, a PEFT adapter, a GGUF file or an alias, and how to load each.

A run directory (``jaxrl-llm train``'s ``output_dir``) holds ``config.yaml`` and
``checkpoints/<step>/``; a checkpoint directory is ``checkpoints/`` itself or one step of it.
A LoRA run's checkpoints hold only the adapters: the base comes from the run's
``config.yaml`` (``model.source``, ``model.lora``), which sits next to ``checkpoints/``, and
the adapters are merged into it (:func:`jaxrl_llm.models.lora.merge_lora`).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from jaxrl_llm.errors import CheckpointError, ModelLoadError

RUN_CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
HF_EXPORT = "hf"
# Names found at the top of an orbax checkpoint root or step.
_CHECKPOINT_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "params", "model_config", "meta")


class SourceKind(str, enum.Enum):
    """The kinds of model source ``generate`` and ``convert`` accept."""

    RUN = "run directory"
    CHECKPOINT = "checkpoint directory"
    HF = "Hugging Face directory"
    ADAPTER = "PEFT adapter directory"
    GGUF = "GGUF file"
    ALIAS = "model alias"
    HUB = "Hugging Face hub id"
    OTHER = "model source"


class Source(NamedTuple):
    """A classified model source.

    Attributes:
      kind: the :class:`SourceKind`.
      path: what to load: the checkpoint root or step for a run or checkpoint, else the
        source as given.
      run_dir: the run directory holding ``config.yaml`` (None when there is none).
      hf_export: a run directory's ``hf/`` export, when it has one.
    """

    kind: SourceKind
    path: str
    run_dir: Path | None = None
    hf_export: Path | None = None


def _step_dirs(root: Path) -> list[int]:
    """Finalised step numbers under a checkpoint root (orbax renames a step's temporary
    directory to its bare number only once every item is written)."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def _is_checkpoint_root(path: Path) -> bool:
    return path.is_dir() and bool(_step_dirs(path))


def _is_checkpoint_step(path: Path) -> bool:
    return (
        path.is_dir()
        and path.name.isdigit()
        and any((path / m).exists() for m in _CHECKPOINT_MARKERS)
    )


def classify_source(src: str | os.PathLike) -> Source:
    """Say what ``src`` is (see the module docstring); nothing is loaded.

    A directory holding ``config.yaml`` or ``checkpoints/`` is a run directory; one with
    step folders (``2/``, ``40/``) or a step folder itself is a checkpoint directory; one with
    ``config.json`` is a Hugging Face directory; one with ``adapter_config.json`` a PEFT
    adapter. Anything else is passed on to :func:`jaxrl_llm.interop.load_model` as is.
    """
    from jaxrl_llm.interop import MODEL_ALIASES, is_hub_id
    from jaxrl_llm.interop.peft import is_peft_adapter

    text = os.fspath(src)
    if text in MODEL_ALIASES:
        return Source(SourceKind.ALIAS, text)
    if is_hub_id(text):
        return Source(SourceKind.HUB, text)
    p = Path(text).expanduser()
    if p.is_file():
        return Source(SourceKind.GGUF if p.suffix == ".gguf" else SourceKind.OTHER, text)
    if not p.is_dir():
        return Source(SourceKind.OTHER, text)
    if is_peft_adapter(p):
        return Source(SourceKind.ADAPTER, text)
    if (p / "config.json").is_file():
        return Source(SourceKind.HF, text)
    if (p / RUN_CONFIG).is_file() or (p / CHECKPOINTS).is_dir():
        export = p / HF_EXPORT
        return Source(
            SourceKind.RUN,
            str(p / CHECKPOINTS),
            run_dir=p,
            hf_export=export if (export / "config.json").is_file() else None,
        )
    if _is_checkpoint_root(p) or _is_checkpoint_step(p):
        root = p.parent if _is_checkpoint_step(p) else p
        run = root.parent if (root.parent / RUN_CONFIG).is_file() else None
        return Source(SourceKind.CHECKPOINT, text, run_dir=run)
    return Source(SourceKind.OTHER, text)


class RestoredModel(NamedTuple):
    """A model restored from a training checkpoint.

    Attributes:
      config, params, tokenizer: as :class:`jaxrl_llm.interop.LoadedModel` (params merged
        when the run trained LoRA; tokenizer None when the run saved none).
      step: the checkpoint step read (None when the path named no step and none was listed).
      lora: the run's :class:`~jaxrl_llm.models.lora.LoRAConfig`, None for full weights.
      adapters: the LoRA adapter tree (None for full weights).
      base_source: the run's ``model.source`` (the base the adapters apply to).
    """

    config: Any
    params: Any
    tokenizer: Any
    step: int | None
    lora: Any = None
    adapters: Any = None
    base_source: str | None = None


def is_lora_tree(params: Any) -> bool:
    """True for an adapter tree ``{"layers": {name: {"a", "b"}}}`` (what a LoRA run's
    checkpoint holds) rather than a full parameter tree."""
    if not isinstance(params, Mapping) or "embed" in params:
        return False
    layers = params.get("layers")
    return (
        isinstance(layers, Mapping)
        and bool(layers)
        and all(isinstance(v, Mapping) and set(v) == {"a", "b"} for v in layers.values())
    )


def _run_config(run_dir: Path | None, where: str):
    """The run's :class:`~jaxrl_llm.train.RunConfig` from ``run_dir/config.yaml``."""
    from jaxrl_llm.train import RunConfig, load_config

    if run_dir is None or not (run_dir / RUN_CONFIG).is_file():
        raise CheckpointError(
            f"{where}: holds LoRA adapters only; the base model and LoRA settings are read "
            f"from the run's {RUN_CONFIG}, expected next to the checkpoints folder (pass the "
            f"run directory, or the checkpoints folder inside it)"
        )
    return load_config(RunConfig, str(run_dir / RUN_CONFIG))


def restore_checkpoint(source: Source) -> RestoredModel:
    """Restore the model of a run or checkpoint directory, merging a LoRA run's adapters
    into its base (``model.source`` of the run's ``config.yaml``, loaded as training does).

    Raises:
      CheckpointError: no finalised checkpoint (naming where it looked), a LoRA checkpoint
        without its run's ``config.yaml``, or a base that does not match the adapters.
    """
    from jaxrl_llm.train import restore_model

    path = Path(source.path)
    root = path.parent if _is_checkpoint_step(path) else path
    steps = _step_dirs(root)
    if not steps:
        raise CheckpointError(f"{root}: no finalised checkpoint (no step folders such as 2/)")
    step = int(path.name) if _is_checkpoint_step(path) else steps[-1]
    config, params, tokenizer = restore_model(str(path))
    if not is_lora_tree(params):
        if tokenizer is None and source.run_dir is not None:
            tokenizer = _char_tokenizer_of(source.run_dir)
        return RestoredModel(config, params, tokenizer, step)
    return _merge_run_adapters(source, config, params, tokenizer, step)


def _char_tokenizer_of(run_dir: Path) -> Any:
    """The byte-level test tokenizer when the run trained with ``model.tokenizer: char`` (a
    checkpoint saves no tokenizer files for it), else None."""
    from jaxrl_llm.data import CharTokenizer
    from jaxrl_llm.errors import ConfigError

    if not (run_dir / RUN_CONFIG).is_file():
        return None
    try:
        cfg = _run_config(run_dir, str(run_dir))
    except ConfigError:  # a config of another version: no tokenizer rather than no model
        return None
    return CharTokenizer() if cfg.model.tokenizer == "char" else None


def _merge_run_adapters(source: Source, config, adapters, tokenizer, step) -> RestoredModel:
    """:class:`RestoredModel` of a LoRA checkpoint: the base loaded as the run loaded it,
    the adapters merged."""
    import jax

    from jaxrl_llm.models.lora import LoRAConfig, merge_lora
    from jaxrl_llm.train.programs.policy import load_policy_model

    cfg = _run_config(source.run_dir, source.path)
    lc = cfg.model.lora
    if lc is None:
        raise CheckpointError(
            f"{source.path}: holds LoRA adapters, but {source.run_dir}/{RUN_CONFIG} has "
            f"model.lora=null; the checkpoint does not belong to this run"
        )
    lora = LoRAConfig(rank=lc.rank, alpha=lc.alpha, targets=lc.targets)
    base_config, base_params, base_tok = load_policy_model(cfg)
    shapes = lambda c: (c.num_layers, c.hidden_size, c.vocab_size, c.intermediate_size)  # noqa: E731
    if shapes(base_config) != shapes(config):
        raise CheckpointError(
            f"{source.path}: the run's base model.source={cfg.model.source!r} has (layers, "
            f"hidden, vocab, mlp) {shapes(base_config)}, the checkpoint {shapes(config)}"
        )
    host = jax.tree.map(lambda x: jax.device_get(x), adapters)
    merged = jax.device_get(merge_lora(base_params, host, lora))
    return RestoredModel(
        config,
        merged,
        tokenizer if tokenizer is not None else base_tok,
        step,
        lora=lora,
        adapters=host,
        base_source=cfg.model.source,
    )


def describe(source: Source, restored: RestoredModel | None = None, *, merged: bool = True) -> str:
    """One line saying what was found, e.g. ``run directory runs/x: checkpoint step 40
    (LoRA r=8 adapters merged into smollm2-135m-instruct)``.

    ``merged=False`` (``convert --adapter-only``, which writes the adapters as they are) says
    ``LoRA r=8 adapters on smollm2-135m-instruct`` instead."""
    if source.kind in (SourceKind.RUN, SourceKind.CHECKPOINT) and restored is not None:
        name = source.run_dir if source.kind == SourceKind.RUN else source.path
        what = f"{source.kind.value} {name}: checkpoint step {restored.step}"
        if restored.lora is not None:
            how = "merged into" if merged else "on"
            what += f" (LoRA r={restored.lora.rank} adapters {how} {restored.base_source})"
        return what
    if source.kind == SourceKind.RUN:
        return f"{source.kind.value} {source.run_dir}: its {HF_EXPORT}/ export"
    return f"{source.kind.value} {source.path}"


def load_any(source: Source, *, prefer_export: bool) -> tuple[Any, Any, Any, RestoredModel | None]:
    """``(config, params, tokenizer, restored)`` of a classified source.

    A run directory loads its ``hf/`` export when ``prefer_export`` and it has one, else its
    newest checkpoint; a checkpoint directory its checkpoint; anything else goes through
    :func:`jaxrl_llm.interop.load_model`. ``restored`` is set when a checkpoint was read.

    Raises:
      ModelLoadError / CheckpointError: one line naming the source.
    """
    from jaxrl_llm.interop import load_model

    if source.kind == SourceKind.RUN:
        if prefer_export and source.hf_export is not None:
            m = load_model(source.hf_export, param_dtype="float32")
            return m.config, m.params, m.tokenizer, None
        if not _step_dirs(Path(source.path)):
            raise CheckpointError(
                f"{source.run_dir}: a run directory with no finalised checkpoint under "
                f"{CHECKPOINTS}/ and no {HF_EXPORT}/ export; train it with "
                f"checkpoint.save_every, or export a checkpoint with `jaxrl-llm convert "
                f"RUN/{CHECKPOINTS} OUT`"
            )
    if source.kind in (SourceKind.RUN, SourceKind.CHECKPOINT):
        r = restore_checkpoint(source)
        return r.config, r.params, r.tokenizer, r
    if source.kind == SourceKind.OTHER and Path(source.path).is_dir():
        raise ModelLoadError(
            f"{source.path}: not a model: no config.json (Hugging Face directory), "
            f"adapter_config.json (PEFT adapter), {RUN_CONFIG} / {CHECKPOINTS}/ (run "
            f"directory) or step folders (checkpoint directory)"
        )
    m = load_model(source.path, param_dtype="float32")
    return m.config, m.params, m.tokenizer, None

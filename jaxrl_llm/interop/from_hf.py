"""A transformers model in memory as ours: its config and state dict become a
:class:`LoadedModel` (:func:`from_hf_model`); what every loader ends with
(:func:`loaded_model`), and the quiet context they read transformers files in. The loaders
of files and names are :mod:`~jaxrl_llm.interop.load` and :mod:`~jaxrl_llm.interop.gguf`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.interop.hf_config import config_from_hf_dict
from jaxrl_llm.interop.state_dict import params_from_hf_state_dict
from jaxrl_llm.models.config import ModelConfig, dtype_from_name


class LoadedModel(NamedTuple):
    """A model ready to run: ``(config, params, tokenizer)``.

    Attributes:
      config: the :class:`~jaxrl_llm.models.ModelConfig`.
      params: the params tree (jax arrays in ``config.param_dtype``).
      tokenizer: a transformers tokenizer with its chat template, or None when the source
        has no tokenizer files.
    """

    config: ModelConfig
    params: dict[str, Any]
    tokenizer: Any


def to_jax(params: Any, dtype) -> Any:
    """``params`` (numpy / jax leaves) as jax arrays of ``dtype``."""
    import jax

    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x), dtype=dtype), params)


def loaded_model(
    config: ModelConfig,
    sd: dict[str, Any],
    tokenizer: Any,
    *,
    source: str,
    param_dtype: str,
    compute_dtype: str | None,
) -> LoadedModel:
    """The :class:`LoadedModel` of a transformers config (already ours) and state dict, in
    ``param_dtype`` / ``compute_dtype`` (default ``param_dtype``)."""
    dtype_from_name(param_dtype)
    config = dataclasses.replace(
        config, param_dtype=param_dtype, compute_dtype=compute_dtype or param_dtype
    )
    params = params_from_hf_state_dict(sd, config, source=source)
    return LoadedModel(config, to_jax(params, config.param_jnp_dtype), tokenizer)


def quiet_transformers():
    """Silence transformers' progress bars / info logs for one call."""
    stack = contextlib.ExitStack()
    try:
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        stack.callback(hf_logging.set_verbosity, level)
        if hasattr(hf_logging, "disable_progress_bar"):
            hf_logging.disable_progress_bar()
            stack.callback(hf_logging.enable_progress_bar)
    except ImportError:  # pragma: no cover
        pass
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def from_hf_model(
    model: Any,
    tokenizer: Any = None,
    *,
    param_dtype: str = "float32",
    compute_dtype: str | None = None,
) -> LoadedModel:
    """Convert an in-memory transformers ``PreTrainedModel`` (Llama / Mistral / Qwen2 / Qwen3 /
    Gemma / Qwen3-MoE / Mixtral, causal LM or sequence classifier with one label).

    Args:
      model: the transformers model (its ``config`` and ``state_dict()`` are read).
      tokenizer: returned as is.
      param_dtype, compute_dtype: as in :func:`load_model`.

    Returns:
      A :class:`LoadedModel`.

    Raises:
      ModelLoadError: unsupported architecture or a weight mismatch.
    """
    name = type(model).__name__
    hf_cfg = model.config.to_dict()
    if not hf_cfg.get("architectures"):  # models built with from_config carry none
        hf_cfg["architectures"] = [name]
    config = config_from_hf_dict(hf_cfg, source=name)
    return loaded_model(
        config,
        model.state_dict(),
        tokenizer,
        source=name,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
    )

"""The model a server serves: loaded once by ``jaxrl-llm serve`` and shared by every protocol."""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxrl_llm.models import ModelConfig


class ServedModel(NamedTuple):
    """The base model behind every route of a server.

    Args:
      name: the name clients use for it (``--model-name``, else the ``--model`` argument).
      config: its :class:`jaxrl_llm.models.ModelConfig`.
      params: its weights (float32 unless the server was asked for another dtype); frozen:
        tenants train adapters over them, never the weights themselves.
      tokenizer: its tokenizer (None for a model that has none, e.g. ``tiny``).
      source: what ``--model`` was, as the user wrote it (a tokenizer path clients can load).
    """

    name: str
    config: ModelConfig
    params: Any
    tokenizer: Any
    source: str

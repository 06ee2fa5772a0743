"""The policy's model as ``model.source`` names it: its :class:`~jaxrl_llm.models.ModelConfig`,
weights and tokenizer (a tiny random model with the char tokenizer, or a checkpoint through
:func:`jaxrl_llm.interop.load_model`), with the tokenizer checked against the model's
vocabulary. :mod:`jaxrl_llm.train.programs.policy` places what this loads on the mesh.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError, ModelLoadError
from jaxrl_llm.train.config.run_config import RunConfig


def load_policy_model(cfg: RunConfig):
    """(ModelConfig, params as numpy/jax arrays, tokenizer) for ``cfg.model``."""
    m = cfg.model
    if m.source == "tiny":
        config, params, tok = tiny_model(
            m.tiny, seed=cfg.seed, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype
        )
        return config.replace(attention=models.AttentionImpl(m.attention)), params, tok
    from jaxrl_llm.interop import load_model

    loaded = load_model(m.source, param_dtype="float32", compute_dtype=m.compute_dtype)
    tok = loaded.tokenizer
    if m.tokenizer == "char":
        from jaxrl_llm.data import CharTokenizer

        tok = CharTokenizer()
        if loaded.config.vocab_size > tok.vocab_size:  # it would sample ids char cannot decode
            raise ConfigError(
                f"model.tokenizer=char with model.source={m.source!r}: the char tokenizer "
                f"decodes {tok.vocab_size} ids, the model samples from "
                f"{loaded.config.vocab_size}; use the model's own tokenizer (model.tokenizer: "
                f"auto)"
            )
    if tok is None:
        raise ConfigError(f"model.source={m.source!r} has no tokenizer; set model.tokenizer")
    check_vocab(
        loaded.config,
        tok,
        source=f"model.source={m.source!r}",
        tokenizer_name=f"model.tokenizer={m.tokenizer}",
    )
    return (
        loaded.config.replace(attention=models.AttentionImpl(m.attention)),
        loaded.params,
        tok,
    )


def tiny_model(
    tiny: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    param_dtype: str = "float32",
    compute_dtype: str = "float32",
):
    """``(config, params, CharTokenizer)`` of ``model.source: tiny``: a small random model
    (:meth:`jaxrl_llm.models.ModelConfig.tiny`, ``tiny`` overriding its fields) keyed by
    ``seed``, with the char tokenizer; what a config's ``tiny`` and ``jaxrl-llm serve --model
    tiny`` load.

    Raises:
      ConfigError: an unknown ``tiny`` key, a value the config refuses, or a vocabulary
        smaller than the char tokenizer's.
    """
    from jaxrl_llm.data import CharTokenizer

    tok = CharTokenizer()
    overrides: dict[str, Any] = dict(
        vocab_size=tok.vocab_size,
        eos_token_ids=(tok.eos_token_id,),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
    )
    allowed = models.known_keys()
    unknown = sorted(set(tiny or {}) - set(allowed))
    if unknown:
        raise ConfigError(f"model.tiny: unknown key(s) {unknown}; allowed: {allowed}")
    overrides.update(tiny or {})
    try:
        config = models.ModelConfig.tiny(**overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model.tiny: {e}") from None
    check_vocab(
        config,
        tok,
        source="model.source=tiny",
        tokenizer_name="model.tokenizer=char",
        fix="set model.tiny.vocab_size >= that (or leave it out)",
    )
    return config, models.init_params(config, jax.random.PRNGKey(seed)), tok


def tokenizer_size(tokenizer) -> int | None:
    """How many token ids ``tokenizer`` can produce (``len()`` of a transformers tokenizer,
    which counts added tokens; ``vocab_size`` otherwise), or None when it does not say."""
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return None if size is None else int(size)


def check_vocab(
    config: models.ModelConfig,
    tokenizer,
    *,
    source: str,
    tokenizer_name: str = "its tokenizer",
    fix: str = "use the tokenizer that belongs to this model",
) -> None:
    """A tokenizer must not produce ids the model's embedding table does not have (a gather
    past the table is clamped silently on accelerators, so the run would train on garbage)."""
    n = tokenizer_size(tokenizer)
    if n is not None and n > config.vocab_size:
        raise ModelLoadError(
            f"{source}: {tokenizer_name} has {n} tokens but the model's "
            f"vocabulary has {config.vocab_size} (vocab_size); {fix}"
        )

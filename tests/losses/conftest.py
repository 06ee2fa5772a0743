"""Fixtures for tests/losses: one tiny model shared by the whole folder."""

import functools

import jax
import pytest

from jaxrl_llm import models


@pytest.fixture(scope="session")
def lm():
    """(model_config, params, apply_fn) of a tiny Llama LM with a scalar head too."""
    cfg = models.ModelConfig.tiny(num_labels=1)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    return cfg, params, functools.partial(models.apply, config=cfg)

"""Fixtures for the objectives tests: run a pure function jitted and not."""

import functools

import jax
import pytest


@pytest.fixture(params=["eager", "jit"])
def run(request):
    """``run(fn, *arrays, **static_kwargs)``: call eagerly or under ``jax.jit``."""

    def call(fn, *args, **kwargs):
        if request.param == "jit":
            return jax.jit(functools.partial(fn, **kwargs))(*args)
        return fn(*args, **kwargs)

    return call

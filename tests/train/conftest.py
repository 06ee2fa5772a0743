"""The train tests' children (tests/train/harness.py) share the session's compilation cache."""

import pytest

from tests.train import harness


@pytest.fixture(autouse=True)
def _children_share_compiled_programs(jax_cache_dir):
    """A job's processes compile the same programs, and so do the runs a test compares."""
    harness.CHILD_CACHE[:] = [jax_cache_dir]

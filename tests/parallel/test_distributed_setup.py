"""The set-up part of ``parallel/distributed.py``: the coordinator address is checked in Python
before JAX's native service sees it (``localhost:notaport`` segfaulted it). The faults of a
real job start-up: ``tests/train/test_multihost_faults.py``."""

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.distributed import coordinator_host_port


@pytest.mark.parametrize(
    "address, want",
    [("10.0.0.2:8476", ("10.0.0.2", 8476)), ("[::1]:99", ("::1", 99)), ("h:1", ("h", 1))],
)
def test_coordinator_address(address, want):
    assert coordinator_host_port(address) == want


@pytest.mark.parametrize("address", ["localhost:notaport", "localhost", ":80", "h:0", "h:70000"])
def test_coordinator_address_refused(address):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        coordinator_host_port(address)

"""One chip table (issue 51): the memory estimator, the decode model, the TPU topologies and
device detection all read :data:`jaxrl_llm.parallel.chips.CHIPS`."""

import types

from jaxrl_llm.parallel.chips import CHIPS, GiB, chip_kind
from jaxrl_llm.parallel.decode_model import device_chip, kind_chip
from jaxrl_llm.parallel.topology import TPU_HBM_BYTES, TPU_ICI_BANDWIDTH
from jaxrl_llm.train.compile.memory_presets import DEVICE_MEMORY


def test_the_memory_estimator_and_the_decode_model_agree_on_every_chip():
    for kind in CHIPS:
        assert kind_chip(kind).hbm_bytes == DEVICE_MEMORY[kind]
    # the H100 was 80e9 B in the decode model and 80 GiB in the estimator: binary, as the
    # device reports (chips.py's docstring)
    assert DEVICE_MEMORY["h100"] == 80 * GiB and kind_chip("h200").hbm_bytes == 141 * GiB
    assert kind_chip("cpu") is None


def test_the_tpu_topology_tables_are_read_from_the_chip_table():
    assert TPU_HBM_BYTES == {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}
    assert (
        TPU_ICI_BANDWIDTH["v4"] is None
        and TPU_ICI_BANDWIDTH["v5p"] == CHIPS["tpu-v5p"].link_bandwidth
    )


def test_device_kinds_name_their_chip():
    assert chip_kind("TPU v5 lite") == "tpu-v5e" and chip_kind("TPU v5") == "tpu-v5p"
    assert chip_kind("TPU v5p") == "tpu-v5p" and chip_kind("TPU v6 lite") == "tpu-v6e"
    assert chip_kind("NVIDIA H200") == "h200" and chip_kind("NVIDIA A100-SXM4-80GB") == "a100"
    assert chip_kind("Tesla T4") is None and chip_kind("cpu") is None


def test_a_real_device_gets_its_chip_and_a_cpu_none():
    gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    assert device_chip(gpu).hbm_bytes == 80 * GiB and device_chip(gpu).link_bandwidth == 900e9
    tpu = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    assert device_chip(tpu).hbm_bandwidth == CHIPS["tpu-v5e"].hbm_bandwidth
    assert device_chip(types.SimpleNamespace(platform="cpu", device_kind="cpu")) is None
    # a GPU whose name happens to hold a TPU substring is not taken for a TPU
    assert device_chip(types.SimpleNamespace(platform="gpu", device_kind="Tesla V4")) is None

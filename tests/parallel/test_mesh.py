import jax
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import MESH_AXES, make_mesh, mesh_shape


def test_mesh_over_all_devices_with_named_axes():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert mesh.axis_names == MESH_AXES == ("data", "fsdp", "expert", "context", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "context": 1, "tensor": 2}
    assert set(mesh.devices.flat) == set(jax.devices())


@pytest.mark.parametrize(
    "kw,expected",
    [
        (dict(), (8, 1, 1, 1, 1)),
        (dict(data=2, fsdp=-1), (2, 4, 1, 1, 1)),
        (dict(data=1, fsdp=2, tensor=-1), (1, 2, 1, 1, 4)),
        (dict(data=-1, tensor=4), (2, 1, 1, 1, 4)),
        (dict(data=-1, context=4), (2, 1, 1, 4, 1)),
        (dict(data=1, fsdp=2, context=-1), (1, 2, 1, 4, 1)),
        (dict(data=-1, expert=4), (2, 1, 4, 1, 1)),
        (dict(data=1, fsdp=2, expert=-1), (1, 2, 4, 1, 1)),
    ],
)
def test_minus_one_takes_the_rest(kw, expected):
    assert mesh_shape(8, **kw) == expected
    mesh = make_mesh(**kw)
    assert tuple(mesh.shape[a] for a in MESH_AXES) == expected


def test_subset_of_devices():
    mesh = make_mesh(data=-1, fsdp=2, devices=jax.devices()[:4])
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "context": 1, "tensor": 1}
    assert set(mesh.devices.flat) == set(jax.devices()[:4])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(data=3, fsdp=1, tensor=1), "multiply to 3 but there are 8"),
        (dict(data=-1, fsdp=3), "not divisible by 3"),
        (dict(data=-1, fsdp=-1), "only one"),
        (dict(data=-1, context=-1), "only one"),
        (dict(context=0), "invalid"),
        (dict(data=0), "invalid"),
    ],
)
def test_bad_sizes_raise_config_error(kw, match):
    with pytest.raises(ConfigError, match=match):
        make_mesh(**kw)

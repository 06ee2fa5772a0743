"""The package's metadata says what the code needs (issue 51, "honest packaging"): the Python
floor matches the classifiers, the installed dependencies meet the floors, and the APIs the
floors were chosen for exist (the floor environment's run is in CHANGELOG.md)."""

import importlib.metadata
import pathlib
import re
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_the_python_floor_matches_the_classifiers_and_this_interpreter():
    project = _project()
    floor = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert floor is not None, project["requires-python"]
    minors = [
        int(m.group(1))
        for c in project["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))
    ]
    assert minors and min(minors) == int(floor.group(1))
    assert sys.version_info[:2] >= (3, int(floor.group(1)))


def test_every_dependency_has_a_floor_the_installed_version_meets():
    for text in _project()["dependencies"]:
        req = Requirement(text)
        installed = Version(importlib.metadata.version(req.name))
        assert req.specifier.contains(installed, prereleases=True), (text, str(installed))
        if req.name != "numpy":  # numpy: whatever JAX's floor pulls in
            assert any(s.operator == ">=" for s in req.specifier), text


def test_the_apis_the_floors_are_for_exist():
    import jax
    import optax

    floors = {Requirement(t).name: Requirement(t) for t in _project()["dependencies"]}
    assert str(floors["jax"].specifier) == ">=0.7.2"
    # jax.sharding.use_abstract_mesh is what 0.7.1 lacks; set_mesh and shard_map came in 0.7
    assert callable(jax.set_mesh) and callable(jax.shard_map)
    assert callable(jax.sharding.use_abstract_mesh)
    assert callable(optax.tree.norm)

"""Every public name (in a package's __all__) has a docstring; __all__ names exist."""

import importlib
import inspect
import pkgutil

import pytest

import jaxrl_llm

PACKAGES = sorted(m.name for m in pkgutil.iter_modules(jaxrl_llm.__path__, "jaxrl_llm.") if m.ispkg)


@pytest.mark.parametrize("name", PACKAGES)
def test_public_names_have_docstrings(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    for public in getattr(module, "__all__", []):
        obj = getattr(module, public)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name}.{public} has no docstring"

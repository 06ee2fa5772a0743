"""The notebooks in notebooks/ execute top to bottom (outputs are stripped in git)."""

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(f for f in os.listdir(os.path.join(ROOT, "notebooks")) if f.endswith(".ipynb"))


def test_notebooks_are_what_make_notebooks_writes(tmp_path):
    # tools/make_notebooks.py holds the notebooks' sources: the committed files are its output
    import importlib.util

    pytest.importorskip("nbformat")
    spec = importlib.util.spec_from_file_location(
        "make_notebooks", os.path.join(ROOT, "tools", "make_notebooks.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.write_notebooks(str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == NOTEBOOKS
    for path in written:
        name = os.path.basename(path)
        with open(path) as f, open(os.path.join(ROOT, "notebooks", name)) as g:
            assert json.load(f) == json.load(g), f"{name}: run python tools/make_notebooks.py"


def test_notebooks_are_committed_without_outputs():
    assert len(NOTEBOOKS) == 4
    for name in NOTEBOOKS:
        nb = json.load(open(os.path.join(ROOT, "notebooks", name)))
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, name


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = os.path.join(ROOT, "notebooks", name)
    nb = nbformat.read(path, as_version=4)
    env_flags = os.environ.get("XLA_FLAGS")
    os.environ.pop("XLA_FLAGS", None)  # the kernel runs on one CPU device, like a user's laptop
    try:
        nbclient.NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": os.path.dirname(path)}},
        ).execute()
    finally:
        if env_flags is not None:
            os.environ["XLA_FLAGS"] = env_flags
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors

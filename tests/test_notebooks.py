"""The notebooks in notebooks/ execute top to bottom (outputs are stripped in git)."""

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(f for f in os.listdir(os.path.join(ROOT, "notebooks")) if f.endswith(".ipynb"))


def test_notebooks_are_committed_without_outputs():
    assert len(NOTEBOOKS) == 3
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

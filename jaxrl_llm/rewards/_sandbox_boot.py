"""The program the code sandbox starts: ``python -I -S -B -c <this file's text>``; never imported.

It must not import anything from the host checkout (the sandbox may not be able to read it),
so it is one self-contained file that ``sandbox.py`` reads as text. It reads a JSON config on
stdin (``{code, mode, chan, has_tests, uids, workdir, limits..., hooks}``) and the tests, later,
from the host channel ``chan`` (an AF_UNIX socket only this process and the judge ever hold).

Processes (namespace modes: this program is pid 1 of a new pid namespace; ``process`` mode: a
child subreaper of the host):

  boot (trusted, non-dumpable)
   ├─ solution: runs the candidate's code, then answers calls from the judge; it never sees the
   │  tests, the host channel or the verdict pipe (closed before the candidate's code runs);
   │  its privileges are dropped (another uid when we are root, no capabilities in a user
   │  namespace; no new privileges and a seccomp filter in both).
   └─ judge: a second process, forked before any candidate code could touch it, that never
      runs candidate code. It executes the tests
      with proxies standing for the solution's names; every call goes over a socket to the
      solution, and only plain built-in values (exact types) come back. It writes its verdict
      to a pipe that only boot reads. Non-dumpable, so the solution cannot ptrace it or read
      its memory or file descriptors through /proc.

boot writes one JSON summary to the host channel after both are gone:
  ``{"verdict": "passed" | "failed_tests" | "error" | null, "detail": str,
     "solution": {"exit": n} | {"signal": n} | {"killed": true}, "timeout": bool,
     "judge": exit status or -signal or null}``.
Exit status of boot: 0, or 15 when the sandbox itself could not be set up.
"""

import ast
import builtins
import importlib
import json
import linecache  # noqa: F401  (imported by boot, before any candidate code could touch files)
import os
import resource
import signal
import socket
import struct
import sys
import time
import traceback

_T0 = time.monotonic()
_MAX_FRAME = 64 << 20
_MAX_DEPTH = 200


# ---------------------------------------------------------------------------------------------
# Wire format between judge and solution: length-prefixed JSON of tagged plain values.
#   None / bool / int / float / str are JSON scalars; containers and other built-ins are
#   one-key objects: {"l": [...]} list, {"t": [...]} tuple, {"d": [[k, v], ...]} dict,
#   {"s": [...]} set, {"f": [...]} frozenset, {"b": hex} bytes, {"y": hex} bytearray,
#   {"c": [re, im]} complex, {"r": id, "n": type name} a handle to an object in the solution.
# Only *exact* built-in types are plain (an int subclass is a handle), so nothing the solution
# defines ever runs inside the judge.
# ---------------------------------------------------------------------------------------------


def _send(sock, obj):
    data = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return bytes(buf)


def _recv(sock):
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > _MAX_FRAME:
        raise ValueError("message of %d bytes is over the limit" % n)
    return json.loads(_recv_exact(sock, n).decode())


def _encode(x, handle_of, depth=0):
    """A value as plain data. Instances of subclasses of the built-in types are sent as their
    built-in contents, read with the base type's own methods (a namedtuple as a tuple, a
    Counter as a dict), so an overridden ``__eq__`` never travels. Everything else: a handle."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool:
        return x
    d = depth + 1
    enc = lambda items: [_encode(v, handle_of, d) for v in items]  # noqa: E731
    if issubclass(t, int):
        return x if t is int else int.__int__(x)
    if issubclass(t, float):
        return x if t is float else float.__float__(x)
    if issubclass(t, str):
        return x if t is str else str.__str__(x)
    if issubclass(t, list):
        return {"l": enc(list.__iter__(x))}
    if issubclass(t, tuple):
        return {"t": enc(tuple.__iter__(x))}
    if issubclass(t, dict):
        return {
            "d": [[_encode(k, handle_of, d), _encode(v, handle_of, d)] for k, v in dict.items(x)]
        }
    if issubclass(t, frozenset):
        return {"f": enc(frozenset.__iter__(x))}
    if issubclass(t, set):
        return {"s": enc(set.__iter__(x))}
    if issubclass(t, bytes):
        return {"b": bytes(memoryview(x)).hex()}
    if issubclass(t, bytearray):
        return {"y": bytes(memoryview(x)).hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    return handle_of(x)


def _decode(v, proxy_of, depth=0):
    """Plain JSON (from an untrusted peer) -> exact built-in values and proxies; strict."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is not dict or len(v) not in (1, 2):
        raise ValueError("malformed value")
    d = depth + 1
    if len(v) == 2:
        if set(v) != {"r", "n"} or type(v["r"]) is not int or type(v["n"]) is not str:
            raise ValueError("malformed handle")
        return proxy_of(v["r"], v["n"][:200])
    ((tag, body),) = v.items()
    if tag in ("l", "t", "s", "f"):
        if type(body) is not list:
            raise ValueError("malformed container")
        items = [_decode(e, proxy_of, d) for e in body]
        return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
    if tag == "d":
        if type(body) is not list:
            raise ValueError("malformed dict")
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict item")
            out[_decode(pair[0], proxy_of, d)] = _decode(pair[1], proxy_of, d)
        return out
    if tag in ("b", "y"):
        if type(body) is not str:
            raise ValueError("malformed bytes")
        return (bytes if tag == "b" else bytearray).fromhex(body)
    if tag == "c":
        if (
            type(body) is not list
            or len(body) != 2
            or any(type(p) not in (int, float) for p in body)
        ):
            raise ValueError("malformed complex")
        return complex(body[0], body[1])
    if tag == "r" and type(body) is int:
        return proxy_of(body, "object")
    raise ValueError("unknown tag")


# ---------------------------------------------------------------------------------------------
# Kernel helpers (ctypes is imported here, in boot, before any untrusted code exists).
# ---------------------------------------------------------------------------------------------

import ctypes  # noqa: E402

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_KEEP_FLAGS = (2, 4, 8, 1024, 2048)  # statvfs ST_NOSUID/NODEV/NOEXEC/NOATIME/NODIRATIME == MS_*
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_PR_SET_DUMPABLE, _PR_SET_PDEATHSIG, _PR_CAPBSET_DROP = 4, 1, 24
_PR_SET_SECUREBITS, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 28, 36, 38, 47


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        "mount " + target,
    )


def _prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl %d" % option)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_privileges(uid):
    """No new privileges; then another uid (root host) or no capabilities (user namespace)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # EINVAL past the last capability
    hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(hdr), data), "capget")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif any(d.permitted for d in data):
        # uid 0 of a user namespace: lock "root gets capabilities" off, then clear them all.
        _prctl(_PR_SET_SECUREBITS, 0x2F)  # NOROOT, NO_SETUID_FIXUP, their locks, KEEP_CAPS lock
        _libc.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
        hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
        _check(_libc.capset(ctypes.byref(hdr), data), "capset")
    hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(hdr), data), "capget")
    if any(d.effective or d.permitted or d.inheritable for d in data):
        raise OSError("capabilities are still held")
    _install_seccomp()


# seccomp: a deny-list (EPERM) of system calls that only widen the kernel's attack surface or
# reach other processes: namespaces and mounts, ptrace and cross-process memory, BPF, perf,
# keyrings, io_uring, userfaultfd, modules, open_by_handle_at. clone() with namespace flags is
# refused too, clone3() answers ENOSYS (glibc then falls back to clone), and any other ABI
# (i386, x32) kills the process. Numbers: (x86_64, aarch64).
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENY = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "kexec_load": (246, 104),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "quotactl": (179, 60),
}
_CLONE, _CLONE3 = (56, 220), (435, 435)
_CLONE_NS_FLAGS = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _install_seccomp():
    """Loads the filter above (needs no_new_privs); returns False on an unknown machine."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCH:
        return False
    col = 0 if machine == "x86_64" else 1
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    kill, allow = 0x80000000, 0x7FFF0000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _SECCOMP_ARCH[machine]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # the x32 ABI
    for nrs in _DENY.values():
        prog += [(jeq, 0, 1, nrs[col]), (ret, 0, 0, eperm)]
    prog += [
        (jeq, 0, 1, _CLONE3[col]),
        (ret, 0, 0, enosys),
        (jeq, 0, 3, _CLONE[col]),
        (ld, 0, 0, 16),
        (jset, 0, 1, _CLONE_NS_FLAGS),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(
        _libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)"
    )  # SECCOMP_MODE_FILTER
    return True


def _bind_readonly(src, dst):
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        open(dst, "w").close()
    _mount(src, dst, None, _MS_BIND | _MS_REC)
    keep = 0
    f_flag = os.statvfs(dst).f_flag
    for bit in _KEEP_FLAGS:
        keep |= f_flag & bit
    if f_flag & 4096:
        keep |= 1 << 21  # ST_RELATIME -> MS_RELATIME
    _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)


def _build_root(cfg):
    """A fresh tmpfs root: system directories and the interpreter read-only, /tmp small and
    writable, a fresh /proc of our pid namespace, a minimal /dev; the host's / is detached."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=8m,mode=0755")
    os.mkdir("/tmp/oldroot")
    nr = _PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError("pivot_root: unknown machine " + os.uname().machine)
    _check(_libc.syscall(ctypes.c_long(nr), b"/tmp", b"/tmp/oldroot"), "pivot_root")
    os.chdir("/")
    old = "/oldroot"
    binds = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    # /etc: only what the loader and the standard library read, not the host's configuration
    # (/etc/environment, gitconfig, credentials of services).
    etc = [
        "alternatives",
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "localtime",
        "timezone",
        "passwd",
        "group",
        "nsswitch.conf",
        "mime.types",
        "os-release",
        "ssl",
    ]
    try:
        etc += [n for n in os.listdir(old + "/etc") if n.startswith("python3")]
    except OSError:
        pass
    binds += ["/etc/" + n for n in etc]
    for p in (sys.base_prefix, sys.base_exec_prefix):  # the interpreter's installation
        binds.append(os.path.realpath(p))
    done: list = []
    for p in binds:
        if any(p == q or p.startswith(q.rstrip("/") + "/") for q in done):
            continue
        src = old + p
        if os.path.islink(src):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if not os.path.lexists(p):
                os.symlink(os.readlink(src), p)
        elif os.path.exists(src):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            _bind_readonly(src, p)
        else:
            continue
        done.append(p)
    # /tmp: the only writable place; /tmp/work is the solution's working directory.
    os.makedirs("/tmp", exist_ok=True)
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=%dm,mode=1777" % cfg["disk_mb"])
    os.mkdir("/tmp/work", 0o700)
    uid = cfg["uids"][0] if cfg["uids"] else None
    if uid is not None:
        os.chown("/tmp/work", uid, uid)
    # /dev: a few harmless character devices bound from the host, nothing else.
    os.mkdir("/dev")
    _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID, "size=64k,mode=0755")
    for name in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists(old + "/dev/" + name):
            open("/dev/" + name, "w").close()
            _mount(old + "/dev/" + name, "/dev/" + name, None, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, "/dev/" + name)
    os.mkdir("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=1777")
    os.mkdir("/proc")
    try:  # needs a fully visible /proc on the host (fails in some containers): then no /proc
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except OSError:
        pass
    _check(_libc.umount2(old.encode(), 2), "umount " + old)  # MNT_DETACH
    os.rmdir(old)
    _mount(None, "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID)
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    try:
        socket.sethostname("sandbox")
    except OSError:
        pass
    return "/tmp/work"


def _limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def _apply_limits(cfg, memory=True):
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    _limit(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    if memory:
        _limit(resource.RLIMIT_AS, cfg["memory_bytes"])


def _close_fds_except(keep):
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# The solution process.
# ---------------------------------------------------------------------------------------------


def _install_hooks(work, strict):
    """Defence in depth inside the solution's interpreter; the kernel is the real fence."""
    work = os.path.realpath(work)
    parent_pgid = os.getpgid(0)
    parent_pid = os.getppid()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    path_events = {
        "os.remove",
        "os.rename",
        "os.mkdir",
        "os.rmdir",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
    }
    net_events = {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
    }
    proc_events = {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.call_function",
        "os.startfile",
        "pty.spawn",
    }

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
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writing and not inside(path):
                raise PermissionError("sandbox: writes outside the working directory are refused")
        elif event in path_events:
            for a in args[:2]:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError(
                        "sandbox: changes outside the working directory are refused"
                    )
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
                raise PermissionError(
                    "sandbox: signalling processes outside the sandbox is refused"
                )
        elif strict and event in proc_events:
            raise PermissionError("sandbox: starting processes is refused (" + event + ")")

    sys.addaudithook(hook)


def _flush():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:  # noqa: B036 - the solution may have replaced them
            pass


def _solution_main(cfg, code, work, rpc):
    """Runs the candidate's code (exit 10 raised, 13 MemoryError, 14 exited early), then
    sends the judge its names and serves calls until killed."""
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"})
    _apply_limits(cfg, memory=False)
    if cfg["hooks"]:
        _install_hooks(work, strict=cfg["mode"] == "process")
    _limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    tested = cfg["has_tests"]
    g = {"__name__": "solution" if tested else "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, "solution.py", "exec"), g)
    except MemoryError:
        os.write(2, b"MemoryError\n")
        os._exit(13)
    except SystemExit as e:
        if tested or e.code not in (None, 0):
            os.write(2, ("SystemExit(%r) in solution.py\n" % (e.code,)).encode())
            os._exit(14)
    except BaseException:  # noqa: B036 - any failure of the candidate's code is a result
        traceback.print_exc()
        _flush()
        os._exit(10)
    _flush()
    objects: dict = {}
    handles: dict = {}

    def handle_of(x):
        h = handles.get(id(x))
        if h is None or objects[h] is not x:
            h = len(objects) + 1
            objects[h], handles[id(x)] = x, h
        return {"r": h, "n": type(x).__qualname__}

    def proxy_of(h, _name):
        return objects[h]

    names = []
    for name, value in list(g.items()):
        if name.startswith("__"):
            continue
        if type(value) is type(os):
            names.append([name, {"module": value.__name__}])
        elif isinstance(value, type) and issubclass(value, BaseException):
            names.append([name, {"exception": [c.__name__ for c in value.__mro__]}])
        else:
            try:
                names.append([name, _encode(value, handle_of)])
            except (ValueError, RecursionError):
                names.append([name, handle_of(value)])
    _send(rpc, {"names": names})
    while True:
        try:
            msg = _recv(rpc)
        except EOFError:
            os._exit(0)
        try:
            op = msg["op"]
            obj = objects[msg["h"]]
            arg = lambda k: _decode(msg[k], proxy_of)  # noqa: E731
            back = []
            if op == "call":
                args, kwargs = arg("args"), arg("kwargs")
                result = obj(*args, **kwargs)
                back = [_encode(args[i], handle_of) for i in msg["back"]]
            elif op == "getattr":
                result = getattr(obj, msg["name"])
            elif op == "setattr":
                setattr(obj, msg["name"], arg("value"))
                result = None
            elif op == "getitem":
                result = obj[arg("key")]
            elif op == "setitem":
                obj[arg("key")] = arg("value")
                result = None
            elif op == "delitem":
                del obj[arg("key")]
                result = None
            elif op == "len":
                result = len(obj)
            elif op == "iter":
                result = handle_of(iter(obj))
            elif op == "next":
                result = next(obj)
            elif op == "contains":
                result = arg("value") in obj
            elif op == "str":
                result = str(obj)
            else:
                raise ValueError("unknown operation")
            reply = {"ok": result if op == "iter" else _encode(result, handle_of), "back": back}
        except BaseException as e:  # noqa: B036 - reported to the judge, which re-raises
            try:
                text = str(e)[:2000]
            except BaseException:  # noqa: B036
                text = "<unprintable>"
            reply = {"exc": [c.__name__ for c in type(e).__mro__], "msg": text}
        _flush()
        _send(rpc, reply)


# ---------------------------------------------------------------------------------------------
# The judge process: runs the tests; never runs candidate code.
# ---------------------------------------------------------------------------------------------


class SolutionError(Exception):
    """An exception raised by the solution whose class is not a built-in one."""


class SolutionGone(Exception):
    """The solution process ended or broke the protocol while the tests ran."""


def _solution_exception(names, text, exc_classes):
    """The judge's exception for one the solution raised (its class's MRO names and message)."""
    err = None
    for n in names:
        if type(n) is not str:
            continue
        if n in exc_classes:
            err = exc_classes[n]
            break
        cls = getattr(builtins, n, None)
        if (
            isinstance(cls, type)
            and issubclass(cls, Exception)
            and not issubclass(cls, SolutionGone)
        ):
            err = cls
            break
    try:
        exc = (err or SolutionError)(text)
    except Exception:  # noqa: BLE001 - some built-ins want other arguments
        exc = SolutionError(text)
    return exc


def _remote_iterator_class(one):
    """The proxy class for an iterator of the solution, stepped with ``one("next", ...)``."""

    class RemoteIterator:
        __slots__ = ("_it",)

        def __init__(self, it):
            self._it = it

        def __iter__(self):
            return self

        def __next__(self):
            return one("next", self._it)

    return RemoteIterator


def _remote_class(rpc_call, one, encode_arg):
    """The proxy class for the solution's objects, over the judge's ``rpc_call`` and ``one``."""
    RemoteIterator = _remote_iterator_class(one)

    class Remote:
        """A name or object of the solution. Calls, attributes, items, len, iteration and str
        run in the solution process. It has no truth value, no ordering or arithmetic, and is
        equal only to itself: comparisons in the tests happen on plain values only."""

        __slots__ = ("_h", "_t")

        def __init__(self, h, t):
            object.__setattr__(self, "_h", h)
            object.__setattr__(self, "_t", t)

        def __call__(self, *args, **kwargs):
            back = [i for i, a in enumerate(args) if type(a) in (list, dict, set, bytearray)]
            result, new = rpc_call(
                "call",
                self,
                args=encode_arg(list(args)),
                kwargs=encode_arg(dict(kwargs)),
                back=back,
            )
            if len(new) != len(back):
                raise SolutionGone("malformed reply")
            for i, value in zip(back, new):  # copy-in / copy-out of mutable arguments
                a = args[i]
                if type(value) is not type(a):
                    raise SolutionGone("malformed reply")
                if type(a) in (list, bytearray):
                    a[:] = value
                else:
                    a.clear()
                    a.update(value)
            return result

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return one("getattr", self, name=name)

        def __setattr__(self, name, value):
            one("setattr", self, name=name, value=encode_arg(value))

        def __getitem__(self, key):
            return one("getitem", self, key=encode_arg(key))

        def __setitem__(self, key, value):
            one("setitem", self, key=encode_arg(key), value=encode_arg(value))

        def __delitem__(self, key):
            one("delitem", self, key=encode_arg(key))

        def __len__(self):
            n = one("len", self)
            if type(n) is not int:
                raise SolutionGone("malformed reply")
            return n

        def __iter__(self):
            it = one("iter", self)
            if type(it) is not Remote:
                raise SolutionGone("malformed reply")
            return RemoteIterator(it)

        def __contains__(self, value):
            r = one("contains", self, value=encode_arg(value))
            if type(r) is not bool:
                raise SolutionGone("malformed reply")
            return r

        def __str__(self):
            s = one("str", self)
            if type(s) is not str:
                raise SolutionGone("malformed reply")
            return s

        def __repr__(self):
            return "<solution %s #%d>" % (
                object.__getattribute__(self, "_t"),
                object.__getattribute__(self, "_h"),
            )

        def __bool__(self):
            raise TypeError(
                "%r: an object of the solution has no truth value in the tests; "
                "compare a plain value" % self
            )

        def __eq__(self, other):
            return self is other

        def __ne__(self, other):
            return self is not other

        __hash__ = object.__hash__

    return Remote


def _judge_link(rpc, exc_classes):
    """The judge's end of the solution channel: returns ``proxy_of(handle, type name)``."""
    proxies: dict = {}

    def proxy_of(h, name):
        p = proxies.get(h)
        if p is None:
            p = proxies[h] = Remote(h, name)
        return p

    def encode_arg(x):
        def handle_of(v):
            if type(v) is Remote:
                return {"r": object.__getattribute__(v, "_h")}
            raise TypeError(
                "cannot pass a %s to the solution: only plain built-in values and "
                "the solution's own objects cross" % type(v).__name__
            )

        return _encode(x, handle_of)

    def rpc_call(op, target, **fields):
        msg = {"op": op, "h": object.__getattribute__(target, "_h")}
        msg.update(fields)
        try:
            _send(rpc, msg)
            reply = _recv(rpc)
            if type(reply) is not dict:
                raise ValueError("malformed reply")
            if "exc" in reply:
                names, text = reply["exc"], reply.get("msg", "")
                if type(names) is not list or type(text) is not str:
                    raise ValueError("malformed exception")
            else:
                back = [_decode(b, proxy_of) for b in reply.get("back", [])]
                return _decode(reply["ok"], proxy_of), back
        except (
            OSError,
            EOFError,
            ValueError,
            KeyError,
            TypeError,
            RecursionError,
            struct.error,
        ) as e:
            raise SolutionGone(
                "the solution process ended or broke the protocol (%s: %s)" % (type(e).__name__, e)
            ) from None
        raise _solution_exception(names, text, exc_classes)

    def one(op, target, **fields):
        return rpc_call(op, target, **fields)[0]

    Remote = _remote_class(rpc_call, one, encode_arg)
    return proxy_of


def _verdict(verdict_fd, result, detail=""):
    """Writes the judge's verdict to the pipe only boot reads, and ends the judge."""
    _flush()
    os.write(verdict_fd, json.dumps({"verdict": result, "detail": detail[:4000]}).encode())
    os._exit(0)


def _dotted_names(tests):
    """Names the tests use as ``name.attr`` (empty when the tests do not parse)."""
    dotted = set()
    try:
        for node in ast.walk(ast.parse(tests)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                dotted.add(node.value.id)
    except (SyntaxError, ValueError, RecursionError):
        pass  # compile() below reports it
    return dotted


def _tests_namespace(names, dotted, proxy_of, exc_classes):
    """The tests' ``__main__`` namespace from the names the solution sent (strictly checked)."""
    if type(names) is not list:
        raise ValueError("malformed names")
    ns = {"__name__": "__main__", "__builtins__": builtins}
    for item in names:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            raise ValueError("malformed name")
        name, value = item
        if hasattr(builtins, name):
            continue  # the tests' built-ins are the real ones (no fake `sorted`, `len`)
        if name in getattr(sys, "stdlib_module_names", ()) and name in dotted:
            value = {"module": name}
        if type(value) is dict and set(value) == {"module"}:
            try:
                ns[name] = importlib.import_module(str(value["module"]))
            except Exception:  # noqa: BLE001 - the tests must import it themselves
                pass
        elif type(value) is dict and set(value) == {"exception"}:
            bases = [getattr(builtins, n, None) for n in value["exception"][1:] if type(n) is str]
            base = next(
                (b for b in bases if isinstance(b, type) and issubclass(b, Exception)),
                Exception,
            )
            ns[name] = exc_classes[name] = type(name, (base,), {})
        else:
            ns[name] = _decode(value, proxy_of)
    return ns


def _judge_main(cfg, tests, rpc, verdict_fd):
    """Runs the tests against proxies of the solution's names and writes the verdict."""
    exc_classes: dict = {}
    proxy_of = _judge_link(rpc, exc_classes)
    # Names the tests use as `name.attr`: if such a name is a standard-library module's, the
    # tests mean the real module, never whatever the solution bound to it (a fake `math`).
    dotted = _dotted_names(tests)
    try:
        first = _recv(rpc)
        ns = _tests_namespace(first["names"], dotted, proxy_of, exc_classes)
    except BaseException as e:  # noqa: B036
        _verdict(verdict_fd, "error", "the solution did not run to the end (%s)" % type(e).__name__)
    try:
        exec(compile(tests, "tests.py", "exec"), ns)
    except AssertionError:
        traceback.print_exc()
        _verdict(verdict_fd, "failed_tests", traceback.format_exc(limit=-1))
    except BaseException as e:  # noqa: B036 - every other way out of the tests is an error
        traceback.print_exc()
        kind = "memory" if isinstance(e, MemoryError) else "error"
        _verdict(verdict_fd, "error", kind + ": " + traceback.format_exc(limit=-1))
    _verdict(verdict_fd, "passed")


# ---------------------------------------------------------------------------------------------
# boot
# ---------------------------------------------------------------------------------------------


def _read_tests(chan):
    try:
        return _recv(chan)
    except Exception:  # noqa: BLE001
        return None


def _kill_all_children(me):
    """SIGKILL every process whose parent is us, until none is left (we are a subreaper or
    pid 1, so orphans of the solution come back to us)."""
    for _ in range(1000):
        kids = []
        try:
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        with open("/proc/%s/stat" % d, "rb") as f:
                            if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                                kids.append(int(d))
                    except (OSError, ValueError, IndexError):
                        pass
        except OSError:
            pass
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            reaped = True
        if not kids and not reaped:
            time.sleep(0.005)


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = json.loads(sys.stdin.buffer.read().decode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    chan = socket.socket(fileno=cfg["chan"])
    mode, uids = cfg["mode"], cfg["uids"]
    try:
        _prctl(_PR_SET_DUMPABLE, 0)
        if mode == "process":
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            work = cfg["workdir"]
        else:
            work = _build_root(cfg)
    except BaseException as e:  # noqa: B036
        os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
        os._exit(15)
    code = cfg.pop("code")
    deadline = _T0 + cfg["timeout_s"]
    sol_sock, judge_sock = socket.socketpair()
    verdict_r, verdict_w = os.pipe()
    sol_pid = os.fork()
    if sol_pid == 0:
        try:
            _close_fds_except({sol_sock.fileno()})
            del cfg["chan"]
            _drop_privileges(uids[0] if uids else None)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the credential change clears it
        except BaseException as e:  # noqa: B036
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(15)
        _solution_main(cfg, code, work, sol_sock)
        os._exit(0)
    del code
    sol_sock.close()
    tests = _read_tests(chan) if cfg["has_tests"] else ""
    judge_pid = os.fork()
    if judge_pid == 0:
        try:
            os.close(verdict_r)
            _close_fds_except({judge_sock.fileno(), verdict_w})
            os.chdir("/")
            _drop_privileges(uids[1] if uids else None)
            _prctl(_PR_SET_DUMPABLE, 0)  # after the credential change, which resets it
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            _apply_limits(cfg)
            if tests is None:
                raise ValueError("no tests received")
        except BaseException as e:  # noqa: B036
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(15)
        _judge_main(cfg, tests, judge_sock, verdict_w)
        os._exit(0)
    judge_sock.close()
    os.close(verdict_w)
    sol_status = judge_status = None
    timed_out = False
    me = os.getpid()
    while judge_status is None:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == sol_pid:
            sol_status = status
        elif pid == judge_pid:
            judge_status = status
        elif pid == 0:
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.002)
    raw = b""
    if not timed_out:
        while True:
            chunk = os.read(verdict_r, 65536)
            if not chunk:
                break
            raw += chunk
    if mode == "process":
        _kill_all_children(me)
    # (namespace modes: we are pid 1; when we exit the kernel kills the whole namespace)
    try:
        result = json.loads(raw.decode()) if raw else {"verdict": None, "detail": ""}
    except ValueError:
        result = {"verdict": None, "detail": "malformed verdict"}
    solution: dict[str, bool | int]
    if sol_status is None:
        solution = {"killed": True}
    elif os.WIFSIGNALED(sol_status):
        solution = {"signal": os.WTERMSIG(sol_status)}
    else:
        solution = {"exit": os.WEXITSTATUS(sol_status)}
    result.update(
        solution=solution,
        timeout=timed_out,
        judge=None
        if judge_status is None
        else (
            os.WEXITSTATUS(judge_status)
            if os.WIFEXITED(judge_status)
            else -os.WTERMSIG(judge_status)
        ),
    )
    try:
        chan.sendall(json.dumps(result).encode())
        chan.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()

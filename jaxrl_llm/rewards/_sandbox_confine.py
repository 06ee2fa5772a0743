"""Part of the sandbox's boot program (see ``_sandbox_boot.py``): the kernel helpers boot uses
to confine itself, the solution and the judge.

The fresh root filesystem of the namespace modes (tmpfs root, system directories bound
read-only, the host's / detached), dropped privileges and capabilities, the seccomp deny-list,
resource limits and closing inherited file descriptors. ctypes is imported here, in boot,
before any untrusted code exists.

At run time it imports the standard library only: this text runs inside the sandbox,
joined with the other parts.
"""

import ctypes
import os
import resource
import socket
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_KEEP_FLAGS = (2, 4, 8, 1024, 2048)  # statvfs ST_NOSUID/NODEV/NOEXEC/NOATIME/NODIRATIME == MS_*
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
PR_SET_DUMPABLE, PR_SET_PDEATHSIG, _PR_CAPBSET_DROP = 4, 1, 24
_PR_SET_SECUREBITS, PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 28, 36, 38, 47


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


def prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl %d" % option)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_privileges(uid):
    """No new privileges; then another uid (root host) or no capabilities (user namespace)."""
    prctl(_PR_SET_NO_NEW_PRIVS, 1)
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
        prctl(_PR_SET_SECUREBITS, 0x2F)  # NOROOT, NO_SETUID_FIXUP, their locks, KEEP_CAPS lock
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


def build_root(cfg):
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


def set_limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (value, value))


def apply_limits(cfg, memory=True):
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    set_limit(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    set_limit(resource.RLIMIT_NOFILE, 64)
    set_limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    if memory:
        set_limit(resource.RLIMIT_AS, cfg["memory_bytes"])


def close_fds_except(keep):
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass

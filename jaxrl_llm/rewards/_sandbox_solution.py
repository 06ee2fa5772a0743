"""Part of the sandbox's boot program (see ``_sandbox_boot.py``): the solution process.

It runs the candidate's code under the audit hook (defence in depth; the kernel is the real
fence), sends the judge its global names, then serves the judge's calls on the objects behind
them until the judge hangs up or the run is killed. It never sees the tests, the host channel
or the verdict pipe.

At run time it imports the standard library only: this text runs inside the sandbox,
joined with the other parts.
"""

import builtins
import os
import resource
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # the parts share one namespace in the sandbox; these are for the checkers
    from jaxrl_llm.rewards._sandbox_confine import apply_limits, set_limit
    from jaxrl_llm.rewards._sandbox_wire import decode, encode, recv, send


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


def flush_output():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:  # noqa: B036 - the solution may have replaced them
            pass


def _run_candidate(code, *, tested):
    """Executes the candidate's code and returns its globals; exits the process with 13 on a
    MemoryError, 14 on an early exit (any ``SystemExit`` when ``tested``, else a nonzero
    one) and 10 on any other exception."""
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
        flush_output()
        os._exit(10)
    flush_output()
    return g


def solution_main(cfg, code, work, rpc):
    """Runs the candidate's code (exit 10 raised, 13 MemoryError, 14 exited early), then
    sends the judge its names and serves calls until killed."""
    os.chdir(work)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"})
    apply_limits(cfg, memory=False)
    if cfg["hooks"]:
        _install_hooks(work, strict=cfg["mode"] == "process")
    set_limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    g = _run_candidate(code, tested=cfg["has_tests"])
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
                names.append([name, encode(value, handle_of)])
            except (ValueError, RecursionError):
                names.append([name, handle_of(value)])
    send(rpc, {"names": names})
    while True:
        try:
            msg = recv(rpc)
        except EOFError:
            os._exit(0)
        try:
            op = msg["op"]
            obj = objects[msg["h"]]
            arg = lambda k: decode(msg[k], proxy_of)  # noqa: E731
            back = []
            if op == "call":
                args, kwargs = arg("args"), arg("kwargs")
                result = obj(*args, **kwargs)
                back = [encode(args[i], handle_of) for i in msg["back"]]
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
            reply = {"ok": result if op == "iter" else encode(result, handle_of), "back": back}
        except BaseException as e:  # noqa: B036 - reported to the judge, which re-raises
            try:
                text = str(e)[:2000]
            except BaseException:  # noqa: B036
                text = "<unprintable>"
            reply = {"exc": [c.__name__ for c in type(e).__mro__], "msg": text}
        flush_output()
        send(rpc, reply)

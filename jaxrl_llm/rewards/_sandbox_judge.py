"""Part of the sandbox's boot program (see ``_sandbox_boot.py``): the judge process.

It runs the tests and never runs candidate code. The tests see the solution's names as
proxies (the ``Remote`` class that :func:`_remote_class` builds): every call, attribute,
item, len, iteration and str goes over a socket to the solution, and only plain built-in
values (exact types, decoded strictly) come back. Its verdict goes to a pipe that only boot
reads.

At run time it imports the standard library only: this text runs inside the sandbox,
joined with the other parts.
"""

import ast
import builtins
import importlib
import json
import os
import struct
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # the parts share one namespace in the sandbox; these are for the checkers
    from jaxrl_llm.rewards._sandbox_solution import flush_output
    from jaxrl_llm.rewards._sandbox_wire import decode, encode, recv, send


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

        return encode(x, handle_of)

    def rpc_call(op, target, **fields):
        msg = {"op": op, "h": object.__getattribute__(target, "_h")}
        msg.update(fields)
        try:
            send(rpc, msg)
            reply = recv(rpc)
            if type(reply) is not dict:
                raise ValueError("malformed reply")
            if "exc" in reply:
                names, text = reply["exc"], reply.get("msg", "")
                if type(names) is not list or type(text) is not str:
                    raise ValueError("malformed exception")
            else:
                back = [decode(b, proxy_of) for b in reply.get("back", [])]
                return decode(reply["ok"], proxy_of), back
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
    flush_output()
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
            ns[name] = decode(value, proxy_of)
    return ns


def judge_main(cfg, tests, rpc, verdict_fd):
    """Runs the tests against proxies of the solution's names and writes the verdict."""
    exc_classes: dict = {}
    proxy_of = _judge_link(rpc, exc_classes)
    # Names the tests use as `name.attr`: if such a name is a standard-library module's, the
    # tests mean the real module, never whatever the solution bound to it (a fake `math`).
    dotted = _dotted_names(tests)
    try:
        first = recv(rpc)
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

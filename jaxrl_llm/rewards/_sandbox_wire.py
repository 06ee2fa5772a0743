"""Part of the sandbox's boot program (see ``_sandbox_boot.py``): the wire format between
the judge and the solution.

Length-prefixed JSON of tagged plain values.
  None / bool / int / float / str are JSON scalars; containers and other built-ins are
  one-key objects: {"l": [...]} list, {"t": [...]} tuple, {"d": [[k, v], ...]} dict,
  {"s": [...]} set, {"f": [...]} frozenset, {"b": hex} bytes, {"y": hex} bytearray,
  {"c": [re, im]} complex, {"r": id, "n": type name} a handle to an object in the solution.
Only *exact* built-in types are plain (an int subclass is a handle), so nothing the solution
defines ever runs inside the judge.

At run time it imports the standard library only: this text runs inside the sandbox,
joined with the other parts.
"""

import json
import struct

_MAX_FRAME = 64 << 20
_MAX_DEPTH = 200


def send(sock, obj):
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


def recv(sock):
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > _MAX_FRAME:
        raise ValueError("message of %d bytes is over the limit" % n)
    return json.loads(_recv_exact(sock, n).decode())


def encode(x, handle_of, depth=0):
    """A value as plain data. Instances of subclasses of the built-in types are sent as their
    built-in contents, read with the base type's own methods (a namedtuple as a tuple, a
    Counter as a dict), so an overridden ``__eq__`` never travels. Everything else: a handle."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool:
        return x
    d = depth + 1
    enc = lambda items: [encode(v, handle_of, d) for v in items]  # noqa: E731
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
        return {"d": [[encode(k, handle_of, d), encode(v, handle_of, d)] for k, v in dict.items(x)]}
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


def decode(v, proxy_of, depth=0):
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
        items = [decode(e, proxy_of, d) for e in body]
        return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
    if tag == "d":
        if type(body) is not list:
            raise ValueError("malformed dict")
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict item")
            out[decode(pair[0], proxy_of, d)] = decode(pair[1], proxy_of, d)
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

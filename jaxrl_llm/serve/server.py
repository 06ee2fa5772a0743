"""One HTTP server for every protocol jaxrl_llm speaks (Tinker, OpenAI-compatible).

A protocol is a :class:`Protocol`: a FastAPI router mounted under its prefix, how its errors
are written on the wire (each SDK parses its own error body), and what to do when the server
stops (save every tenant). :func:`make_app` mounts any number of them behind one API-key check;
:func:`serve` runs the app with uvicorn (the ASGI server FastAPI is built for) until SIGTERM or
SIGINT, then calls each protocol's ``on_stop`` and returns 143 or 130 (what ``train`` exits
with after it saved). :class:`ServerThread` runs an app on ``127.0.0.1`` and a free port in a
thread, for tests and notebooks, and always stops it.

Device work does not run on the HTTP side: routes hand it to the server's one
:class:`jaxrl_llm.serve.engine_loop.EngineLoop`.

Errors: a :class:`ServeError` (status + one sentence), any :class:`jaxrl_llm.errors.JaxrlError`
(400), a request body that does not validate (422: the first problem, as one sentence naming
the field) and a wrong or missing API key (401) are answered by the protocol's ``error_body``;
an unexpected exception is a 500 whose sentence names its type and message, and the server
goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import fastapi
import uvicorn
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from jaxrl_llm.errors import JaxrlError


class ServeError(JaxrlError):
    """A request the server refuses: an HTTP status and one sentence saying why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)
        self.message = message


def default_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"error": {"message", "code"}}``, OpenAI's shape, read by most HTTP clients."""
    return {"error": {"message": message, "code": status}}


@dataclasses.dataclass(frozen=True)
class Protocol:
    """One wire protocol served by the app.

    Args:
      name: what ``jaxrl-llm serve NAME`` calls it.
      router: its routes (paths include the protocol's prefix, e.g. ``/api/v1/...``).
      prefix: the path prefix its errors are recognised by.
      error_body: ``(status, message) -> JSON body`` in the protocol's own error shape.
      on_stop: called once when the server stops (SIGTERM, SIGINT): save what must survive.
      on_start: called once before the first request (compile, warm caches).
    """

    name: str
    router: fastapi.APIRouter
    prefix: str = ""
    error_body: Callable[[int, str], dict[str, Any]] = default_error_body
    on_stop: Callable[[], None] | None = None
    on_start: Callable[[], None] | None = None


def _one_sentence(exc: RequestValidationError) -> str:
    """The first validation problem as ``body.field.sub: what is wrong``."""
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where or 'request'}: {first.get('msg', 'invalid')}{more}"


def make_app(protocols: list[Protocol], *, api_key: str | None = None) -> fastapi.FastAPI:
    """A FastAPI app serving ``protocols`` behind one API key.

    With ``api_key`` set, every request must carry it as ``Authorization: Bearer KEY`` or
    ``X-API-Key: KEY`` (the headers the OpenAI and Tinker SDKs send), else a 401; without it
    the server is open (bind it to 127.0.0.1).
    """

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        for p in protocols:
            if p.on_start is not None:
                p.on_start()
        yield

    app = fastapi.FastAPI(title="jaxrl_llm", docs_url=None, redoc_url=None, lifespan=lifespan)
    by_prefix = sorted(protocols, key=lambda p: -len(p.prefix))

    def body_for(path: str, status: int, message: str) -> JSONResponse:
        proto = next((p for p in by_prefix if path.startswith(p.prefix)), None)
        body = (proto.error_body if proto else default_error_body)(status, message)
        return JSONResponse(body, status_code=status)

    @app.middleware("http")
    async def check_key(request: fastapi.Request, call_next):
        if api_key is not None:
            auth = request.headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else None
            given = request.headers.get("x-api-key", given)
            if given != api_key:
                why = "no API key" if given is None else "a wrong API key"
                return body_for(request.url.path, 401, f"the request has {why}")
        return await call_next(request)

    @app.exception_handler(ServeError)
    async def serve_error(request: fastapi.Request, exc: ServeError):
        return body_for(request.url.path, exc.status, exc.message)

    @app.exception_handler(JaxrlError)
    async def user_error(request: fastapi.Request, exc: JaxrlError):
        return body_for(request.url.path, 400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: fastapi.Request, exc: RequestValidationError):
        return body_for(request.url.path, 422, _one_sentence(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: fastapi.Request, exc: Exception):
        return body_for(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")

    @app.get("/health")
    async def health():
        return {"status": "ok", "protocols": [p.name for p in protocols]}

    for p in protocols:
        app.include_router(p.router)
    return app


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port; ``.getsockname()[1]`` says
    which)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """``app`` served on ``host`` and a free port from a daemon thread.

    A context manager: ``with ServerThread(app) as s: ... s.url ...`` stops the server (and
    joins its thread) on exit, also when the body raised.
    """

    def __init__(self, app: fastapi.FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start serving; returns once the server accepts requests."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the server to exit and wait for its thread."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    protocols: list[Protocol],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    announce: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> int:
    """Serve ``protocols`` until SIGTERM / SIGINT; returns the exit status.

    The server runs in a thread while the main thread waits for a signal; on one, the server
    stops taking requests, finishes those in flight, and each protocol's ``on_stop`` runs
    (saving tenants) before this returns 143 (SIGTERM) or 130 (SIGINT), as ``train`` does.
    """
    app = make_app(protocols, api_key=api_key)
    server = ServerThread(app, host, port)
    got: list[int] = []

    def on_signal(signum, _frame):
        got.append(signum)
        server.server.should_exit = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start(timeout=600.0)
        names = ", ".join(p.name for p in protocols)
        announce(f"serving {names} on {server.url} (stop with Ctrl-C or SIGTERM)")
        while server.thread.is_alive() and not got:
            server.thread.join(0.2)
        server.stop()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for p in protocols:
        if p.on_stop is not None:
            p.on_stop()
    if not got:
        return 1  # the server ended by itself: uvicorn logged why
    announce(f"stopped by {signal.Signals(got[0]).name}")
    return 143 if got[0] == signal.SIGTERM else 130

"""Serving a model over HTTP: one server, one engine loop, routes per protocol.

- :mod:`.server`: the FastAPI app, its API key and error bodies, :func:`serve` (until SIGTERM,
  then every protocol's ``on_stop``), :class:`ServerThread` for tests;
- :mod:`.engine_loop`: the one thread that runs device work, in groups of the same kind;
- protocols in their own modules, each a :class:`Protocol` built from the served model.
"""

from jaxrl_llm.serve.engine_loop import EngineLoop
from jaxrl_llm.serve.server import (
    Protocol,
    ServeError,
    ServerThread,
    bind,
    default_error_body,
    make_app,
    serve,
)

__all__ = [
    "EngineLoop",
    "Protocol",
    "ServeError",
    "ServerThread",
    "bind",
    "default_error_body",
    "make_app",
    "serve",
]

"""``jaxrl-llm serve PROTOCOL``: serve a model over HTTP to another framework's clients.

Protocols (one module each under :mod:`jaxrl_llm.serve`, explicit in :data:`PROTOCOLS`):

- ``tinker``: the Tinker training API (``tinker.ServiceClient(base_url=...)``);
- ``openai``: an OpenAI-compatible ``/v1`` endpoint, token-in/token-out.

Each protocol module defines ``add_arguments(parser)`` (its own flags) and
``build(args, model, loop) -> Protocol``. The model is loaded once here (what
``model.source`` takes: an alias, a Hugging Face or GGUF path, a run or checkpoint directory,
``tiny``) and shared; device work runs on one :class:`jaxrl_llm.serve.EngineLoop`. The server
binds 127.0.0.1 unless ``--host`` says otherwise, and stops on SIGTERM after each protocol
saved what it holds (exit 143).

Example::

    jaxrl-llm serve tinker --model smollm2-135m-instruct --port 8000
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from jaxrl_llm.errors import ConfigError

#: protocol -> (module, one-line help)
PROTOCOLS: dict[str, tuple[str, str]] = {
    "tinker": ("jaxrl_llm.serve.tinker", "the Tinker training API (forward_backward, sample, ...)"),
    "openai": ("jaxrl_llm.serve.openai", "an OpenAI-compatible /v1 endpoint (chat, completions)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-parser per protocol, each with the common flags and the protocol's own."""
    sub = parser.add_subparsers(dest="protocol", metavar="PROTOCOL", required=True)
    for name, (module_name, help_text) in PROTOCOLS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--model", required=True, help="what model.source takes (alias, path, tiny)")
        p.add_argument("--model-name", default=None, help="the name clients use (default: --model)")
        p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
        p.add_argument("--port", type=int, default=8000, help="port (0: a free one; default 8000)")
        p.add_argument("--api-key", default=None, help="require this key on every request")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:  # an optional extra (fastapi, tinker, ...) missing
            p.set_defaults(_protocol=None, _missing=(name, e.name))
            continue
        module.add_arguments(p)
        p.set_defaults(_protocol=module)


def load_served(source: str, name: str | None = None):
    """The :class:`jaxrl_llm.serve.served.ServedModel` of a ``--model`` argument."""
    from jaxrl_llm.cli.sources import classify_source, describe, load_any
    from jaxrl_llm.serve.served import ServedModel

    t0 = time.perf_counter()
    if source == "tiny":  # what model.source=tiny trains: a random model, the char tokenizer
        from jaxrl_llm.train.programs.model_load import tiny_model

        config, params, tokenizer = tiny_model()
        print(f"loaded a tiny random model in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        return ServedModel(name or source, config, params, tokenizer, source)
    kind = classify_source(source)
    config, params, tokenizer, restored = load_any(kind, prefer_export=True)
    print(
        f"loaded {describe(kind, restored)} ({config.num_params() / 1e6:.1f}M parameters) "
        f"in {time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    return ServedModel(name or source, config, params, tokenizer, source)


def run(args: argparse.Namespace) -> int:
    """Load the model, build the protocol, serve until stopped; returns the exit status."""
    if args._protocol is None:
        name, missing = args._missing
        raise ConfigError(
            f"serve {name} needs the module {missing!r}: pip install 'jaxrl_llm[{name}]'"
        )
    from jaxrl_llm.serve import EngineLoop, serve

    model = load_served(args.model, args.model_name)
    loop = EngineLoop().start()
    try:
        protocol = args._protocol.build(args, model, loop)
        return serve([protocol], host=args.host, port=args.port, api_key=args.api_key)
    finally:
        loop.stop()

"""``jaxrl-llm serve tinker``: the Tinker training API over jaxrl_llm, many LoRA tenants on one base.

The official SDK (``pip install 'jaxrl_llm[tinker]'``, ``tinker==0.38``) reaches it unmodified::

    jaxrl-llm serve tinker --model smollm2-135m-instruct --port 8000 --api-key tml-local

    import tinker
    service = tinker.ServiceClient(base_url="http://127.0.0.1:8000", api_key="tml-local")
    training = service.create_lora_training_client(base_model="smollm2-135m-instruct", rank=8)

(the SDK insists that a key starts with ``tml-``; a server without ``--api-key`` accepts any.)

Modules: :mod:`.wire` (protobuf and JSON shapes), :mod:`.tenants` (adapters, Adam, checkpoints),
:mod:`.losses` (the SDK's losses as our objectives), :mod:`.service` (batched
forward/backward), :mod:`.sampler` (sampling sessions), :mod:`.state`, :mod:`.routes`.
Token data is batch-major ``[B, T]``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.serve.engine_loop import EngineLoop
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import Protocol
from jaxrl_llm.serve.tinker import wire
from jaxrl_llm.serve.tinker.losses import LOSSES
from jaxrl_llm.serve.tinker.routes import make_router
from jaxrl_llm.serve.tinker.state import TinkerState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Tinker protocol's own flags."""
    parser.add_argument(
        "--output-dir", default=None, help="checkpoints and SIGTERM saves (default: a temp dir)"
    )
    parser.add_argument("--max-tenants", type=int, default=64, help="most tenants at once")
    parser.add_argument(
        "--resume", action="store_true", help="restore the tenants SIGTERM saved in --output-dir"
    )


def build_state(
    model: ServedModel,
    loop: EngineLoop,
    output_dir: str | None = None,
    *,
    max_tenants: int = 64,
    resume: bool = False,
) -> TinkerState:
    """The service's state over ``model`` (and the tenants ``--resume`` restores)."""
    if resume and output_dir is None:
        raise ConfigError("--resume needs the --output-dir that the stopped server saved to")
    root = pathlib.Path(output_dir or tempfile.mkdtemp(prefix="jaxrl-tinker-"))
    root.mkdir(parents=True, exist_ok=True)
    state = TinkerState(model, loop, root, max_tenants)
    if resume:
        n = state.resume()
        print(f"resumed {n} tenants from {root}", file=sys.stderr, flush=True)
    return state


def protocol(state: TinkerState) -> Protocol:
    """The :class:`Protocol` of a service (its routes, error body, SIGTERM save)."""

    def on_stop() -> None:
        paths = state.save_all()
        print(f"saved {len(paths)} tenants under {state.root}", file=sys.stderr, flush=True)

    return Protocol(
        "tinker", make_router(state), prefix="/api/", error_body=wire.error_body, on_stop=on_stop
    )


def build(args: argparse.Namespace, model: ServedModel, loop: EngineLoop) -> Protocol:
    """``jaxrl-llm serve tinker``'s protocol from its flags."""
    state = build_state(
        model, loop, args.output_dir, max_tenants=args.max_tenants, resume=args.resume
    )
    return protocol(state)


__all__ = [
    "LOSSES",
    "TinkerState",
    "add_arguments",
    "build",
    "build_state",
    "protocol",
]

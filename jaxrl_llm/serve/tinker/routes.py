"""The ``/api/v1`` routes of the Tinker service and the futures the SDK polls.

Every call that does device work (create_model, forward_backward, optim_step, save/load,
asample) answers at once with ``{"request_id"}``; the work is queued on the engine loop as one
``"tinker"`` item and the SDK polls ``retrieve_future`` (we hold each poll up to
:data:`POLL_S` seconds, then answer ``try_again``). Input problems are refused before
queueing, with a 4xx and one sentence (the SDK raises it as ``BadRequestError`` /
``NotFoundError``); a failure while running comes back through the future
(``RequestFailedError``). Other tenants never see either.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import fastapi
from fastapi.responses import Response

from jaxrl_llm.errors import JaxrlError
from jaxrl_llm.serve.server import ServeError
from jaxrl_llm.serve.tinker import tenants as tn
from jaxrl_llm.serve.tinker import wire
from jaxrl_llm.serve.tinker.sampler import Sampler, sample
from jaxrl_llm.serve.tinker.service import FwdBwd, check_request
from jaxrl_llm.serve.tinker.state import TinkerState

#: how long one ``retrieve_future`` waits for a running future before ``try_again``
POLL_S = 5.0

#: what the SDK reads from ``/api/v1/client/config``: plain API keys, no JWT exchange, no
#: zstd bodies, httpx's own transport, one ``retrieve_future`` per request, custom losses
#: computed by the client
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


async def _json(request: fastapi.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception as e:
        raise ServeError(400, f"the request body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise ServeError(400, "the request body must be a JSON object")
    return body


def _need(body: dict[str, Any], name: str) -> Any:
    if body.get(name) is None:
        raise ServeError(400, f"the request has no {name!r}")
    return body[name]


def make_router(state: TinkerState) -> fastapi.APIRouter:
    """The routes of one Tinker service."""
    router = fastapi.APIRouter()
    _service_routes(router, state)
    _training_routes(router, state)
    _sampling_routes(router, state)
    _future_routes(router, state)
    return router


def _service_routes(router: fastapi.APIRouter, state: TinkerState) -> None:
    @router.post("/api/v1/client/config")
    async def client_config():
        return CLIENT_CONFIG

    @router.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {}

    @router.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @router.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @router.get("/api/v1/get_server_capabilities")
    async def capabilities():
        c = state.served.config
        model = {"model_name": state.served.name, "max_context_length": c.max_position_embeddings}
        return {"supported_models": [{**model, "trainable": True, "sampleable": True}]}

    @router.post("/api/v1/create_session")
    async def create_session(request: fastapi.Request):
        await _json(request)
        session_id = str(uuid.uuid4())
        state.sessions.add(session_id)
        return {"type": "create_session", "session_id": session_id}

    @router.post("/api/v1/session_heartbeat")
    async def heartbeat(request: fastapi.Request):
        body = await _json(request)
        if _need(body, "session_id") not in state.sessions:
            raise ServeError(404, f"unknown session {body['session_id']!r}")
        return {"type": "session_heartbeat"}

    @router.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        state.sessions.discard(session_id)
        return {}

    @router.post("/api/v1/cancel_future")
    async def cancel(request: fastapi.Request):
        await _json(request)
        return {}

    @router.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str):
        return {"checkpoints": tn.list_checkpoints(state.root, model_id), "cursor": None}


def _training_routes(router: fastapi.APIRouter, state: TinkerState) -> None:
    @router.post("/api/v1/create_model")
    async def create_model(request: fastapi.Request):
        body = await _json(request)
        state.check_model(_need(body, "base_model"))
        model_id = f"{_need(body, 'session_id')}:train:{int(body.get('model_seq_id') or 0)}"
        lora = body.get("lora_config") or {}
        req = tn.LoraRequest(
            rank=int(lora.get("rank", 32)),
            seed=lora.get("seed"),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_attn=bool(lora.get("train_attn", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
        )
        tn.lora_config(state.served.config, req)  # refuse a bad request before queueing
        state.check_capacity()

        def create():
            state.tenants[model_id] = tn.new_tenant(model_id, state.served.config, req)
            return {"type": "create_model", "model_id": model_id}

        return state.queue(create, model_id)

    @router.post("/api/v1/get_info")
    async def get_info(request: fastapi.Request):
        body = await _json(request)
        tenant = state.tenant(_need(body, "model_id"))
        return {
            "type": "get_info",
            "model_data": {
                "arch": state.served.config.family.value,
                "model_name": state.served.name,
                "tokenizer_id": state.tokenizer_id,
            },
            "model_id": tenant.model_id,
            "is_lora": True,
            "lora_rank": tenant.lora.rank,
            "model_name": state.served.name,
        }

    @router.post("/api/v1/forward_backward")
    async def forward_backward(request: fastapi.Request):
        body = await request.body()
        req = wire.decode_forward_backward(body, request.headers.get("content-encoding"))
        tenant = state.tenant(req.model_id)
        check_request(state.served, req)
        state.received += 1
        return state.queue(FwdBwd(tenant, req), req.model_id, proto=True)

    @router.post("/api/v1/optim_step")
    async def optim_step(request: fastapi.Request):
        body = await _json(request)
        tenant = state.tenant(_need(body, "model_id"))
        adam = body.get("adam_params") or body.get("optimizer_params") or {}
        if adam.get("type", "adam") not in ("adam", "adamw"):
            raise ServeError(400, f"optimizer {adam.get('type')!r} is not served; use AdamParams")
        return state.queue(lambda: {"metrics": tn.optim_step(tenant, adam)}, tenant.model_id)

    @router.post("/api/v1/save_weights")
    async def save_weights(request: fastapi.Request):
        body = await _json(request)
        tenant = state.tenant(_need(body, "model_id"))
        name = str(body.get("path") or f"step-{tenant.steps:06d}")
        tn.checkpoint_dir(state.root, tenant.model_id, "weights", name)  # check the name

        def save():
            path = tn.save(state.root, tenant, "weights", name, state.served.name)
            return {"type": "save_weights", "path": path}

        return state.queue(save, tenant.model_id)

    @router.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: fastapi.Request):
        body = await _json(request)
        tenant = state.tenant(_need(body, "model_id"))
        name = body.get("path")
        return state.queue(lambda: state.save_for_sampler(tenant, name, body), tenant.model_id)

    @router.post("/api/v1/load_weights")
    async def load_weights(request: fastapi.Request):
        body = await _json(request)
        path = str(_need(body, "path"))
        meta, arrays = tn.load(state.root, path)
        if body.get("model_id"):
            tenant = state.tenant(body["model_id"])
            model_id = tenant.model_id
        else:
            model_id = f"{_need(body, 'session_id')}:train:{int(body.get('model_seq_id') or 0)}"
            state.check_capacity()
            tenant = tn.new_tenant(model_id, state.served.config, tn.LoraRequest(**meta["lora"]))
        optimizer = bool(body.get("optimizer", False))

        def load():
            tn.restore(tenant, arrays, optimizer=optimizer)
            tenant.steps = int(meta.get("steps", 0))
            state.tenants[model_id] = tenant
            return {"type": "load_weights", "path": path, "model_id": model_id}

        return state.queue(load, model_id)


def _sampling_routes(router: fastapi.APIRouter, state: TinkerState) -> None:
    @router.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: fastapi.Request):
        body = await _json(request)
        sid = f"{_need(body, 'session_id')}:sample:{int(body.get('sampling_session_seq_id') or 0)}"
        path = body.get("model_path")
        if path:
            meta, arrays = tn.load(state.root, path)
            req = tn.LoraRequest(**meta["lora"])
            tenant = tn.new_tenant(sid, state.served.config, req)
            tn.restore(tenant, arrays, optimizer=False)
            state.samplers[sid] = Sampler(
                sid, state.served.name, path, tenant.adapters, tenant.lora
            )
        else:
            state.check_model(_need(body, "base_model"))
            state.samplers[sid] = Sampler(sid, state.served.name, None)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @router.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        s = state.sampler(sampler_id)
        return {"sampler_id": s.sampler_id, "base_model": s.base_model, "model_path": s.model_path}

    @router.post("/api/v1/asample")
    async def asample(request: fastapi.Request):
        body = await _json(request)
        if body.get("sampling_session_id"):
            sampler = state.sampler(body["sampling_session_id"])
        else:
            state.check_model(_need(body, "base_model"))
            sampler = Sampler("base", state.served.name, None)
        tokens = wire.tokens_of(_need(body, "prompt"), "prompt")
        vocab = state.served.config.vocab_size
        if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= vocab:
            raise ServeError(400, f"the prompt must be non-empty token ids in [0, {vocab})")
        n = int(body.get("num_samples", 1))
        if n < 1:
            raise ServeError(400, f"num_samples must be at least 1, got {n}")
        seed = next(state.seeds)
        rid_ids = [str(uuid.uuid4()) for _ in range(n)]
        out = state.queue(
            lambda: sample(state.served, sampler, body, tokens, seed, state.merged),
            None,
            proto=True,
        )
        return {**out, "sample_sequence_ids": rid_ids}


def _future_routes(router: fastapi.APIRouter, state: TinkerState) -> None:
    @router.post("/api/v1/retrieve_future")
    async def retrieve_future(request: fastapi.Request):
        body = await _json(request)
        rid = str(_need(body, "request_id"))
        held = state.futures.get(rid)
        if held is None:
            raise ServeError(404, f"unknown future {rid!r}")
        future, proto = held
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), POLL_S)
        except TimeoutError:
            return wire.try_again(rid)
        except (ServeError, JaxrlError) as e:
            return wire.failed(str(e))
        except Exception as e:  # the request failed on the device; the server goes on
            return wire.failed(f"{type(e).__name__}: {e}")
        state.delivered(rid)
        if proto:
            return Response(content=result, media_type=wire.PROTO)
        return result

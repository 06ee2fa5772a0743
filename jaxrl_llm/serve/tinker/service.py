"""The device side of the Tinker service: tenants' forward/backward batched over one base.

Everything here runs on the server's one :class:`jaxrl_llm.serve.EngineLoop` thread, through
one kind of work (``"tinker"``) whose handler keeps each tenant's requests in arrival order
(a ``forward_backward`` then an ``optim_step`` of the same tenant must not swap). Consecutive
``forward_backward`` calls of *different* tenants with the same loss are one jitted step: the
tenants' adapters are stacked along a leading tenant axis and the per-tenant loss is
``jax.vmap``-ed over it with the frozen base shared (multi-LoRA), their data padded to one
``[B, T]`` (rows to a power of two, columns to a multiple of 32, so few programs compile).
A tenant's loss is always computed by the same vmapped program, alone or with others.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.models.lora import LoRAConfig, attach_lora
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import ServeError
from jaxrl_llm.serve.tinker import wire
from jaxrl_llm.serve.tinker.losses import LOSSES
from jaxrl_llm.serve.tinker.tenants import Tenant, add_grads


@dataclasses.dataclass(frozen=True)
class FwdBwd:
    """One ``forward_backward`` (or ``forward``) of one tenant, checked and padded-ready."""

    tenant: Tenant
    request: wire.FwdBwdRequest


def check_request(served: ServedModel, request: wire.FwdBwdRequest) -> None:
    """Refuse (400) a request that cannot run, with one sentence naming the problem."""
    if request.loss_fn not in LOSSES:
        raise ServeError(
            400, f"loss_fn {request.loss_fn!r} is not served; use one of {sorted(LOSSES)}"
        )
    if not request.data:
        raise ServeError(400, "forward_backward got no data")
    vocab, context = served.config.vocab_size, served.config.max_position_embeddings
    needed = ("target_tokens", *LOSSES[request.loss_fn][1])
    for i, d in enumerate(request.data):
        n = len(d.tokens)
        if n == 0:
            raise ServeError(400, f"datum {i} has no tokens")
        if n > context:
            raise ServeError(400, f"datum {i} has {n} tokens, more than the context ({context})")
        bad = d.tokens[(d.tokens < 0) | (d.tokens >= vocab)]
        if bad.size:
            raise ServeError(400, f"datum {i} has token ids outside [0, {vocab}): {bad[:5]}")
        for name in needed:
            if name not in d.inputs:
                raise ServeError(400, f"datum {i}: loss {request.loss_fn!r} needs {name!r}")
        for name, arr in d.inputs.items():
            if arr.shape[:1] != (n,) or arr.ndim != 1:
                raise ServeError(
                    400,
                    f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(arr.shape)}, "
                    f"not [{n}] like model_input",
                )
        t = d.inputs["target_tokens"]
        if t.size and (t.min() < 0 or t.max() >= vocab):
            raise ServeError(400, f"datum {i} has target_tokens outside [0, {vocab})")


def _bucket(n: int, step: int) -> int:
    return max(step, math.ceil(n / step) * step)


def _rows(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pad_batch(
    requests: list[wire.FwdBwdRequest], names: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Tokens, targets, mask ``[N, B, T]`` and float inputs ``[N, B, T]`` of N tenants."""
    b = _rows(max(len(r.data) for r in requests))
    t = _bucket(max(len(d.tokens) for r in requests for d in r.data), 32)
    n = len(requests)
    tokens = np.zeros((n, b, t), np.int32)
    targets = np.zeros((n, b, t), np.int32)
    mask = np.zeros((n, b, t), np.int32)
    inputs = {k: np.zeros((n, b, t), np.float32) for k in names}
    for i, r in enumerate(requests):
        for j, d in enumerate(r.data):
            m = len(d.tokens)
            tokens[i, j, :m] = d.tokens
            targets[i, j, :m] = d.inputs["target_tokens"]
            mask[i, j, :m] = 1
            for k in names:
                inputs[k][i, j, :m] = d.inputs[k]
    return tokens, targets, mask, inputs


def tenant_loss(
    adapters: Any,
    base: Any,
    tokens: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    inputs: dict[str, jax.Array],
    *,
    config: models.ModelConfig,
    lora: LoRAConfig,
    loss_fn: Callable,
    loss_config: dict[str, float],
) -> tuple[jax.Array, jax.Array]:
    """One tenant's summed loss and its per-token log-probs ``[B, T]`` (0 on padding)."""
    params = attach_lora(base, adapters, lora)
    logits, _ = models.forward(params, tokens, config=config, attention_mask=mask)
    logp = jnp.where(mask > 0, token_logprobs(logits, targets), 0.0)
    return loss_fn(logp, inputs, mask, loss_config), logp


@functools.lru_cache(maxsize=64)
def fwd_bwd_program(
    config: models.ModelConfig,
    lora: LoRAConfig,
    loss_name: str,
    loss_items: tuple[tuple[str, float], ...],
    forward_only: bool,
) -> Callable:
    """``(adapters [N, ...], base, tokens, targets, mask, inputs [N, B, T]) ->
    (loss [N], logp [N, B, T], grads [N, ...] or None)``, jitted, vmapped over tenants."""
    one = functools.partial(
        tenant_loss,
        config=config,
        lora=lora,
        loss_fn=LOSSES[loss_name][0],
        loss_config=dict(loss_items),
    )

    def per_tenant(adapters, base, tokens, targets, mask, inputs):
        if forward_only:
            loss, logp = one(adapters, base, tokens, targets, mask, inputs)
            return loss, logp, None
        (loss, logp), grads = jax.value_and_grad(one, has_aux=True)(
            adapters, base, tokens, targets, mask, inputs
        )
        return loss, logp, grads

    return jax.jit(jax.vmap(per_tenant, in_axes=(0, None, 0, 0, 0, 0)))


class Batcher:
    """Runs queued ``forward_backward`` calls of several tenants as one step each."""

    def __init__(self, served: ServedModel):
        self.served = served
        #: jitted steps run, and how many tenants each carried (a test reads how calls batched)
        self.steps: list[int] = []

    def run(self, works: list[FwdBwd]) -> list[Any]:
        """Results (or returned exceptions) of ``works``: distinct tenants, arrival order."""
        groups: dict[tuple, list[int]] = {}
        for i, w in enumerate(works):
            r = w.request
            key = (w.tenant.lora, r.loss_fn, tuple(sorted(r.loss_config.items())), r.forward_only)
            groups.setdefault(key, []).append(i)
        results: list[Any] = [None] * len(works)
        for key, idx in groups.items():
            outs: list[Any]
            try:
                outs = list(self._group(key, [works[i] for i in idx]))
            except Exception as e:  # one group's failure is its tenants' only
                outs = [e] * len(idx)
            for i, o in zip(idx, outs):
                results[i] = o
        return results

    def _group(self, key: tuple, works: list[FwdBwd]) -> list[bytes]:
        lora, loss_name, loss_items, forward_only = key
        names = LOSSES[loss_name][1]
        requests = [w.request for w in works]
        tokens, targets, mask, inputs = pad_batch(requests, names)
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[w.tenant.adapters for w in works])
        program = fwd_bwd_program(self.served.config, lora, loss_name, loss_items, forward_only)
        loss, logp, grads = program(stacked, self.served.params, tokens, targets, mask, inputs)
        self.steps.append(len(works))
        loss, logp = np.asarray(loss), np.asarray(logp)
        out = []
        for i, w in enumerate(works):
            if grads is not None:
                add_grads(w.tenant, jax.tree.map(lambda g, i=i: g[i], grads))
            per_datum = []
            for j, d in enumerate(w.request.data):
                lp = logp[i, j, : len(d.tokens)]
                record = {"logprobs": lp}
                if loss_name == "cross_entropy":
                    record["elementwise_loss"] = -lp * d.inputs["weights"].astype(np.float32)
                per_datum.append(record)
            metrics = {"loss:sum": float(loss[i])}
            out.append(wire.encode_forward_backward_output(per_datum, metrics))
        return out

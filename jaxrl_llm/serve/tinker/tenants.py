"""A Tinker tenant: its own LoRA adapters and Adam state over the one shared, frozen base.

A tenant is what ``ServiceClient.create_lora_training_client`` creates (Tinker calls it a
model, ``model_id = "{session_id}:train:{seq}"``). Its adapters are
:func:`jaxrl_llm.models.lora.init_lora` over the served base (attention q/k/v/o with
``train_attn``, MLP gate/up/down with ``train_mlp``; α = 32, the setting of Schulman et al.
2025, "LoRA Without Regret"); gradients of ``forward_backward`` calls add up in the tenant
until ``optim_step(AdamParams)`` applies them with optax's AdamW (learning rate, betas, eps,
decoupled weight decay as the client sends them, changed per step through
``optax.inject_hyperparams``; ``grad_clip_norm`` > 0 clips the global norm first).

Checkpoints are directories under ``--output-dir``: ``{run}/weights/{name}`` (adapters and
optimizer: ``save_state``) or ``{run}/sampler_weights/{name}`` (adapters only:
``save_weights_for_sampler``), each ``arrays.npz`` + ``meta.json``; their Tinker path is
``tinker://{model_id}/{kind}/{name}``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.models import ModelConfig
from jaxrl_llm.models.lora import LoRAConfig, init_lora
from jaxrl_llm.models.params import param_shapes_and_axes
from jaxrl_llm.serve.server import ServeError

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALPHA = 32.0
KINDS = {"weights": "training", "sampler_weights": "sampler"}


@dataclasses.dataclass(frozen=True)
class LoraRequest:
    """What the client asked for (``LoraConfig`` of the SDK)."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclasses.dataclass
class Tenant:
    """One training client's state; mutated only on the engine loop's thread."""

    model_id: str
    request: LoraRequest
    lora: LoRAConfig
    adapters: Any
    opt_state: Any
    grads: Any = None
    steps: int = 0


def make_optimizer() -> optax.GradientTransformation:
    """AdamW whose hyperparameters live in its state (set before each step)."""
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=1e-4, b1=0.9, b2=0.95, eps=1e-12, weight_decay=0.0
    )


def lora_config(config: ModelConfig, request: LoraRequest) -> LoRAConfig:
    """The :class:`LoRAConfig` of a request over ``config``'s projections."""
    if request.rank < 1:
        raise ServeError(400, f"LoRA rank must be at least 1, got {request.rank}")
    have = param_shapes_and_axes(config)["layers"]
    wanted = (ATTN if request.train_attn else ()) + (MLP if request.train_mlp else ())
    targets = tuple(t for t in wanted if t in have)
    if not targets:
        raise ServeError(400, "train_attn and train_mlp are both off: no projection to adapt")
    return LoRAConfig(rank=request.rank, alpha=ALPHA, targets=targets)


def new_tenant(model_id: str, config: ModelConfig, request: LoraRequest) -> Tenant:
    """A tenant at the base model (B = 0) with fresh Adam moments."""
    lora = lora_config(config, request)
    seed = 0 if request.seed is None else int(request.seed)
    adapters = init_lora(config, lora, jax.random.PRNGKey(seed))
    return Tenant(model_id, request, lora, adapters, make_optimizer().init(adapters))


def add_grads(tenant: Tenant, grads: Any) -> None:
    """Accumulate one forward_backward's gradients."""
    tenant.grads = grads if tenant.grads is None else jax.tree.map(jnp.add, tenant.grads, grads)


@jax.jit
def _step(adapters, opt_state, grads, hyper, clip):
    norm = optax.global_norm(grads)
    scale = jnp.where((clip > 0) & (norm > clip), clip / jnp.maximum(norm, 1e-30), 1.0)
    grads = jax.tree.map(lambda g: g * scale, grads)
    opt_state.hyperparams.update(hyper)
    updates, opt_state = make_optimizer().update(grads, opt_state, adapters)
    return optax.apply_updates(adapters, updates), opt_state, norm


def optim_step(tenant: Tenant, adam: dict[str, Any]) -> dict[str, float]:
    """Apply the accumulated gradients with the client's ``AdamParams``; returns metrics."""
    if tenant.grads is None:
        tenant.grads = jax.tree.map(jnp.zeros_like, tenant.adapters)
    hyper = {
        "learning_rate": jnp.float32(adam.get("learning_rate", 1e-4)),
        "b1": jnp.float32(adam.get("beta1", 0.9)),
        "b2": jnp.float32(adam.get("beta2", 0.95)),
        "eps": jnp.float32(adam.get("eps", 1e-12)),
        "weight_decay": jnp.float32(adam.get("weight_decay", 0.0)),
    }
    clip = jnp.float32(adam.get("grad_clip_norm", 0.0))
    tenant.adapters, tenant.opt_state, norm = _step(
        tenant.adapters, tenant.opt_state, tenant.grads, hyper, clip
    )
    tenant.grads = None
    tenant.steps += 1
    return {"grad_norm:mean": float(norm), "step:max": float(tenant.steps)}


# ----- checkpoints ------------------------------------------------------------------------------


def tinker_path(model_id: str, kind: str, name: str) -> str:
    """``tinker://{model_id}/{kind}/{name}``."""
    return f"tinker://{model_id}/{kind}/{name}"


def parse_path(path: str) -> tuple[str, str, str]:
    """``(model_id, kind, name)`` of a Tinker path; a 400 names what is wrong."""
    parts = path[len("tinker://") :].split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in KINDS or not parts[2]:
        raise ServeError(
            400, f"{path!r} is not a checkpoint path (tinker://RUN/weights|sampler_weights/NAME)"
        )
    return parts[0], parts[1], parts[2]


def checkpoint_dir(root: pathlib.Path, model_id: str, kind: str, name: str) -> pathlib.Path:
    """Where a checkpoint lives under ``--output-dir``."""
    if "/" in name or name in ("", ".", ".."):
        raise ServeError(400, f"checkpoint name {name!r} must be one path segment")
    return root / model_id / kind / name


def _leaves(tree: Any) -> dict[str, np.ndarray]:
    return {f"{i:05d}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(tree))}


def save(root: pathlib.Path, tenant: Tenant, kind: str, name: str, base_model: str) -> str:
    """Write the tenant's adapters (and its optimizer for ``weights``); returns the path."""
    d = checkpoint_dir(root, tenant.model_id, kind, name)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {f"adapters/{k}": v for k, v in _leaves(tenant.adapters).items()}
    if kind == "weights":
        arrays.update({f"opt/{k}": v for k, v in _leaves(tenant.opt_state).items()})
    with open(d / "arrays.npz", "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    meta = {
        "base_model": base_model,
        "lora": dataclasses.asdict(tenant.request),
        "steps": tenant.steps,
        "time": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    (d / "meta.json").write_text(json.dumps(meta))
    return tinker_path(tenant.model_id, kind, name)


def load(root: pathlib.Path, path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a saved checkpoint; a 404 when there is none."""
    model_id, kind, name = parse_path(path)
    d = checkpoint_dir(root, model_id, kind, name)
    if not (d / "meta.json").exists():
        raise ServeError(404, f"no checkpoint at {path}")
    with np.load(d / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads((d / "meta.json").read_text()), arrays


def restore(tenant: Tenant, arrays: dict[str, np.ndarray], *, optimizer: bool) -> None:
    """Put saved adapters (and optimizer state) into ``tenant`` (same LoRA shapes)."""

    def fill(tree, prefix):
        leaves, treedef = jax.tree.flatten(tree)
        saved = [arrays[f"{prefix}/{i:05d}"] for i in range(len(leaves))]
        return jax.tree.unflatten(treedef, [jnp.asarray(s, x.dtype) for s, x in zip(saved, leaves)])

    tenant.adapters = fill(tenant.adapters, "adapters")
    if optimizer:
        if "opt/00000" not in arrays:
            raise ServeError(400, "this checkpoint has no optimizer state (a sampler checkpoint)")
        tenant.opt_state = fill(tenant.opt_state, "opt")
    tenant.grads = None


def list_checkpoints(root: pathlib.Path, model_id: str) -> list[dict[str, Any]]:
    """Every checkpoint of a run, in the SDK's ``Checkpoint`` shape."""
    out = []
    for kind, ctype in KINDS.items():
        for d in sorted((root / model_id / kind).glob("*/meta.json")):
            meta = json.loads(d.read_text())
            out.append(
                {
                    "checkpoint_id": f"{kind}/{d.parent.name}",
                    "checkpoint_type": ctype,
                    "time": meta["time"],
                    "tinker_path": tinker_path(model_id, kind, d.parent.name),
                    "size_bytes": (d.parent / "arrays.npz").stat().st_size,
                }
            )
    return out

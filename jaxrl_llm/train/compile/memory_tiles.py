"""TPU tile layouts of the trained weights, and the optimizer update they make out of place.

A TPU array's two minor dimensions are tiled (8 × 128 for float32), so a minor dimension that is
not a multiple of 128 is padded. For an argument of a compiled program XLA's TPU backend picks
the layout itself: as its minor dimension, the one padded least (ties: the last dimension,
the default layout). The gradient is formed in the default layout, so a weight that XLA laid
out otherwise is updated out of place: AdamW's weight and two moments are copied into the
gradient's layout and their new values formed there, six float32 copies of the weight's shard,
one weight after another.

Measured (issue 41): gpt-oss-20b's GRPO step compiled for v5p:2x2x2 with fsdp=8, where the
width 2,880 splits into shards of 360 (padded to 384). The entry layout of each of its 18
float32 argument shapes is the one this rule picks: ``experts_down`` ``f32[24,32,2880,360]``
is laid out ``{2,3,1,0}`` (2,880 minor), the embedding ``f32[201088,360]`` ``{0,1}``, the
query kernel ``f32[24,360,64,64]`` ``{1,3,2,0}``; ``experts_gate`` / ``experts_up``
``f32[24,32,360,2880]`` keep the default. The buffer report's peak of temporaries is in the
optimizer update: ``experts_down``'s weight and moments copied to ``{3,2,1,0}`` and the fused
update's three results, six ``f32[24,32,2880,360]`` of 3.16 GiB (19.0 GiB), more than the
backward pass's 14.0 GiB. On the other benchmark meshes Llama-3-8B / 70B and Qwen3-MoE re-lay
nothing and Qwen3.5 only small kernels (``in_proj_a`` / ``in_proj_b``, ``f32[24,1024,32]`` on
fsdp=4): their estimates are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.params import param_shapes_and_axes
from jaxrl_llm.parallel.rules import DEFAULT_RULES

#: The lane width of a TPU tile: a minor dimension is padded to a multiple of it.
TPU_LANE = 128


def shard_shape(
    shape: tuple[int, ...], logical_axes: tuple[str | None, ...], mesh: Mapping[str, int]
) -> tuple[int, ...]:
    """One device's shard of an array: each dimension divided by the mesh axes its logical
    name maps to (:data:`~jaxrl_llm.parallel.rules.DEFAULT_RULES`), a mesh axis used once per
    array, a dimension they do not divide left whole (as ``logical_to_spec`` falls back)."""
    used: set[str] = set()
    out = []
    for size, logical in zip(shape, logical_axes, strict=True):
        rule = DEFAULT_RULES.get(logical) if logical is not None else None
        names = (rule,) if isinstance(rule, str) else tuple(rule or ())
        names = tuple(n for n in names if mesh.get(n, 1) > 1 and n not in used)
        split = math.prod(mesh[n] for n in names)
        if names and size % split == 0:
            used.update(names)
            size //= split
        out.append(size)
    return tuple(out)


def _padding(n: int) -> float:
    return (-(-n // TPU_LANE) * TPU_LANE) / n


def tpu_minor_dim(shape: tuple[int, ...]) -> int:
    """The dimension XLA's TPU backend lays out minor for an argument of this shape: the one
    padded least to a multiple of :data:`TPU_LANE`, the last one on a tie."""
    last = len(shape) - 1
    return min(range(len(shape)), key=lambda d: (_padding(shape[d]), d != last))


def padded_elements(shape: tuple[int, ...]) -> int:
    """Elements of an array in the default layout (last dimension minor), padded to a
    multiple of :data:`TPU_LANE`."""
    return math.prod(shape[:-1]) * -(-shape[-1] // TPU_LANE) * TPU_LANE


def relaid_weights(config: ModelConfig, mesh: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """``path -> shard shape`` of the weights whose TPU layout is not the default
    (:func:`tpu_minor_dim` is not their last dimension) on a mesh of these axis sizes."""
    out: dict[str, tuple[int, ...]] = {}

    def walk(tree: dict[str, Any], path: str) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, f"{path}{k}/")
                continue
            shape, axes = v
            shard = shard_shape(shape, axes, mesh)
            if len(shard) > 1 and tpu_minor_dim(shard) != len(shard) - 1:
                out[path + k] = shard

    walk(param_shapes_and_axes(config), "")
    return out


def relaid_update_bytes(config: ModelConfig, mesh: Mapping[str, int], *, arrays: int = 3) -> int:
    """Bytes per device of the optimizer update's out-of-place copies on TPU (full fine-tuning):
    the ``arrays`` float32 arrays the update rewrites per weight (3 with AdamW: the weight and
    its two moments), each copied into the gradient's layout and formed anew there, of the
    largest re-laid weight's shard, padded as the default layout pads it; 0 when no weight is
    re-laid. The weights are updated one after another: the largest sets the peak."""
    shards = relaid_weights(config, mesh).values()
    return 2 * arrays * 4 * max((padded_elements(s) for s in shards), default=0)

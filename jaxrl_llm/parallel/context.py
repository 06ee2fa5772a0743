"""Context parallelism in a training run: the mesh the model's ring attention reads, and the
token layout of a train step's batch.

With a mesh whose ``context`` axis has C > 1 devices, every row's T tokens are split into C
contiguous blocks (:func:`jaxrl_llm.parallel.token_sharding`) and the model's self-attention
runs as ring attention over that axis (Liu, Zaharia & Abbeel 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context", https://arxiv.org/abs/2310.01889;
:mod:`jaxrl_llm.models.ring_attention`). The model finds the axis in the ambient mesh, so a
forward must be traced under it: :func:`under_mesh` binds a mesh to a function (the policy's
``apply_fn``, the train step) without making it global. T must be a multiple of C; the
trainers pad it (``jaxrl_llm.data.pad_length``), and padding changes no result (masked tokens
enter no sum and no denominator).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
from jax.sharding import Mesh

from jaxrl_llm.models.ring_attention import CONTEXT_AXIS
from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, batch_sharding_tree

F = TypeVar("F", bound=Callable[..., Any])


def context_size(mesh: Mesh | Mapping[str, int]) -> int:
    """C, the size of the mesh's ``context`` axis (1 when it has none). ``mesh`` is a
    ``Mesh`` or a ``{axis: size}`` dict."""
    shape = mesh if isinstance(mesh, Mapping) else mesh.shape
    return int(shape.get(CONTEXT_AXIS, 1))


def batch_split(mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> int:
    """How many ways the mesh splits a batch's rows: the product of the ``batch`` rule's
    mesh axes (data × fsdp by default). Above 1, the train step traces the model under the
    mesh so that its activations are placed by rows (:mod:`jaxrl_llm.models.layout`)."""
    axes = rules.get("batch")
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    size = 1
    for n in names:
        size *= int(mesh.shape.get(n, 1))
    return size


def _tracing(tree: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def under_mesh(fn: F, mesh: Mesh) -> F:
    """``fn`` run with ``mesh`` as the ambient mesh, so that the model's attention sees its
    ``context`` axis (and goes round the ring when it is > 1) and its activations are placed
    by rows over the batch axes (:mod:`jaxrl_llm.models.layout`).

    Traced (inside ``jax.jit``), the mesh is entered with
    ``jax.sharding.use_abstract_mesh`` (``jax.set_mesh`` may not be used under jit); called
    with concrete arrays, with ``jax.set_mesh``. Nothing stays set after the call: the mesh is
    passed explicitly, never left global.
    """

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if _tracing((args, kwargs)):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                return fn(*args, **kwargs)
        with jax.set_mesh(mesh):
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def check_token_lengths(batch: Mapping[str, Any], size: int) -> None:
    """Every ``*input_ids`` leaf's T must be a multiple of the context size ``size``.

    Raises:
      ValueError: naming the key, its T and the size (pad with ``jaxrl_llm.data.pad_length``).
    """
    for key, x in batch.items():
        if key.endswith("input_ids") and jax.numpy.ndim(x) >= 2 and x.shape[1] % size:
            raise ValueError(
                f"batch[{key!r}] has {x.shape[1]} tokens per row, not a multiple of the mesh's "
                f"context axis ({size}); pad it with jaxrl_llm.data.pad_length"
            )


def constrain_batch(
    batch: Mapping[str, Any], mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> dict[str, Any]:
    """``batch`` (inside jit) constrained to :func:`~jaxrl_llm.parallel.batch_sharding_tree`:
    rows over data × fsdp and, on a context mesh, the tokens of every ``[B, T, ...]`` leaf over
    ``context``, so that embeddings, MLPs and log-probs run on each device's own block.
    Arrays that arrive with rows split only are sliced locally (no communication)."""
    batch = dict(batch)
    return jax.lax.with_sharding_constraint(batch, batch_sharding_tree(batch, mesh, rules))

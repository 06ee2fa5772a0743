"""The learner batch as data: each entry's key, symbolic dimensions and dtype
(:class:`BatchField`), a batch's whole layout (:class:`BatchLayout`, checked with
:meth:`BatchLayout.check`, lowered on :meth:`BatchLayout.abstract`), the losses' layouts by
``LossSpec.batch_kind`` (:data:`KIND_FIELDS`) with what a reference pass, routing replay and
PPO's critic add, and the packed layout (:func:`packed_layout`). The run plan
(:mod:`jaxrl_llm.train.config.plan`) picks a run's layout from these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BatchField:
    """One learner batch entry.

    Attributes:
      name: the batch key.
      dims: symbolic dimensions: ``rows`` (sequences), ``tokens`` (T, the padded length) or
        ``window`` (W, a packed batch's completion window); ``packed_rows`` / ``packed_len``
        for a packed batch's model inputs; ``layers`` / ``topk`` (L, k of a mixture of
        experts: :data:`ROUTING_FIELD`); ``teacher_tokens`` (T', a distillation teacher's
        own rows: its prompt, then the same completion columns).
      dtype: ``int32`` or ``float32``.
    """

    name: str
    dims: tuple[str, ...]
    dtype: str


def int_fields(*names: str, dims=("rows", "tokens")) -> tuple[BatchField, ...]:
    """``int32`` entries ``names``, each with ``dims``."""
    return tuple(BatchField(n, dims, "int32") for n in names)


def float_fields(*names: str, dims=("rows", "tokens")) -> tuple[BatchField, ...]:
    """``float32`` entries ``names``, each with ``dims``."""
    return tuple(BatchField(n, dims, "float32") for n in names)


def _sequence(prefix: str = "") -> tuple[BatchField, ...]:
    return int_fields(f"{prefix}input_ids", f"{prefix}attention_mask", f"{prefix}loss_mask")


#: The losses' batch layouts (``LossSpec.batch_kind``; the losses package docstring), without
#: their optional entries: the reference's and a rollout correction's.
KIND_FIELDS: dict[str, tuple[BatchField, ...]] = {
    "sequence": _sequence(),
    "rl": _sequence() + float_fields("old_logp", "advantages"),
    "preference": _sequence("chosen_") + _sequence("rejected_"),
    "kto": _sequence() + _sequence("kl_") + float_fields("label", dims=("rows",)),
    "rank": _sequence() + float_fields("scores", dims=("rows",)),
    # GKD: the teacher runs in the step on its own prompt + the same completion columns
    "distill": _sequence()
    + float_fields("old_logp", "advantages")
    + int_fields("teacher_input_ids", "teacher_attention_mask", dims=("rows", "teacher_tokens")),
}
#: What each layout's reference pass adds (``LossSpec.reference_fn``'s keys).
REFERENCE_FIELDS: dict[str, tuple[BatchField, ...]] = {
    "rl": float_fields("ref_logp"),
    "preference": float_fields("ref_chosen_logps", "ref_rejected_logps", dims=("rows",)),
    "kto": float_fields("ref_logps", "ref_kl_logps", dims=("rows",)),
}
# a mixture of experts' recorded routing (``rollout.routing_replay`` / ``record_routing``, R3):
# each token's top-k experts per layer, over the whole row as ``input_ids``
ROUTING_FIELD = BatchField("routing", ("rows", "tokens", "layers", "topk"), "int32")
# ... and a preference batch's (online DPO), one per side, aligned with ``{side}_input_ids``
PAIR_ROUTING_FIELDS = tuple(
    dataclasses.replace(ROUTING_FIELD, name=f"{side}_routing") for side in ("chosen", "rejected")
)
# PPO's critic update reads these beside the actor's batch (the actor's step does not take them)
CRITIC_FIELDS: tuple[BatchField, ...] = float_fields("values", "returns")


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """A learner batch's keys, symbolic dimensions and dtypes (see :class:`BatchField`).

    Attributes:
      kind: the loss's ``batch_kind``.
      fields: the entries, in order.
    """

    kind: str
    fields: tuple[BatchField, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The batch keys."""
        return tuple(f.name for f in self.fields)

    def with_fields(self, *fields: BatchField) -> BatchLayout:
        """This layout with ``fields`` added."""
        return dataclasses.replace(self, fields=self.fields + tuple(fields))

    def without(self, *names: str) -> BatchLayout:
        """This layout without the entries ``names``."""
        return dataclasses.replace(
            self, fields=tuple(f for f in self.fields if f.name not in names)
        )

    def shapes(self, **sizes: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{key: (shape, dtype)}`` for concrete sizes of the symbolic dimensions."""
        return {f.name: (tuple(sizes[d] for d in f.dims), f.dtype) for f in self.fields}

    def abstract(self, sharding: Any = None, **sizes: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The batch as ``ShapeDtypeStruct``s (nothing allocated), each with ``sharding``."""
        return {
            k: jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)
            for k, (shape, dtype) in self.shapes(**sizes).items()
        }

    def check(self, batch: Mapping[str, Any], *, where: str) -> None:
        """Raise unless ``batch`` holds exactly these keys, each with its rank and dtype and
        one size per symbolic dimension across entries.

        Raises:
          ValueError: naming ``where`` (the code that built the batch) and the mismatch.
        """
        got, want = set(batch), set(self.names)
        if got != want:
            raise ValueError(
                f"{where}: the {self.kind} learner batch has keys {sorted(got)}; the run plan's "
                f"layout is {sorted(want)} (missing {sorted(want - got)}, extra "
                f"{sorted(got - want)})"
            )
        seen: dict[str, int] = {}
        for f in self.fields:
            x = batch[f.name]
            shape = np.shape(x)
            dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
            if len(shape) != len(f.dims) or np.dtype(dtype) != np.dtype(f.dtype):
                raise ValueError(
                    f"{where}: {f.name} is {dtype}{list(shape)}; the run plan's layout has "
                    f"{f.dtype}[{', '.join(f.dims)}]"
                )
            for d, n in zip(f.dims, shape, strict=True):
                if seen.setdefault(d, int(n)) != n:
                    raise ValueError(
                        f"{where}: {f.name}'s {d} is {n}, another entry's is {seen[d]}"
                    )


SEQUENCE_LAYOUT = BatchLayout("sequence", KIND_FIELDS["sequence"])
"""Token ids and masks: what a log-prob forward (the correction's recompute) reads."""
CRITIC_LAYOUT = BatchLayout("critic", KIND_FIELDS["sequence"] + CRITIC_FIELDS)
"""The batch PPO's critic update takes (its loss reads the values and returns)."""


def packed_layout(layout: BatchLayout) -> BatchLayout:
    """The ``rl`` layout after :func:`jaxrl_llm.data.pack_rl_batch`: the model inputs as
    packed rows (with ``segment_ids`` and ``positions``), every per-token entry cut to the
    completion window, and ``unpack_index`` pointing each at its packed token."""
    packed = ("packed_rows", "packed_len")
    out = []
    for f in layout.fields:
        if f.name in ("input_ids", "attention_mask"):
            out.append(dataclasses.replace(f, dims=packed))
        elif f.name == ROUTING_FIELD.name:  # packed as the model inputs are
            out.append(dataclasses.replace(f, dims=(*packed, *f.dims[2:])))
        elif f.dims == ("rows", "tokens"):
            out.append(dataclasses.replace(f, dims=("rows", "window")))
        else:
            out.append(f)
    out += [*int_fields("segment_ids", "positions", dims=packed)]
    out += [*int_fields("unpack_index", dims=("rows", "window"))]
    return BatchLayout(layout.kind, tuple(out))

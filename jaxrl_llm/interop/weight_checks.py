"""Checks on weights read from a file before they become parameters: every tensor floating
point (anything else means a corrupt or foreign file), NaN values counted and reported in one
line. Used by import (:mod:`.state_dict`) and export (:mod:`.export`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.errors import ModelLoadError

__all__ = ["check_weights", "float_weight", "nan_warning", "to_numpy"]

# numpy dtype kinds that are not weights: integers, booleans, complex, objects, strings, times.
_NOT_FLOAT = "iubcOSUMm"


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view of a numpy / jax / torch tensor (torch bf16 is widened to float32)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        t = x.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def float_weight(name: str, value: Any, *, source: str) -> np.ndarray:
    """``value`` as numpy (:func:`to_numpy`), refused in one line unless floating point."""
    w = to_numpy(value)
    if w.dtype.kind in _NOT_FLOAT:
        raise ModelLoadError(
            f"{source}: weight {name!r} has dtype {w.dtype}; model weights must be "
            f"floating point (float32, bfloat16 or float16)"
        )
    return w


def check_weights(tensors: Mapping[str, Any], *, source: str = "weights") -> dict[str, int]:
    """Refuse non-floating weights and count NaN values, tensor by tensor.

    A model's weights are floating point; an integer, boolean or complex tensor means a
    corrupt or foreign file (casting it to float would load garbage silently).

    Args:
      tensors: name -> array (numpy, jax or torch).
      source: how to name the input in the error.

    Returns:
      name -> number of NaN values, for the tensors that hold any.

    Raises:
      ModelLoadError: a tensor is not floating point, naming it and its dtype.
    """
    nans: dict[str, int] = {}
    for name, value in tensors.items():
        w = float_weight(name, value, source=source)
        n = int(np.count_nonzero(np.isnan(w.astype(np.float32, copy=False))))
        if n:
            nans[name] = n
    return nans


def nan_warning(nans: Mapping[str, int], *, source: str) -> str:
    """One line for :func:`check_weights`'s NaN counts: the total and the first tensors."""
    total = sum(nans.values())
    first = ", ".join(f"{k} ({v})" for k, v in sorted(nans.items())[:3])
    more = f" and {len(nans) - 3} more" if len(nans) > 3 else ""
    return f"{source}: {total} NaN weight value(s) in {len(nans)} tensor(s): {first}{more}"

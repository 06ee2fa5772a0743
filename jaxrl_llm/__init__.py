"""jaxrl_llm: post-training language models with RL and preference optimisation, in JAX.

Conventions used across the package:

* Token data is batch-major ``[B, T]``. ``mask`` is ``[B, T]`` with 1 for a real token and
  0 for padding; it is always passed explicitly.
* Groups (G samples of one prompt) are consecutive rows of ``group_size``.
* Losses are minimised: ``loss = -objective``.

Layers (imports point up this list, never down): ops, objectives, models, interop, sampling,
rewards, losses, parallel, train, data, cli. ``docs/ARCHITECTURE.md`` in the repository maps the layers.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

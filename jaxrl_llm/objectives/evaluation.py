"""Evaluation metrics computed on the host (NumPy, float64): the unbiased pass@k estimator."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.errors import ConfigError


def pass_at_k(num_samples, num_correct, *, k: int) -> np.ndarray:
    """Unbiased pass@k from n samples of which c are correct: ``1 − C(n−c, k) / C(n, k)``.

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
    (https://arxiv.org/abs/2107.03374), eq. 1: the probability that at least one of k
    samples drawn without replacement from the n is correct. Computed as the product
    ``C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)`` (their numerically stable form), with
    no factorials, so it is exact to float64 rounding for n up to thousands; it is 1 when
    ``n − c < k``. pass@1 is ``c/n``. Average the result over problems for the benchmark score.

    Example::

        pass_at_k([16, 16], [0, 4], k=8)   # array([0.   , 0.96153846])

    Args:
      num_samples: n per problem, an int or an integer array.
      num_correct: c per problem, broadcastable against ``num_samples``, ``0 ≤ c ≤ n``.
      k: the number of attempts, ``1 ≤ k ≤ min(n)``.

    Returns:
      float64 array of the broadcast shape (0-d for scalar inputs), values in [0, 1].

    Raises:
      ConfigError: non-integer counts, ``c > n``, negative counts, or ``k`` outside
        ``[1, n]`` for some problem.
    """
    n = np.asarray(num_samples)
    c = np.asarray(num_correct)
    for name, x in (("num_samples", n), ("num_correct", c)):
        whole = np.issubdtype(x.dtype, np.integer) or np.all(np.equal(np.mod(x, 1), 0))
        if x.size and not whole:
            raise ConfigError(f"pass_at_k: {name} must hold whole numbers")
    n, c = np.broadcast_arrays(n.astype(np.int64), c.astype(np.int64))
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ConfigError(f"pass_at_k: k={k!r} must be a positive integer")
    k = int(k)
    if np.any(c < 0) or np.any(c > n):
        raise ConfigError("pass_at_k: need 0 <= num_correct <= num_samples for every problem")
    if np.any(n < k):
        raise ConfigError(
            f"pass_at_k: k={k} exceeds num_samples={int(n.min())} for some "
            f"problem; pass@k needs at least k samples"
        )
    width = int(c.max()) if c.size else 0
    # Row j of the product holds i = n − c + 1 + j for j < c, and the neutral 1 beyond.
    j = np.arange(width, dtype=np.int64)
    i = (n - c + 1)[..., None] + j
    active = j < c[..., None]
    terms = np.where(active, 1.0 - k / np.where(active, i, 1).astype(np.float64), 1.0)
    return 1.0 - np.prod(terms, axis=-1)

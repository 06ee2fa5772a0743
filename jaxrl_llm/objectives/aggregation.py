"""Reducing per-token losses to a scalar, exactly, also across micro-batches and devices.

Every mode is a ratio ``num / den`` where ``num`` is a sum over rows and ``den`` depends only
on the mask. :func:`aggregate_parts` returns the pair: summing ``num`` and ``den`` over
micro-batches (or ``psum`` over devices) and dividing once gives exactly the value of
:func:`aggregate` on the whole batch, for every mode.

Modes (``l`` per-token loss ``[B, T]``, ``m`` mask ``[B, T]``, ``n_b = Σ_t m_bt``,
``B' = #{b : n_b > 0}`` the rows with at least one valid token):

* ``token_mean``:              Σ_bt l·m / Σ_bt m  (DAPO, https://arxiv.org/abs/2503.14476;
  TRL ``loss_type="dapo"``, verl ``token-mean``, OpenRLHF default).
* ``seq_mean_token_mean``:     (1/B') Σ_b (Σ_t l·m / n_b)  (original GRPO, DeepSeekMath
  https://arxiv.org/abs/2402.03300 eq. 3; verl ``seq-mean-token-mean``).
* ``seq_mean_token_sum``:      (1/B') Σ_b Σ_t l·m  (verl ``seq-mean-token-sum``).
* ``seq_mean_token_sum_norm``: Σ_bt l·m / (B'·max_len)  (Dr. GRPO,
  https://arxiv.org/abs/2503.20783, constant normaliser; verl ``seq-mean-token-sum-norm``,
  TRL ``loss_type="dr_grpo"``).

Rows without any valid token do not count in the per-sequence modes (they add 0 to ``num``
and 0 to ``den``), so padding rows change nothing. verl divides by all B rows instead
(``count_empty_rows=True``); the two agree whenever every row has a valid token.
"""

from __future__ import annotations

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import coerce_enum
from jaxrl_llm.ops.masked import masked_count, masked_sum, safe_divide


class AggregationMode(str, enum.Enum):
    """How per-token values reduce to a scalar (see :mod:`jaxrl_llm.objectives.aggregation`)."""

    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"


def _check(mode, max_len) -> AggregationMode:
    mode = coerce_enum(AggregationMode, mode, "aggregation mode")
    if mode is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM and (max_len is None or max_len <= 0):
        raise ConfigError(
            f"aggregation mode 'seq_mean_token_sum_norm' needs max_len > 0 (got {max_len!r});"
            " pass the maximum response length used at generation"
        )
    return mode


def aggregation_denominator(
    mask: jax.Array,
    *,
    mode: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    count_empty_rows: bool = False,
) -> jax.Array:
    """The denominator of :func:`aggregate`; depends only on the mask.

    ``token_mean``: Σ m; ``seq_mean_token_mean`` and ``seq_mean_token_sum``: B' (rows with a
    valid token); ``seq_mean_token_sum_norm``: B'·max_len.

    Args:
      mask: ``[B, T]`` 1 for a valid token.
      mode: an :class:`AggregationMode` or its string value.
      max_len: the constant length of ``seq_mean_token_sum_norm`` (required there).
      count_empty_rows: count every row in B' (verl's convention) instead of only rows with
        a valid token (default False).

    Returns:
      Scalar float32.
    """
    chex.assert_rank(mask, 2)
    mode = _check(mode, max_len)
    if mode is AggregationMode.TOKEN_MEAN:
        return masked_count(mask)
    if count_empty_rows:
        rows = jnp.asarray(float(mask.shape[0]), jnp.float32)
    else:
        rows = jnp.sum(jnp.any(mask.astype(bool), axis=-1).astype(jnp.float32))
    if mode is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM:
        assert max_len is not None  # _check raised otherwise
        return rows * float(max_len)
    return rows


def aggregate_parts(
    per_token: jax.Array,
    mask: jax.Array,
    *,
    mode: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    count_empty_rows: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """``(num, den)`` with ``aggregate(...) == num / den``; sum both across micro-batches.

    ``num`` is Σ_bt l·m for the token-sum modes and Σ_b (Σ_t l·m / n_b) for
    ``seq_mean_token_mean``; ``den`` is :func:`aggregation_denominator`.

    Example (gradient accumulation over K micro-batches, exact global value)::

        parts = [aggregate_parts(l_k, m_k, mode="token_mean") for l_k, m_k in micro]
        loss = sum(n for n, _ in parts) / sum(d for _, d in parts)

    Args:
      per_token: ``[B, T]`` float per-token values (a loss: we minimise it).
      mask: ``[B, T]`` 1 for a valid token, 0 for padding.
      mode: an :class:`AggregationMode` or its string value.
      max_len: constant length for ``seq_mean_token_sum_norm``.
      count_empty_rows: see :func:`aggregation_denominator` (verl convention when True).

    Returns:
      ``(num, den)`` float32 scalars.
    """
    chex.assert_rank([per_token, mask], 2)
    chex.assert_equal_shape([per_token, mask])
    mode = _check(mode, max_len)
    den = aggregation_denominator(
        mask, mode=mode, max_len=max_len, count_empty_rows=count_empty_rows
    )
    if mode is AggregationMode.SEQ_MEAN_TOKEN_MEAN:
        row_sum = masked_sum(per_token, mask, axis=-1)
        row_n = masked_count(mask, axis=-1, dtype=jnp.float32)
        num = jnp.sum(safe_divide(row_sum, row_n))
    else:
        num = masked_sum(per_token, mask)
    return num.astype(jnp.float32), den


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    *,
    mode: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    count_empty_rows: bool = False,
) -> jax.Array:
    """Reduce per-token values ``[B, T]`` to a scalar with one of the :class:`AggregationMode` s.

    ``token_mean`` Σ l·m / Σ m; ``seq_mean_token_mean`` mean over rows of each row's token
    mean; ``seq_mean_token_sum`` mean over rows of each row's token sum;
    ``seq_mean_token_sum_norm`` Σ l·m / (B'·max_len) (Dr. GRPO,
    https://arxiv.org/abs/2503.20783). Rows without a valid token are not counted; an empty
    mask gives 0 (never NaN). Gradients at masked positions are exactly 0.

    Args:
      per_token: ``[B, T]`` float per-token values.
      mask: ``[B, T]`` 1 for a valid token, 0 for padding.
      mode: an :class:`AggregationMode` or its string value (default ``"token_mean"``).
      max_len: constant length, required for ``seq_mean_token_sum_norm``.
      count_empty_rows: count rows without valid tokens in the per-sequence modes (verl).

    Returns:
      Scalar float32.
    """
    num, den = aggregate_parts(
        per_token, mask, mode=mode, max_len=max_len, count_empty_rows=count_empty_rows
    )
    return safe_divide(num, den)

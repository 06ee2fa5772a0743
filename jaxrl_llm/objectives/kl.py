"""Per-token KL estimators between the policy and a reference policy.

With ``d = log π(y_t) − log π_ref(y_t)`` for tokens ``y_t`` sampled from π (J. Schulman,
"Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html):

* ``k1 = d``                    unbiased estimate of KL(π‖π_ref), high variance, can be < 0
* ``k2 = ½·d²``                 biased, low variance, always ≥ 0
* ``k3 = e^{−d} + d − 1``       unbiased for KL(π‖π_ref), low variance, always ≥ 0
  (``(r − 1) − log r`` with ``r = π_ref/π``; GRPO's estimator, DeepSeekMath eq. 4)
* ``abs = |d|``

Naming across frameworks: verl ``kl_penalty`` = ``kl``/``k1``, ``mse``/``k2``,
``low_var_kl``/``k3``, ``abs``; OpenRLHF ``kl_estimator`` = ``k1``, ``k2``, ``k3``;
TRL's GRPO uses ``k3``. verl clamps ``low_var_kl`` to [−10, 10]: pass ``clamp=10.0`` to
reproduce that.
"""

from __future__ import annotations

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.objectives._util import coerce_enum


class KLKind(str, enum.Enum):
    """Which per-token KL estimator to use (values ``"k1"``, ``"k2"``, ``"k3"``, ``"abs"``)."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    ABS = "abs"


def kl_penalty(
    logp: jax.Array,
    ref_logp: jax.Array,
    *,
    kind: KLKind | str = KLKind.K3,
    clamp: float | None = None,
) -> jax.Array:
    """Per-token KL estimate between π and π_ref from log-probs of sampled tokens.

    ``d = logp − ref_logp``; ``k1 = d``, ``k2 = ½·d²``, ``k3 = e^{−d} + d − 1``,
    ``abs = |d|`` (Schulman 2020, http://joschu.net/blog/kl-approx.html; k3 is the
    GRPO estimator of DeepSeekMath, https://arxiv.org/abs/2402.03300, eq. 4).

    The result is unreduced and unmasked: reduce it with :func:`aggregate` and a mask.
    As a penalty it is added to the loss (we minimise loss = −objective), so
    ``loss += kl_coef · aggregate(kl_penalty(...), mask)``.

    Args:
      logp: ``[...]`` float log π(y_t) of the policy being trained.
      ref_logp: same shape, log π_ref(y_t) of the frozen reference policy.
      kind: a :class:`KLKind` or one of the strings ``"k1"``, ``"k2"``, ``"k3"``, ``"abs"``.
        The public contract lists ``kind`` without a default; we default to ``"k3"``.
      clamp: if set, the estimate is clipped to ``[−clamp, clamp]`` (verl's
        ``low_var_kl`` uses 10). ``None`` (default) leaves it exact.

    Returns:
      ``[...]`` float per-token KL estimates, same shape as ``logp``.
    """
    chex.assert_equal_shape([logp, ref_logp])
    kind = coerce_enum(KLKind, kind, "kind")
    d = logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)
    if kind is KLKind.K1:
        out = d
    elif kind is KLKind.K2:
        out = 0.5 * jnp.square(d)
    elif kind is KLKind.K3:
        # expm1 keeps precision for small |d|: e^{−d} − 1 + d.
        out = jnp.expm1(-d) + d
    else:
        out = jnp.abs(d)
    if clamp is not None:
        out = jnp.clip(out, -clamp, clamp)
    return out

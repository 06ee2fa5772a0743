"""Advantage estimators and reward shaping: GRPO, RLOO, ReMax, REINFORCE++, GAE, process
supervision, KL-shaped rewards, DAPO's overlong penalty and dynamic-sampling filter.

Sequence-level rewards are ``[B]`` with groups as consecutive rows of ``group_size``
(``B = n_groups · group_size``); token-level quantities are ``[B, T]`` with a ``mask``.
Advantages are returned unreduced; the policy loss uses them with a plus sign in the
objective (we minimise loss = −objective).

Framework conventions (where they differ, a keyword selects):

* GRPO std: TRL, verl and OpenRLHF all use the unbiased (Bessel) std (``torch.std``);
  ``unbiased=False`` gives the population std. eps: TRL 1e-4, verl 1e-6, OpenRLHF 1e-9
  (``eps=``). TRL ``scale_rewards="batch"`` (std over the whole batch, mean per group) is
  ``scale="batch"``; Dr. GRPO / TRL ``"none"`` / verl ``norm_adv_by_std_in_grpo=False`` is
  ``scale="none"``.
* Whitening (REINFORCE++, GAE): verl/TRL ``masked_whiten`` is ``(x − μ)·rsqrt(σ²_unbiased +
  1e-8)``; OpenRLHF uses the biased variance. :func:`whiten` takes ``unbiased=`` and ``eps=``.
"""

from __future__ import annotations

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import check_group_size, coerce_enum, safe_rsqrt
from jaxrl_llm.objectives.kl import KLKind, kl_penalty
from jaxrl_llm.ops.masked import masked_mean, masked_std, masked_var, safe_divide


class GRPOScale(str, enum.Enum):
    """Std used to scale GRPO advantages: per ``"group"``, whole ``"batch"``, or ``"none"``."""

    GROUP = "group"
    BATCH = "batch"
    NONE = "none"


def _grouped(x: jax.Array, group_size: int, name: str) -> jax.Array:
    n = check_group_size(x.shape[0], group_size, name)
    return x.reshape((n, group_size) + x.shape[1:])


def whiten(
    x: jax.Array,
    mask: jax.Array,
    *,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> jax.Array:
    """Masked whitening ``(x − μ)·rsqrt(σ² + eps)`` over all valid elements.

    μ, σ² are the masked mean and variance (unbiased by default, as verl/TRL
    ``masked_whiten``; OpenRLHF uses ``unbiased=False``). With ``shift_mean=False`` the mean
    is added back (TRL's option for returns). Masked entries come back as 0.
    ``jaxrl_llm.ops.masked_whiten`` is the ``/(σ + eps)`` variant.

    Args:
      x: ``[...]`` float values (e.g. advantages ``[B, T]``).
      mask: same shape (or broadcastable), 1 = valid.
      shift_mean: subtract the mean (default True).
      unbiased: Bessel-corrected variance (default True).
      eps: added to the variance inside the rsqrt (default 1e-8).

    Returns:
      Same shape as ``x``, float32.
    """
    mask = jnp.broadcast_to(mask, x.shape)
    x = x.astype(jnp.float32)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=unbiased)
    out = (x - mean) * safe_rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(mask.astype(bool), out, 0.0)


def grpo_advantages(
    rewards: jax.Array,
    *,
    group_size: int,
    scale: GRPOScale | str = GRPOScale.GROUP,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> jax.Array:
    """Group-relative advantages (GRPO outcome supervision).

    ``A_i = (r_i − mean_g(r)) / (std(r) + eps)`` where the std is the group's
    (``scale="group"``, DeepSeekMath https://arxiv.org/abs/2402.03300 §4.1.2), the whole
    batch's (``scale="batch"``, TRL ``scale_rewards="batch"``, Lite PPO
    https://arxiv.org/abs/2508.08221), or omitted (``scale="none"``: ``A_i = r_i − mean_g``,
    Dr. GRPO https://arxiv.org/abs/2503.20783). A group whose rewards are all equal gets
    zeros (never NaN). Defaults: unbiased std (TRL/verl/OpenRLHF ``torch.std``), eps 1e-6
    (verl; TRL uses 1e-4, OpenRLHF 1e-9).

    Args:
      rewards: ``[B]`` float sequence rewards, groups = consecutive rows of ``group_size``.
      group_size: samples per prompt G (B must be a multiple).
      scale: a :class:`GRPOScale` or ``"group"``, ``"batch"``, ``"none"``.
      eps: added to the std.
      unbiased: Bessel-corrected std (n − 1); False for the population std.

    Returns:
      ``[B]`` float32 advantages (broadcast over tokens by the policy loss).
    """
    chex.assert_rank(rewards, 1)
    scale = coerce_enum(GRPOScale, scale, "scale")
    r = rewards.astype(jnp.float32)
    g = _grouped(r, group_size, "rewards")  # [n, G]
    ones = jnp.ones_like(g)
    centred = (g - jnp.mean(g, axis=1, keepdims=True)).reshape(-1)
    if scale is GRPOScale.NONE:
        return centred
    if scale is GRPOScale.GROUP:
        std = jnp.repeat(masked_std(g, ones, axis=1, unbiased=unbiased), group_size)
    else:
        std = masked_std(r, jnp.ones_like(r), unbiased=unbiased)
    return safe_divide(centred, std + eps)  # 0 (not NaN) for a constant group with eps=0


def rloo_advantages(rewards: jax.Array, *, group_size: int) -> jax.Array:
    """REINFORCE leave-one-out advantages: ``A_i = r_i − (1/(G−1)) Σ_{j≠i} r_j``.

    Equivalently ``G/(G−1)·(r_i − mean_g(r))``. Kool et al. 2019
    (https://openreview.net/forum?id=r1lgTGL5DE); Ahmadian et al. 2024, "Back to Basics"
    (https://arxiv.org/abs/2402.14740). Same as TRL's RLOOTrainer and OpenRLHF ``rloo``
    (no std scaling).

    Args:
      rewards: ``[B]`` float rewards, groups of ``group_size`` consecutive rows.
      group_size: G ≥ 2.

    Returns:
      ``[B]`` float32 advantages.
    """
    chex.assert_rank(rewards, 1)
    if group_size < 2:
        raise ConfigError(f"rloo_advantages needs group_size >= 2 (got {group_size})")
    g = _grouped(rewards.astype(jnp.float32), group_size, "rewards")
    baseline = (jnp.sum(g, axis=1, keepdims=True) - g) / (group_size - 1)
    return (g - baseline).reshape(-1)


def remax_advantages(rewards: jax.Array, baseline_rewards: jax.Array) -> jax.Array:
    """ReMax advantages ``A_i = r(x, y_i) − r(x, ŷ_greedy)``.

    Li et al. 2023, "ReMax" (https://arxiv.org/abs/2310.10505): the baseline is the reward of
    the greedy completion of the same prompt (verl ``remax``).

    Args:
      rewards: ``[B]`` rewards of sampled completions.
      baseline_rewards: ``[B]`` reward of the greedy completion of each row's prompt.

    Returns:
      ``[B]`` float32 advantages.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, baseline_rewards])
    return rewards.astype(jnp.float32) - baseline_rewards.astype(jnp.float32)


def _reverse_masked_scan(step, init, xs_bt):
    """Scan ``step(carry, x_t) -> (carry, y_t)`` backwards over time of ``[B, T]`` arrays."""
    xs = jax.tree.map(lambda a: jnp.moveaxis(a, 1, 0), xs_bt)
    _, ys = jax.lax.scan(step, init, xs, reverse=True)
    return jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), ys)


def discounted_returns(
    token_rewards: jax.Array, mask: jax.Array, *, gamma: float = 1.0
) -> jax.Array:
    """Return-to-go ``G_t = Σ_{k ≥ t} γ^{(k − t)} r_k`` over valid tokens; 0 at padding.

    Masked positions are skipped: their reward is ignored and they do not count as a step
    for the discount, so padding anywhere in a row changes nothing. (verl resets the running
    return at a masked position instead; the two agree for right-padding.)

    Args:
      token_rewards: ``[B, T]`` float per-token rewards.
      mask: ``[B, T]`` 1 = valid.
      gamma: discount γ (default 1.0).

    Returns:
      ``[B, T]`` float32 returns.
    """
    chex.assert_rank([token_rewards, mask], 2)
    chex.assert_equal_shape([token_rewards, mask])
    m = mask.astype(bool)
    r = jnp.where(m, token_rewards.astype(jnp.float32), 0.0)

    def step(g, x):
        r_t, m_t = x
        g_new = jnp.where(m_t, r_t + gamma * g, g)
        return g_new, jnp.where(m_t, g_new, 0.0)

    return _reverse_masked_scan(step, jnp.zeros(r.shape[0], jnp.float32), (r, m))


def reinforce_pp_advantages(
    token_rewards: jax.Array,
    mask: jax.Array,
    *,
    gamma: float = 1.0,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> jax.Array:
    """REINFORCE++ advantages: return-to-go, whitened over all valid tokens of the batch.

    ``G_t = Σ_{k≥t} γ^{k−t} r_k`` (see :func:`discounted_returns`), then
    ``A_t = (G_t − μ)·rsqrt(σ² + eps)`` with μ, σ² over every valid token of the batch
    (global normalisation). Hu 2025, "REINFORCE++" (https://arxiv.org/abs/2501.03262).
    ``token_rewards`` usually holds the score at the last token plus −β·KL per token
    (:func:`kl_shaped_rewards`). Default whitening follows verl (unbiased variance, eps
    1e-8 inside the rsqrt); OpenRLHF uses ``unbiased=False``.

    Args:
      token_rewards: ``[B, T]`` float per-token rewards.
      mask: ``[B, T]`` 1 = valid.
      gamma: discount γ (default 1.0, as in the paper).
      unbiased: Bessel-corrected variance for the whitening.
      eps: added to the variance.

    Returns:
      ``[B, T]`` float32 advantages, 0 at padding.
    """
    returns = discounted_returns(token_rewards, mask, gamma=gamma)
    return whiten(returns, mask, unbiased=unbiased, eps=eps)


def reinforce_pp_baseline_advantages(
    rewards: jax.Array,
    mask: jax.Array,
    *,
    group_size: int,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> jax.Array:
    """REINFORCE++-baseline: subtract the group mean reward, then whiten over the batch.

    ``A_{i,t} = whiten_batch(r_i − mean_g(r))`` broadcast to every valid token of row i;
    the mean and variance of the whitening are over all valid tokens of the batch (so longer
    responses weigh more), as OpenRLHF ``reinforce_baseline`` / verl
    ``reinforce_plus_plus_baseline``. Hu 2025 (https://arxiv.org/abs/2501.03262).

    Args:
      rewards: ``[B]`` sequence rewards, groups of ``group_size`` consecutive rows.
      mask: ``[B, T]`` 1 = valid token.
      group_size: samples per prompt G.
      unbiased: Bessel-corrected variance for the whitening (verl); False for OpenRLHF.
      eps: added to the variance.

    Returns:
      ``[B, T]`` float32 advantages, 0 at padding.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_rank(mask, 2)
    chex.assert_equal(rewards.shape[0], mask.shape[0])
    g = _grouped(rewards.astype(jnp.float32), group_size, "rewards")
    centred = (g - jnp.mean(g, axis=1, keepdims=True)).reshape(-1)
    per_token = jnp.broadcast_to(centred[:, None], mask.shape)
    return whiten(per_token, mask, unbiased=unbiased, eps=eps)


def gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation; returns ``(advantages, returns)``, unwhitened.

    ``δ_t = r_t + γ·V_{t+1} − V_t``, ``A_t = δ_t + γλ·A_{t+1}``, ``R_t = V_t + A_t``
    (Schulman et al. 2016, https://arxiv.org/abs/1506.02438). ``V`` after the last valid
    token is 0 (the episode ends). Masked positions are skipped (the next value is the one
    of the next valid token) and come back as 0. λ = 1 gives the Monte-Carlo return minus
    V_t; λ = 0 gives the one-step TD error. Defaults γ = 1.0, λ = 0.95 (TRL/OpenRLHF PPO).
    Whiten afterwards with :func:`whiten` if wanted.

    Args:
      token_rewards: ``[B, T]`` float per-token rewards.
      values: ``[B, T]`` float value predictions V(s_t) (treated as constants).
      mask: ``[B, T]`` 1 = valid.
      gamma: discount γ.
      lam: GAE λ.

    Returns:
      ``(advantages, returns)``, both ``[B, T]`` float32 and 0 at padding.
    """
    chex.assert_rank([token_rewards, values, mask], 2)
    chex.assert_equal_shape([token_rewards, values, mask])
    m = mask.astype(bool)
    r = jnp.where(m, token_rewards.astype(jnp.float32), 0.0)
    v = jnp.where(m, jax.lax.stop_gradient(values).astype(jnp.float32), 0.0)

    def step(carry, x):
        next_v, next_a = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * next_v - v_t
        a_t = delta + gamma * lam * next_a
        carry = (jnp.where(m_t, v_t, next_v), jnp.where(m_t, a_t, next_a))
        return carry, jnp.where(m_t, a_t, 0.0)

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    adv = _reverse_masked_scan(step, (zeros, zeros), (r, v, m))
    returns = jnp.where(m, v + adv, 0.0)
    return adv, returns


def process_advantages(
    step_rewards: jax.Array,
    step_mask: jax.Array,
    token_step_ids: jax.Array,
    *,
    group_size: int,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> jax.Array:
    """GRPO with process supervision (DeepSeekMath §4.1.3, https://arxiv.org/abs/2402.03300).

    Step rewards are normalised over all valid steps of all samples of a group:
    ``r̃ = (r − mean_group) / (std_group + eps)``. The advantage of a token is the sum of the
    normalised rewards of its own step and every later step of its sample:
    ``A_{i,t} = Σ_{s ≥ step(t)} r̃_{i,s}``. Tokens outside every step (id −1) get 0.
    Steps are indexed in order of appearance (step s ends before step s + 1).

    Args:
      step_rewards: ``[B, S]`` float reward of each reasoning step.
      step_mask: ``[B, S]`` 1 for a real step.
      token_step_ids: ``[B, T]`` int index in ``[0, S)`` of the step a token belongs to,
        −1 for tokens in no step (prompt, padding).
      group_size: samples per prompt G.
      eps: added to the std (default 1e-6).
      unbiased: Bessel-corrected std over the group's steps.

    Returns:
      ``[B, T]`` float32 advantages.
    """
    chex.assert_rank([step_rewards, step_mask, token_step_ids], 2)
    chex.assert_equal_shape([step_rewards, step_mask])
    chex.assert_equal(step_rewards.shape[0], token_step_ids.shape[0])
    b, s = step_rewards.shape
    n = check_group_size(b, group_size, "step_rewards")
    r = step_rewards.astype(jnp.float32).reshape(n, group_size * s)
    m = step_mask.astype(bool).reshape(n, group_size * s)
    mean = masked_mean(r, m, axis=1)[:, None]
    std = masked_std(r, m, axis=1, unbiased=unbiased)[:, None]
    norm = jnp.where(m, safe_divide(r - mean, std + eps), 0.0).reshape(b, s)
    suffix = jnp.flip(jnp.cumsum(jnp.flip(norm, axis=1), axis=1), axis=1)  # [B, S]
    ids = token_step_ids.astype(jnp.int32)
    valid = (ids >= 0) & (ids < s)
    picked = jnp.take_along_axis(suffix, jnp.clip(ids, 0, s - 1), axis=1)
    return jnp.where(valid, picked, 0.0)


def last_token_index(mask: jax.Array) -> jax.Array:
    """Index of the last valid token of each row ``[B]`` (−1 for a row with none)."""
    chex.assert_rank(mask, 2)
    t = mask.shape[1]
    pos = jnp.arange(t)[None, :]
    return jnp.max(jnp.where(mask.astype(bool), pos, -1), axis=1)


def kl_shaped_rewards(
    scores: jax.Array,
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    *,
    kl_coef: float,
    kind: KLKind | str = KLKind.K1,
) -> jax.Array:
    """Per-token rewards of RLHF PPO: ``r_t = −β·KL_t`` plus the score at the last valid token.

    ``r_t = −β·kl(logp_t, ref_logp_t) + 1[t = last valid] · score`` (Ziegler et al. 2019,
    https://arxiv.org/abs/1909.08593; InstructGPT https://arxiv.org/abs/2203.02155). The KL
    uses :func:`kl_penalty` with ``kind`` (default ``"k1"`` as TRL/OpenRLHF/verl). Log-probs
    are treated as constants (rewards carry no gradient). A row with no valid token gets
    all zeros (its score is dropped).

    Args:
      scores: ``[B]`` float sequence scores (reward model or verifier).
      logp: ``[B, T]`` log-probs of the sampling policy.
      ref_logp: ``[B, T]`` log-probs of the reference policy.
      mask: ``[B, T]`` 1 = valid.
      kl_coef: β ≥ 0.
      kind: KL estimator.

    Returns:
      ``[B, T]`` float32 rewards, 0 at padding.
    """
    chex.assert_rank(scores, 1)
    chex.assert_rank([logp, ref_logp, mask], 2)
    chex.assert_equal_shape([logp, ref_logp, mask])
    chex.assert_equal(scores.shape[0], mask.shape[0])
    m = mask.astype(bool)
    kl = kl_penalty(jax.lax.stop_gradient(logp), jax.lax.stop_gradient(ref_logp), kind=kind)
    r = jnp.where(m, -kl_coef * kl, 0.0)
    last = last_token_index(mask)
    at_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
    return r + jnp.where(at_last & m, scores.astype(jnp.float32)[:, None], 0.0)


def overlong_penalty(lengths: jax.Array, *, max_len: int, buffer: int) -> jax.Array:
    """DAPO soft overlong punishment (Yu et al. 2025, https://arxiv.org/abs/2503.14476, eq. 13).

    With ``L_max = max_len`` and ``L_cache = buffer``::

        R(L) = 0                                   if L ≤ L_max − L_cache
             = ((L_max − L_cache) − L) / L_cache   if L_max − L_cache < L ≤ L_max
             = −1                                  if L_max < L

    It is added to the task reward (DAPO used L_max = 20480 with L_cache = 4096 and a
    16384-token expected length). The penalty is continuous: −1 at ``L = L_max``.

    Args:
      lengths: ``[B]`` int or float response lengths |y| in tokens.
      max_len: L_max.
      buffer: L_cache, 0 < buffer ≤ max_len.

    Returns:
      ``[B]`` float32 penalties in [−1, 0].
    """
    chex.assert_rank(lengths, 1)
    if not 0 < buffer <= max_len:
        raise ConfigError(
            f"overlong_penalty needs 0 < buffer <= max_len (got buffer={buffer}, max_len={max_len})"
        )
    ln = lengths.astype(jnp.float32)
    start = float(max_len - buffer)
    soft = (start - ln) / float(buffer)
    return jnp.where(ln <= start, 0.0, jnp.where(ln <= max_len, soft, -1.0))


def informative_groups(
    rewards: jax.Array,
    *,
    group_size: int,
    per_row: bool = False,
    atol: float = 0.0,
) -> jax.Array:
    """Groups whose rewards are not all equal (DAPO dynamic sampling filter).

    A group where every sample gets the same reward has zero GRPO advantage and no gradient;
    DAPO (https://arxiv.org/abs/2503.14476, eq. 11: ``0 < |{correct}| < G``) over-samples and
    keeps only informative groups. Here: ``max_g(r) − min_g(r) > atol``.

    Args:
      rewards: ``[B]`` rewards, groups of ``group_size`` consecutive rows.
      group_size: G.
      per_row: if True return ``[B]`` (each row gets its group's flag), for use as a row mask.
      atol: tolerance below which rewards count as equal (default 0: exact equality).

    Returns:
      ``[B // group_size]`` bool (or ``[B]`` with ``per_row=True``).
    """
    chex.assert_rank(rewards, 1)
    g = _grouped(rewards, group_size, "rewards")
    keep = (jnp.max(g, axis=1) - jnp.min(g, axis=1)) > atol
    return jnp.repeat(keep, group_size) if per_row else keep

"""The Tinker SDK's built-in losses, each one of jaxrl_llm's pure objectives.

Tinker's convention (https://tinker-docs.thinkingmachines.ai/losses): every tensor of a
``Datum.loss_fn_inputs`` is aligned with ``model_input``: position t holds what is predicted
from tokens ``0..t`` (``target_tokens[t]``) and its ``weights`` / ``logprobs`` (the sampler's)
/ ``advantages``; the loss is a SUM over positions and datums, never a mean (the client
chooses its own normalisation through the weights or advantages). Positions past a datum's
end (our padding) have ``mask`` 0 and contribute nothing.

- ``cross_entropy``: L = −Σ_t w_t log π(y_t);
- ``importance_sampling``: L = −Σ_t (π/q)_t A_t, ratio ρ = exp(log π − log q) to the sampler q
  (:func:`jaxrl_llm.objectives.policy_loss_parts` with an unbounded clip range);
- ``ppo``: L = −Σ_t min(ρ_t A_t, clip(ρ_t, lo, hi) A_t), ``loss_fn_config``
  ``clip_low_threshold`` (0.8) and ``clip_high_threshold`` (1.2) (Schulman et al. 2017,
  https://arxiv.org/abs/1707.06347; :func:`jaxrl_llm.objectives.policy_loss_parts`);
- ``cispo``: L = −Σ_t sg(clip(ρ_t, lo, hi)) A_t log π_t, same thresholds (MiniMax-M1,
  https://arxiv.org/abs/2506.13585; :func:`jaxrl_llm.objectives.cispo_loss_parts`);
- ``dro``: L = −Σ_t (A_t log π_t − (β/2)(log π_t − log q_t)²), ``loss_fn_config`` ``beta``
  (Richemond et al. 2024; :func:`jaxrl_llm.objectives.dro_loss_parts`). Tinker's documentation
  does not state its default β; ours is 0.1, so a client that cares passes it.

Arrays are batch-major ``[B, T]``. ``gspo`` and ``stable_reinforce`` are not served (a 400
names the ones that are): Tinker documents neither loss's inputs (which positions form GSPO's
sequence, StableReinforce's ``loss_fn_input_spans`` provenance), and guessing them would train
something other than what the client asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives import cispo_loss_parts, dro_loss_parts, policy_loss_parts

#: ``(logp [B, T], inputs, mask [B, T], config) -> loss`` (a float32 scalar: the SUM)
LossFn = Callable[[jax.Array, dict[str, jax.Array], jax.Array, dict[str, float]], jax.Array]


def cross_entropy(logp, inputs, mask, config):
    """Σ_t −w_t log π(y_t) over real positions (Tinker's ``cross_entropy``)."""
    del config
    return jnp.sum(jnp.where(mask > 0, -inputs["weights"] * logp, 0.0))


def _thresholds(config: dict[str, float]) -> tuple[float, float]:
    lo = float(config.get("clip_low_threshold", 0.8))
    hi = float(config.get("clip_high_threshold", 1.2))
    return lo, hi


def importance_sampling(logp, inputs, mask, config):
    """Σ_t −ρ_t A_t (Tinker's ``importance_sampling``): PPO's objective with no clipping."""
    del config
    old, adv = inputs["logprobs"], inputs["advantages"]
    num, _, _ = policy_loss_parts(logp, old, adv, mask, clip_eps=math.inf)
    return num


def ppo(logp, inputs, mask, config):
    """Σ_t −min(ρ A, clip(ρ, lo, hi) A) (Tinker's ``ppo``)."""
    lo, hi = _thresholds(config)
    old, adv = inputs["logprobs"], inputs["advantages"]
    num, _, _ = policy_loss_parts(logp, old, adv, mask, clip_eps=1.0 - lo, clip_eps_high=hi - 1.0)
    return num


def cispo(logp, inputs, mask, config):
    """Σ_t −sg(clip(ρ, lo, hi)) A log π (Tinker's ``cispo``)."""
    lo, hi = _thresholds(config)
    old, adv = inputs["logprobs"], inputs["advantages"]
    num, _, _ = cispo_loss_parts(
        logp, old, adv, mask, clip_eps_low=1.0 - lo, clip_eps_high=hi - 1.0
    )
    return num


def dro(logp, inputs, mask, config):
    """Σ_t −(A log π − (β/2)(log π − log q)²) (Tinker's ``dro``)."""
    old, adv = inputs["logprobs"], inputs["advantages"]
    if "beta" in config:
        num, _, _ = dro_loss_parts(logp, old, adv, mask, beta=float(config["beta"]))
    else:  # the objective's default β
        num, _, _ = dro_loss_parts(logp, old, adv, mask)
    return num


#: loss name -> (per-token loss, required ``loss_fn_inputs`` besides ``target_tokens``)
LOSSES: dict[str, tuple[LossFn, tuple[str, ...]]] = {
    "cross_entropy": (cross_entropy, ("weights",)),
    "importance_sampling": (importance_sampling, ("logprobs", "advantages")),
    "ppo": (ppo, ("logprobs", "advantages")),
    "cispo": (cispo, ("logprobs", "advantages")),
    "dro": (dro, ("logprobs", "advantages")),
}

"""Losses over parameters, one per algorithm: ``loss(params, batch, *, apply_fn, config)
-> (scalar, metrics)``. They run the model (through ``apply_fn``) and call
:mod:`jaxrl_llm.objectives`; this is the only layer that knows about both. We minimise
loss = −objective. Every loss also takes ``logprobs=LogprobSettings(...)`` (sampling temperature,
chunking, completion window, shared prompt: how log-probs are computed, not a hyperparameter).
The loss table is :data:`LOSSES` (``loss_specs.py``) and the algorithm table
:data:`ALGORITHMS` (``registry.py``).

The losses whose math has an array-level function of the same algorithm in
:mod:`jaxrl_llm.objectives` are named ``<algorithm>_model_loss`` (``dpo_model_loss``,
``kto_model_loss``, ...), so that ``dpo_loss`` means one thing: ``objectives.dpo_loss`` over
log-prob arrays. The names these had before (``losses.dpo_loss`` etc., :data:`RENAMED`) still
resolve, with a ``DeprecationWarning`` that names the new one.

``apply_fn(params, input_ids, attention_mask=..., positions=None, segment_ids=None)`` returns
:class:`jaxrl_llm.models.ModelOutputs` (hidden ``[B, T, D]``, unembed ``[D, V]`` or None,
scalar ``[B, T]`` or None); in practice
``functools.partial(jaxrl_llm.models.apply, config=model_config)``. Log-probs are computed in
time chunks from the hidden states, never as a ``[B, T, V]`` tensor. Frozen models
(reference, old policy, reward model, critic) are never closed over: their outputs arrive in
the batch, computed with :func:`sequence_logps` / :func:`summed_logps` / a spec's
``reference_fn`` from the same compiled code.

Batch layout (all token arrays batch-major ``[B, T]``). Offline batches are right-padded; an
online RL row is its prompt left-padded to the batch's prompt width followed by the
completion right-padded to the generation budget, so every target sits in the last
``rollout.max_new_tokens`` columns (``LogprobSettings.window``). Losses read the masks, never
the padding side. The trainers' layouts as data:
:class:`jaxrl_llm.train.config.batch_layout.BatchLayout`.

* Sequence batch (SFT; also KTO and pairwise-rank rows): ``input_ids`` int32 (prompt +
  completion), ``attention_mask`` (1 = real token), ``loss_mask`` (1 where token t is a
  target/completion token; ``loss_mask[:, 0] == 0`` since token t is predicted from position
  t−1). Optional ``segment_ids`` and ``positions`` for packed rows (positions restart per
  segment; ``jaxrl_llm.models.default_positions(mask, segment_ids)``).
* Per-token RL arrays ``old_logp``, ``ref_logp``, ``advantages``, ``values``, ``returns``,
  ``token_rewards``: ``[B, T]`` aligned with ``input_ids`` (the value at t refers to token t;
  0 where ``loss_mask`` is 0). ``values[b, t]`` is V of the state before token t.
* Preference batch (DPO family, reward model, ORPO, SimPO): ``chosen_input_ids``,
  ``chosen_attention_mask``, ``chosen_loss_mask``, ``rejected_input_ids``,
  ``rejected_attention_mask``, ``rejected_loss_mask`` (same T); optional
  ``ref_chosen_logps [B]``, ``ref_rejected_logps [B]`` (summed over completion tokens) and
  ``margin [B]`` (reward model).
* KTO batch: a sequence batch plus ``label [B]`` (1 desirable, 0 undesirable) and the
  mismatched-pair rows ``kl_input_ids``, ``kl_attention_mask``, ``kl_loss_mask`` (prompt i
  with completion (i+1) mod B) for the reference point z₀; ``ref_logps [B]``,
  ``ref_kl_logps [B]``.
* Pairwise-rank batch: a sequence batch in consecutive groups of ``group_size`` responses
  to one prompt, plus ``scores [B]``.
* Distill batch (GKD, :mod:`jaxrl_llm.losses.distill`): an RL batch plus the teacher's
  inputs ``teacher_input_ids`` / ``teacher_attention_mask`` ``[B, T']`` (its own prompt,
  left-padded, then the same completion columns).
* Optional ``loss_denominator`` (scalar float): the loss divides its summed per-token /
  per-sequence / per-pair / per-group loss by this number instead of its own micro-batch
  denominator. The train step computes it once over the whole batch with the spec's
  ``denominator_fn`` and passes it to every micro-batch, so summed micro-batch losses and
  gradients equal the full-batch loss and gradient exactly.

Padding never changes a loss: padding tokens have mask 0, padding rows (all-zero
``loss_mask``) and padding pairs/groups are excluded from sums and denominators.
"""

from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    LogprobSettings,
    sequence_logps,
    summed_logps,
)
from jaxrl_llm.losses.distill import (
    DistillConfig,
    DistillKind,
    distill_config,
    distill_denominator,
    distill_loss,
    gkd_loss,
    window_logits,
)
from jaxrl_llm.losses.loss_specs import LOSSES, LossSpec, get_loss, policy_reference_logps
from jaxrl_llm.losses.policy import (
    TRACED_HPARAMS,
    AdvantageEstimator,
    CriticConfig,
    PolicyGradientConfig,
    critic_denominator,
    critic_values,
    dapo_config,
    dr_grpo_config,
    grpo_config,
    gspo_config,
    policy_gradient_denominator,
    policy_gradient_loss,
    policy_gradient_zero_batch,
    ppo_actor_config,
    ppo_critic_config,
    ppo_critic_loss,
    reinforce_config,
    reinforce_pp_config,
    remax_config,
    rloo_config,
)
from jaxrl_llm.losses.policy_config import EntropyControl
from jaxrl_llm.losses.policy_terms import batch_key
from jaxrl_llm.losses.preference import (
    DPOConfig,
    ORPOConfig,
    RewardModelConfig,
    SimPOConfig,
    dpo_config,
    dpo_model_loss,
    last_token_scores,
    orpo_config,
    orpo_model_loss,
    pair_denominator,
    preference_reference_logps,
    reward_model_config,
    reward_model_loss,
    reward_scores,
    simpo_config,
    simpo_model_loss,
)
from jaxrl_llm.losses.registry import (
    ALGORITHMS,
    Algorithm,
    AlgorithmFamily,
    get_algorithm,
)
from jaxrl_llm.losses.sft import SFTConfig, sft_config, sft_denominator, sft_loss
from jaxrl_llm.losses.surrogates import (
    CISPOConfig,
    GMPOConfig,
    SAPOConfig,
    cispo_config,
    cispo_model_loss,
    gmpo_config,
    gmpo_model_loss,
    sapo_config,
    sapo_model_loss,
)
from jaxrl_llm.losses.unpaired import (
    KTOConfig,
    PairwiseRankConfig,
    group_denominator,
    kto_config,
    kto_model_loss,
    kto_reference_logps,
    pairwise_rank_config,
    pairwise_rank_model_loss,
    row_denominator,
)

#: Old name -> new name of the losses renamed in session 20 (issue 41): each shared its name
#: with a function of a different signature in :mod:`jaxrl_llm.objectives`.
RENAMED = {
    f"{algorithm}_loss": f"{algorithm}_model_loss"
    for algorithm in ("cispo", "dpo", "gmpo", "kto", "orpo", "pairwise_rank", "sapo", "simpo")
}

__all__ = [
    "RENAMED",
    "DistillConfig",
    "DistillKind",
    "distill_config",
    "distill_denominator",
    "distill_loss",
    "gkd_loss",
    "window_logits",
    "sapo_model_loss",
    "sapo_config",
    "gmpo_model_loss",
    "gmpo_config",
    "cispo_model_loss",
    "cispo_config",
    "SAPOConfig",
    "GMPOConfig",
    "CISPOConfig",
    "ALGORITHMS",
    "AdvantageEstimator",
    "Algorithm",
    "DEFAULT_LOGPROBS",
    "AlgorithmFamily",
    "LogprobSettings",
    "TRACED_HPARAMS",
    "CriticConfig",
    "DPOConfig",
    "KTOConfig",
    "LOSSES",
    "LossSpec",
    "ORPOConfig",
    "PairwiseRankConfig",
    "EntropyControl",
    "PolicyGradientConfig",
    "RewardModelConfig",
    "SFTConfig",
    "SimPOConfig",
    "critic_denominator",
    "critic_values",
    "dapo_config",
    "dpo_config",
    "dpo_model_loss",
    "dr_grpo_config",
    "get_algorithm",
    "get_loss",
    "group_denominator",
    "grpo_config",
    "gspo_config",
    "kto_config",
    "kto_model_loss",
    "kto_reference_logps",
    "last_token_scores",
    "orpo_config",
    "orpo_model_loss",
    "pair_denominator",
    "pairwise_rank_config",
    "pairwise_rank_model_loss",
    "batch_key",
    "policy_gradient_denominator",
    "policy_gradient_loss",
    "policy_gradient_zero_batch",
    "policy_reference_logps",
    "preference_reference_logps",
    "ppo_actor_config",
    "ppo_critic_config",
    "ppo_critic_loss",
    "reinforce_config",
    "reinforce_pp_config",
    "remax_config",
    "reward_model_config",
    "reward_model_loss",
    "reward_scores",
    "rloo_config",
    "row_denominator",
    "sequence_logps",
    "sft_config",
    "sft_denominator",
    "sft_loss",
    "simpo_config",
    "simpo_model_loss",
    "summed_logps",
]


def __getattr__(name: str):
    """The old names of the renamed losses (:data:`RENAMED`): the new function, with a
    ``DeprecationWarning`` that names it."""
    if name in RENAMED:
        import warnings

        new = RENAMED[name]
        warnings.warn(
            f"jaxrl_llm.losses.{name} is now jaxrl_llm.losses.{new} (jaxrl_llm.objectives.{name} "
            "is the array-level objective)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module 'jaxrl_llm.losses' has no attribute {name!r}")

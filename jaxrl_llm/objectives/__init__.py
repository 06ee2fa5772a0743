"""Post-training objectives as pure functions: arrays in, arrays out.

Token data is batch-major ``[B, T]`` with an explicit ``mask`` ``[B, T]`` (1 = real token);
sequence data is ``[B]``; groups (G samples of one prompt) are consecutive rows of
``group_size``. No model, no config object: hyperparameters are keyword-only with their
papers' defaults. Losses are minimised (loss = −objective); per-token / per-example values
come back unreduced and :func:`aggregate` (or :func:`aggregate_parts` for exact gradient
accumulation) reduces them.

Contents: KL estimators (:func:`kl_penalty`), aggregation modes, advantage estimators
(GRPO, RLOO, ReMax, REINFORCE++, GAE, process supervision) and reward shaping, the clipped
policy loss (PPO/GRPO/DAPO/GSPO, with importance weights and decoupled PPO), the 2025
surrogates (CISPO, SAPO, GMPO, DRO) and covariance-based entropy control (KL-Cov, Clip-Cov),
rollout/learner mismatch correction (TIS, MIS), on-policy distillation (GKD's generalised
JSD, sampled-token reverse-KL advantages), the value loss, preference losses (DPO family,
KTO, ORPO, SimPO, Bradley–Terry, pairwise rank), the pass@k estimator, and re-exports of the
log-prob / entropy ops.
"""

from jaxrl_llm.objectives._util import coerce_enum
from jaxrl_llm.objectives.advantages import (
    GRPOScale,
    discounted_returns,
    gae,
    grpo_advantages,
    informative_groups,
    kl_shaped_rewards,
    last_token_index,
    overlong_penalty,
    process_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    rloo_advantages,
    whiten,
)
from jaxrl_llm.objectives.aggregation import (
    AggregationMode,
    aggregate,
    aggregate_parts,
    aggregation_denominator,
)
from jaxrl_llm.objectives.correction import CorrectionLevel, CorrectionMode, rollout_correction
from jaxrl_llm.objectives.distillation import (
    generalized_jsd,
    generalized_jsd_loss,
    generalized_jsd_loss_parts,
    reverse_kl_advantages,
)
from jaxrl_llm.objectives.entropy_control import (
    clip_cov_loss,
    clip_cov_loss_parts,
    kl_cov_loss,
    kl_cov_loss_parts,
    token_covariance,
)
from jaxrl_llm.objectives.evaluation import pass_at_k
from jaxrl_llm.objectives.kl import KLKind, kl_penalty
from jaxrl_llm.objectives.policy import (
    RatioLevel,
    policy_loss,
    policy_loss_parts,
    sequence_log_ratio,
)
from jaxrl_llm.objectives.preference import (
    DPOKind,
    bradley_terry_loss,
    dpo_loss,
    kto_loss,
    log1mexp,
    orpo_loss,
    pairwise_rank_loss,
    simpo_loss,
)
from jaxrl_llm.objectives.surrogates import (
    cispo_loss,
    cispo_loss_parts,
    dro_loss,
    dro_loss_parts,
    gmpo_loss,
    gmpo_loss_parts,
    sapo_loss,
    sapo_loss_parts,
)
from jaxrl_llm.objectives.value import value_loss, value_loss_parts
from jaxrl_llm.ops.logprobs import (
    entropy_from_hidden,
    entropy_from_logits,
    logprobs_and_entropy_from_hidden,
    token_logprobs,
    token_logprobs_from_hidden,
)
from jaxrl_llm.ops.masked import masked_mean, masked_whiten

__all__ = [
    "coerce_enum",
    "AggregationMode",
    "CorrectionLevel",
    "CorrectionMode",
    "DPOKind",
    "GRPOScale",
    "KLKind",
    "RatioLevel",
    "aggregate",
    "aggregate_parts",
    "aggregation_denominator",
    "bradley_terry_loss",
    "cispo_loss",
    "cispo_loss_parts",
    "clip_cov_loss",
    "clip_cov_loss_parts",
    "discounted_returns",
    "dpo_loss",
    "dro_loss",
    "dro_loss_parts",
    "entropy_from_hidden",
    "entropy_from_logits",
    "gae",
    "generalized_jsd",
    "generalized_jsd_loss",
    "generalized_jsd_loss_parts",
    "gmpo_loss",
    "gmpo_loss_parts",
    "grpo_advantages",
    "informative_groups",
    "kl_cov_loss",
    "kl_cov_loss_parts",
    "kl_penalty",
    "kl_shaped_rewards",
    "kto_loss",
    "last_token_index",
    "log1mexp",
    "logprobs_and_entropy_from_hidden",
    "masked_mean",
    "masked_whiten",
    "orpo_loss",
    "overlong_penalty",
    "pairwise_rank_loss",
    "pass_at_k",
    "policy_loss",
    "policy_loss_parts",
    "process_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "reverse_kl_advantages",
    "rloo_advantages",
    "rollout_correction",
    "sapo_loss",
    "sapo_loss_parts",
    "sequence_log_ratio",
    "simpo_loss",
    "token_covariance",
    "token_logprobs",
    "token_logprobs_from_hidden",
    "value_loss",
    "value_loss_parts",
    "whiten",
]

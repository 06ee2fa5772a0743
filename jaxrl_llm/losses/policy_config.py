"""The configuration of the clipped policy-gradient family: :class:`PolicyGradientConfig` (one
loss, many algorithms: clip range, clip-higher, token- or sequence-level ratio, aggregation,
the in-loss KL term, the entropy bonus, entropy control), its validation, and the names it is
built from (:class:`AdvantageEstimator`, :class:`EntropyControl`). The loss that reads it is
:mod:`jaxrl_llm.losses.policy`, its surrogate terms :mod:`jaxrl_llm.losses.policy_terms`."""

from __future__ import annotations

import dataclasses
import enum

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives import coerce_enum
from jaxrl_llm.objectives.aggregation import AggregationMode
from jaxrl_llm.objectives.kl import KLKind
from jaxrl_llm.objectives.policy import RatioLevel


class EntropyControl(str, enum.Enum):
    """Entropy control by the covariance of log-prob and advantage (Cui et al. 2025, "The
    Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    https://arxiv.org/abs/2505.22617), an option of every clipped policy-gradient loss.

    ``none``: the clipped surrogate. ``kl_cov``: the unclipped surrogate plus
    ``kl_cov_coef·|log ρ|`` on the ``kl_cov_ratio`` share of tokens with the largest
    covariance (:func:`jaxrl_llm.objectives.kl_cov_loss`). ``clip_cov``: the clipped
    surrogate with a random ``clip_cov_ratio`` share of the tokens whose covariance lies in
    (``clip_cov_lb``, ``clip_cov_ub``) detached (:func:`jaxrl_llm.objectives.clip_cov_loss`).
    """

    NONE = "none"
    KL_COV = "kl_cov"
    CLIP_COV = "clip_cov"


# Scalar hyperparameters of PolicyGradientConfig that may be passed traced (``hparams``).
TRACED_HPARAMS = ("kl_coef", "entropy_coef")


class AdvantageEstimator(str, enum.Enum):
    """The advantage estimator an algorithm is defined with (run by the RL loop, not here;
    the registry's :class:`~jaxrl_llm.losses.registry.Algorithm` entry names it).

    ``grpo``: (r − mean_group) / std_group (DeepSeekMath); ``grpo_no_std``: r − mean_group
    (Dr. GRPO); ``rloo``: leave-one-out baseline; ``remax``: r − r(greedy);
    ``reinforce_pp``: batch-whitened discounted return (REINFORCE++); ``gae``: GAE with a
    critic (PPO); ``reward``: the raw (KL-shaped) return, no baseline (REINFORCE).
    """

    GRPO = "grpo"
    GRPO_NO_STD = "grpo_no_std"
    RLOO = "rloo"
    REMAX = "remax"
    REINFORCE_PP = "reinforce_pp"
    GAE = "gae"
    REWARD = "reward"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PolicyGradientConfig:
    """Configuration of the clipped policy-gradient family (one loss, many algorithms).

    Defaults are PPO's (Schulman et al. 2017, https://arxiv.org/abs/1707.06347): ε = 0.2,
    token-level ratio, token-mean aggregation, no in-loss KL (RLHF-PPO puts the KL in the
    reward, Ouyang et al. 2022, https://arxiv.org/abs/2203.02155).

    Attributes:
      clip_eps: ε of clip(ρ, 1 − ε, 1 + ε_high); None disables clipping (plain REINFORCE).
      clip_eps_high: upper ε ("clip-higher", DAPO); None = clip_eps.
      dual_clip: dual-clip constant c > 1 bounding negative-advantage losses (Ye et al. 2020,
        https://arxiv.org/abs/1912.09729); None disables it.
      ratio_level: :class:`RatioLevel` (GSPO uses ``sequence``).
      aggregation: :class:`~jaxrl_llm.objectives.aggregation.AggregationMode`.
      max_len: the constant L of ``seq_mean_token_sum_norm`` (Dr. GRPO): the generation
        budget in tokens.
      kl_coef: β of the in-loss KL penalty β·KL(π‖π_ref) (needs ``ref_logp`` in the batch).
      kl_kind: KL estimator (:class:`~jaxrl_llm.objectives.kl.KLKind`), k3 for GRPO.
      entropy_coef: c₂ of the entropy bonus (loss −= c₂·H), PPO eq. 9; 0 disables it.
      entropy_control: :class:`EntropyControl` (default ``none``: off). KL-Cov replaces the
        clipped surrogate by the unclipped one (``clip_eps`` is then unused, as in the
        paper); both need the token ratio and no dual clip. The token selection is that of
        one loss call, i.e. of one micro-batch (as verl; see
        :mod:`jaxrl_llm.objectives.entropy_control`).
      kl_cov_ratio, kl_cov_coef: KL-Cov's share of penalised tokens and the weight of
        |log ρ| (2e-4 and 1.0, verl's recipe for Cui et al. 2025).
      clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's share of detached tokens and its
        covariance bounds (2e-4, 1, 5: verl's recipe). The random subset's PRNG key is
        derived from the micro-batch's token ids, so the step stays a pure function of its
        inputs (deterministic under jit; the same batch gives the same subset).
    """

    clip_eps: float | None = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    ratio_level: RatioLevel = RatioLevel.TOKEN
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN
    max_len: int | None = None
    kl_coef: float = 0.0
    kl_kind: KLKind = KLKind.K3
    entropy_coef: float = 0.0
    entropy_control: EntropyControl = EntropyControl.NONE
    kl_cov_ratio: float = 0.0002
    kl_cov_coef: float = 1.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0

    def __post_init__(self):
        for name, cls in (
            ("ratio_level", RatioLevel),
            ("aggregation", AggregationMode),
            ("kl_kind", KLKind),
            ("entropy_control", EntropyControl),
        ):
            object.__setattr__(self, name, coerce_enum(cls, getattr(self, name), name))
        if self.clip_eps is not None and not self.clip_eps > 0:
            raise ConfigError(f"clip_eps={self.clip_eps!r} must be > 0 (or None: no clipping)")
        if self.clip_eps_high is not None and self.clip_eps is None:
            raise ConfigError("clip_eps_high is set but clip_eps is None; set both or neither")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ConfigError(f"dual_clip={self.dual_clip!r} must be > 1 (or None)")
        if self.aggregation is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM and not self.max_len:
            raise ConfigError(
                "aggregation='seq_mean_token_sum_norm' needs max_len (the "
                "generation budget in tokens)"
            )
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ConfigError(
                f"kl_coef={self.kl_coef} and entropy_coef={self.entropy_coef} must be >= 0"
            )
        check_entropy_control(self)


# ----- presets: one per algorithm -------------------------------------------------------------


def check_entropy_control(config: PolicyGradientConfig) -> None:
    """Raise :class:`~jaxrl_llm.errors.ConfigError` when ``config``'s entropy control is not
    defined for its other settings (token ratio, no dual clip, a ratio in (0, 1], Clip-Cov's
    clip range and bounds)."""
    ec = config.entropy_control
    if ec is EntropyControl.NONE:
        return
    if config.ratio_level is not RatioLevel.TOKEN or config.dual_clip is not None:
        raise ConfigError(
            f"entropy_control={ec.value!r} is defined for the token ratio without a dual "
            f"clip (got ratio_level={config.ratio_level.value!r}, dual_clip={config.dual_clip})"
        )
    ratio = config.kl_cov_ratio if ec is EntropyControl.KL_COV else config.clip_cov_ratio
    if not 0.0 < ratio <= 1.0:
        raise ConfigError(f"{ec.value}_ratio={ratio} must be in (0, 1] (verl: 2e-4)")
    if ec is EntropyControl.CLIP_COV:
        if config.clip_eps is None:
            raise ConfigError("entropy_control='clip_cov' needs clip_eps (PPO's clip)")
        if not config.clip_cov_lb < config.clip_cov_ub:
            raise ConfigError(
                f"clip_cov_lb={config.clip_cov_lb} must be < clip_cov_ub={config.clip_cov_ub}"
            )

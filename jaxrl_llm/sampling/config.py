"""Sampling hyperparameters and shape buckets."""

from __future__ import annotations

import dataclasses
import math

from jaxrl_llm.errors import ConfigError

# Bucket sizes a prompt / generation length is rounded up to, so that a training run compiles
# a small fixed set of programs. Powers of two up to 1024, then multiples of 1024.
DEFAULT_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
    """How the next token is chosen from the model's logits z.

    The policy whose log-probabilities are recorded is π_τ(y) = softmax(z / τ)[y] with
    τ = ``temperature`` — the same as ``jaxrl_llm.ops.token_logprobs(logits, tokens,
    temperature=τ)`` that the losses use. The truncations below (top-k, top-p, min-p) change
    which token is *drawn*, never the recorded log-prob (the usual convention of RL trainers:
    the loss recomputes log π_τ over the full vocabulary). With ``greedy=True`` and
    ``temperature`` ≤ 0 the log-probs are recorded at τ = 1.

    Filters are applied in this order, each to the tempered distribution (as transformers'
    logits warpers do): temperature, top-k, top-p, min-p.

    Attributes:
      greedy: take argmax z (ignores top-k/top-p/min-p and the PRNG).
      temperature: τ > 0 (required unless greedy). Default 1.0 (plain ancestral sampling).
      top_k: keep the k largest logits (Fan et al. 2018, "Hierarchical Neural Story
        Generation", https://arxiv.org/abs/1805.04833); 0 disables (default). Ties at the k-th
        value are all kept.
      top_p: nucleus sampling (Holtzman et al. 2020, "The Curious Case of Neural Text
        Degeneration", https://arxiv.org/abs/1904.09751): keep the smallest set of most
        likely tokens whose mass is ≥ p; p ∈ (0, 1], 1.0 disables (default).
      min_p: keep tokens with p(y) ≥ min_p · max p (Nguyen et al. 2024, "Turning Up the
        Heat: Min-p Sampling", https://arxiv.org/abs/2407.01082); min_p ∈ [0, 1), 0 disables
        (default).
      stop_token_ids: extra token ids that end a row (besides the model's EOS ids); the stop
        token itself is part of the completion (mask 1).
      use_model_eos: also stop on ``ModelConfig.eos_token_ids`` (default True).
    """

    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    use_model_eos: bool = True

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "min_p", float(self.min_p))
        if not math.isfinite(self.temperature):
            raise ConfigError(f"sampling temperature must be finite, got {self.temperature}")
        if not self.greedy and self.temperature <= 0:
            raise ConfigError(
                f"sampling temperature must be > 0 (got {self.temperature}); "
                "use greedy decoding for temperature 0"
            )
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ConfigError(f"sampling top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        object.__setattr__(self, "top_k", int(self.top_k))
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"sampling min_p must be in [0, 1) (0 = off), got {self.min_p}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ConfigError(f"sampling stop_token_ids must be >= 0, got {self.stop_token_ids}")

    @property
    def logprob_temperature(self) -> float:
        """τ of the recorded log-probs: ``temperature``, or 1.0 for greedy with τ ≤ 0."""
        return self.temperature if self.temperature > 0 else 1.0


def bucket_length(n: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> int:
    """Round a length up to the smallest bucket ≥ n; beyond the largest bucket, to a multiple
    of it.

    Args:
      n: a length ≥ 1.
      buckets: increasing bucket sizes.

    Returns:
      the bucketed length (≥ n).
    """
    if n < 1:
        raise ConfigError(f"length must be >= 1, got {n}")
    for b in buckets:
        if n <= b:
            return int(b)
    top = int(buckets[-1])
    return -(-n // top) * top

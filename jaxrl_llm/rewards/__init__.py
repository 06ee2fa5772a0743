"""Rewards: verifiable answer checks, format/length shaping, reward-model scoring, process
(per-step) rewards and sandboxed code execution.

Every reward function has the signature
``fn(prompts: list[str], completions: list[str], **fields) -> list[float | None]``
(``fields`` are the data set's other columns, aligned with the completions; None = no score).
:class:`RewardSet` / :func:`combine_rewards` call several with weights and contain their
failures, returning ``(rewards [N] float32, valid [N] bool, metrics)``.
"""

from jaxrl_llm.rewards.base import RewardFn
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.rewards.base import RewardSet
from jaxrl_llm.rewards.base import RewardSpec
from jaxrl_llm.rewards.base import combine_rewards
from jaxrl_llm.rewards.math_answer import AnswerSource
from jaxrl_llm.rewards.math_answer import answers_match
from jaxrl_llm.rewards.math_answer import extract_answer
from jaxrl_llm.rewards.math_answer import extract_boxed
from jaxrl_llm.rewards.math_answer import extract_last_number
from jaxrl_llm.rewards.math_answer import math_answer_reward
from jaxrl_llm.rewards.math_answer import parse_number
from jaxrl_llm.rewards.process import StepScorer
from jaxrl_llm.rewards.process import outcome_as_process
from jaxrl_llm.rewards.process import pad_step_rewards
from jaxrl_llm.rewards.process import process_rewards
from jaxrl_llm.rewards.process import split_steps
from jaxrl_llm.rewards.reward_model import last_token_index
from jaxrl_llm.rewards.reward_model import make_reward_model_reward
from jaxrl_llm.rewards.reward_model import reward_model_scores
from jaxrl_llm.rewards.sandbox import Isolation
from jaxrl_llm.rewards.sandbox import Outcome
from jaxrl_llm.rewards.sandbox import SandboxResult
from jaxrl_llm.rewards.sandbox import code_execution_details
from jaxrl_llm.rewards.sandbox import code_execution_reward
from jaxrl_llm.rewards.sandbox import default_interpreter
from jaxrl_llm.rewards.sandbox import extract_python_code
from jaxrl_llm.rewards.sandbox import namespaces_available
from jaxrl_llm.rewards.sandbox import run_python
from jaxrl_llm.rewards.shaping import THINK_ANSWER_PATTERN
from jaxrl_llm.rewards.shaping import LengthUnit
from jaxrl_llm.rewards.shaping import make_format_reward
from jaxrl_llm.rewards.shaping import make_length_penalty
from jaxrl_llm.rewards.shaping import make_overlong_reward

__all__ = [
    "AnswerSource",
    "Isolation",
    "LengthUnit",
    "Outcome",
    "RewardFn",
    "RewardOutput",
    "RewardSet",
    "RewardSpec",
    "SandboxResult",
    "StepScorer",
    "THINK_ANSWER_PATTERN",
    "answers_match",
    "code_execution_details",
    "code_execution_reward",
    "combine_rewards",
    "default_interpreter",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "extract_python_code",
    "last_token_index",
    "make_format_reward",
    "make_length_penalty",
    "make_overlong_reward",
    "make_reward_model_reward",
    "math_answer_reward",
    "namespaces_available",
    "outcome_as_process",
    "pad_step_rewards",
    "parse_number",
    "process_rewards",
    "reward_model_scores",
    "run_python",
    "split_steps",
]

"""Rewards: verifiable answer checks, format/length shaping, reward-model scoring, process
(per-step) rewards and sandboxed code execution.

Every reward function is called as TRL calls one, by keyword:
``fn(prompts=, completions=, completion_ids=, trainer_state=, **fields) -> list[float | None]``
(``fields`` are the data set's other columns, aligned with the completions; None = no score;
:mod:`.calling`).
:class:`RewardSet` / :func:`combine_rewards` call several with weights and contain their
failures, returning ``(rewards [N] float32, valid [N] bool, metrics)``. User code (reward
functions, environments, tools) runs on :class:`UserCodeRunner`'s threads, bounded in time;
nothing it raises, ``sys.exit`` included, reaches the run (:mod:`.user_code`).
"""

from jaxrl_llm.rewards.base import (
    RewardOutput,
    RewardSet,
    RewardSpec,
    combine_rewards,
)
from jaxrl_llm.rewards.calling import (
    CallShape,
    RewardFn,
    TrainerState,
    call_reward,
    call_shape,
    trl_format,
)
from jaxrl_llm.rewards.math_answer import (
    AnswerSource,
    answers_match,
    extract_answer,
    extract_boxed,
    extract_last_number,
    math_answer_reward,
    parse_number,
)
from jaxrl_llm.rewards.math_verify import math_verify_reward
from jaxrl_llm.rewards.process import (
    StepScorer,
    outcome_as_process,
    pad_step_rewards,
    process_rewards,
    split_steps,
)
from jaxrl_llm.rewards.registry import (
    REWARD_FUNCTIONS,
    RewardContext,
    bind_reward,
    build_reward,
    build_reward_set,
    build_step_scorer,
    hold_callable,
    import_function,
)
from jaxrl_llm.rewards.reward_model import (
    make_reward_model_reward,
    reward_model_scores,
)
from jaxrl_llm.rewards.sandbox import (
    code_execution_details,
    code_execution_reward,
    extract_python_code,
    namespaces_available,
    resolve_isolation,
    run_python,
    user_namespaces_available,
)
from jaxrl_llm.rewards.sandbox_launch import (
    Isolation,
    Outcome,
    SandboxResult,
    default_interpreter,
)
from jaxrl_llm.rewards.shaping import (
    THINK_ANSWER_PATTERN,
    LengthUnit,
    make_format_reward,
    make_length_penalty,
    make_overlong_reward,
)
from jaxrl_llm.rewards.user_code import (
    CallResult,
    UserCodeRunner,
    UserCodeStop,
    cancel_all,
    shared_runner,
)

__all__ = [
    "AnswerSource",
    "CallResult",
    "CallShape",
    "REWARD_FUNCTIONS",
    "RewardContext",
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
    "TrainerState",
    "UserCodeRunner",
    "UserCodeStop",
    "answers_match",
    "bind_reward",
    "build_reward",
    "build_reward_set",
    "build_step_scorer",
    "call_reward",
    "call_shape",
    "cancel_all",
    "code_execution_details",
    "code_execution_reward",
    "combine_rewards",
    "default_interpreter",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "extract_python_code",
    "hold_callable",
    "import_function",
    "make_format_reward",
    "make_length_penalty",
    "make_overlong_reward",
    "make_reward_model_reward",
    "math_answer_reward",
    "math_verify_reward",
    "namespaces_available",
    "outcome_as_process",
    "pad_step_rewards",
    "parse_number",
    "process_rewards",
    "resolve_isolation",
    "reward_model_scores",
    "run_python",
    "shared_runner",
    "split_steps",
    "user_namespaces_available",
    "trl_format",
]

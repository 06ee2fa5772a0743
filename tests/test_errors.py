"""errors.did_you_mean and the "unknown X" messages that use it: a typo in a config key, an
algorithm, a reward, an environment, a tool, a memory device or a --mesh axis names the closest
valid choice."""

import pytest

from jaxrl_llm.errors import ConfigError, did_you_mean


def test_did_you_mean():
    assert did_you_mean("gpro", ["grpo", "gspo", "ppo"]) == " (did you mean 'grpo'?)"
    assert did_you_mean("GRPO", ["grpo", "ppo"]) == " (did you mean 'grpo'?)"
    assert did_you_mean("smolm2", ["smollm2-135m-instruct", "gemma3-270m"]) == ""
    assert did_you_mean("xyzzy", ["grpo", "ppo"]) == ""
    assert did_you_mean("x", []) == ""


def _algorithm():
    from jaxrl_llm.train.config.config_io import from_dict
    from jaxrl_llm.train.config.run_config import RunConfig

    from_dict(RunConfig, {"algorithm": "gpro", "output_dir": "/tmp/x", "max_steps": 1})


def _config_key():
    from jaxrl_llm.train.config.config_io import from_dict
    from jaxrl_llm.train.config.run_config import RunConfig

    from_dict(RunConfig, {"algorithm": "grpo", "output_dir": "/tmp/x", "max_step": 1})


def _reward():
    from jaxrl_llm.rewards.registry import build_reward

    build_reward("math_anwser", {}, key="rewards[0]")


def _environment():
    from jaxrl_llm.envs.registry import environment_class

    environment_class("tols")


def _tool():
    from jaxrl_llm.envs.tools import resolve_tools

    resolve_tools(["calculater"])


def _device():
    from jaxrl_llm.train.compile.memory_presets import device_memory_bytes

    device_memory_bytes("tpu-v5q")


def _mesh_axis():
    from jaxrl_llm.cli.memory import parse_mesh

    parse_mesh("dat=2")


@pytest.mark.parametrize(
    "call, hint",
    [
        (_algorithm, "'grpo'"),
        (_config_key, "'max_steps'"),
        (_reward, "'math_answer'"),
        (_environment, "'tools'"),
        (_tool, "'calculator'"),
        (_device, "'tpu-v5p'"),
        (_mesh_axis, "'data'"),
    ],
)
def test_a_typo_names_the_closest_choice(call, hint):
    with pytest.raises(ConfigError, match=f"did you mean {hint}"):
        call()

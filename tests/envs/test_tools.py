"""The calculator (arithmetic only, bounded), tool descriptions, tool-call parsing and the
``tools`` environment's answers (every tool failure is a message, never an exception)."""

from __future__ import annotations

import json

import pytest

from jaxrl_llm.envs import (
    CalculatorError,
    Step,
    ToolEnv,
    calculate,
    call_tool,
    parse_tool_call,
    tool_schema,
)
from jaxrl_llm.errors import ConfigError


@pytest.mark.parametrize(
    "expr, want",
    [
        ("123 * 456", "56088"),
        ("317 * 829 + 12", str(317 * 829 + 12)),
        ("(2 + 3) * -4", "-20"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("7 % 4", "3"),
        ("2 ^ 10", "1024"),
        ("2 ** 0.5", "1.41421356237"),
        ("3 × 4 ÷ 6", "2"),
        ("  +5 ", "5"),
    ],
)
def test_calculator_evaluates_arithmetic(expr, want):
    assert calculate(expr) == want


@pytest.mark.parametrize(
    "expr, why",
    [
        ("__import__('os').system('ls')", "function call"),
        ("x + 1", "name 'x'"),
        ("(1).real", "attribute"),
        ("abs(-3)", "function call"),
        ("'a' * 3", "only numbers"),
        ("[1, 2]", "List"),
        ("1 < 2", "Compare"),
        ("True + 1", "only numbers"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 100000", "exponent"),
        ("10 ** 299 * 10 ** 299", "too large"),
        ("1e308 * 10", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("1+" * 150 + "1", "longer than"),
        ("lambda: 1", "Lambda"),
    ],
)
def test_calculator_refuses_everything_but_bounded_arithmetic(expr, why):
    with pytest.raises(CalculatorError, match=why):
        calculate(expr)


def test_tool_schema_reads_docstring_and_type_hints():
    s = tool_schema(calculate)
    fn = s["function"]
    assert s["type"] == "function" and fn["name"] == "calculate"
    assert fn["description"].startswith("Evaluate an arithmetic expression")
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"
    assert "numbers with" in fn["parameters"]["properties"]["expression"]["description"]
    assert fn["parameters"]["required"] == ["expression"]

    def untyped(x):
        """Doc."""

    with pytest.raises(ConfigError, match="type hint"):
        tool_schema(untyped)

    def undocumented(x: int):
        pass

    with pytest.raises(ConfigError, match="docstring"):
        tool_schema(undocumented)


def test_parse_tool_call_forms():
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+2"}}</tool_call>'
    assert parse_tool_call("I will compute. " + call) == ("calculate", {"expression": "1+2"})
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert parse_tool_call(as_string) == ("f", {"a": 1})
    assert parse_tool_call("The answer is 3.") is None
    assert parse_tool_call("<tool_call>{not json}</tool_call>").startswith("error: the tool call")
    assert parse_tool_call('<tool_call>{"arguments": {}}</tool_call>').startswith("error:")
    assert parse_tool_call('<tool_call>{"name": "f", "arguments": [1]}</tool_call>').startswith(
        "error:"
    )


def test_call_tool_turns_every_failure_into_a_message():
    tools = {"calculate": calculate}
    assert call_tool(tools, "calculate", {"expression": "6*7"}) == ("42", True)
    text, ok = call_tool(tools, "calculate", {"expression": "__import__('os')"})
    assert not ok and text.startswith("error: only arithmetic")
    text, ok = call_tool(tools, "search", {"q": "x"})
    assert not ok and "unknown tool 'search'" in text
    text, ok = call_tool(tools, "calculate", {"expr": "1"})
    assert not ok and text.startswith("error: bad arguments")


@pytest.mark.parametrize(
    "expression",
    ["os.system('rm -rf /')", "().__class__.__bases__", "9**9**9**9", "open('/etc/passwd')"],
)
def test_tools_env_answers_a_bad_call_with_a_tool_error(expression):
    env = ToolEnv(tools=["calculator"])
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    step = env.step(f"<tool_call>{call}</tool_call>")
    assert isinstance(step, Step) and not step.done
    assert step.messages[0]["role"] == "tool"
    assert step.messages[0]["content"].startswith("error:")
    assert step.info == {"tool_calls": 1, "tool_errors": 1}


def test_tools_env_episode_shape():
    env = ToolEnv(tools=["calculator"], system_prompt="Be brief.", call_reward=0.1)
    opening = env.reset({"prompt": "What is 123 * 456?", "answer": "56088"})
    assert [m["role"] for m in opening] == ["system", "user"]
    assert opening[0]["content"].startswith("Be brief.") and "calculate" in opening[0]["content"]
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "123*456"}}</tool_call>'
    step = env.step(call)
    assert step.messages == [{"role": "tool", "content": "56088"}] and step.reward == 0.1
    final = env.step("The answer is 56088.")
    assert final.done and final.messages == []
    # a conversational prompt with its own system message keeps it, tools appended
    opening = env.reset(
        {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]}
    )
    assert opening[0]["content"].startswith("S\n\n") and len(opening) == 2


def test_unknown_tool_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown tool"):
        ToolEnv(tools=["browser"])


def test_python_tool_runs_in_the_sandbox_and_reports_failures_as_messages():
    from jaxrl_llm.rewards import namespaces_available, user_namespaces_available

    env = ToolEnv(tools=["python"])
    ok_call = json.dumps({"name": "python", "arguments": {"code": "print(6 * 7)"}})
    bad_call = json.dumps({"name": "python", "arguments": {"code": "raise SystemExit(3)"}})
    step = env.step(f"<tool_call>{ok_call}</tool_call>")
    if not (namespaces_available() or user_namespaces_available()):
        # no isolation boundary on this host: the sandbox refuses, as a tool error message
        assert step.messages[0]["content"].startswith("error:") and step.info["tool_errors"] == 1
        return
    assert step.messages == [{"role": "tool", "content": "42"}] and step.info["tool_errors"] == 0
    failed = env.step(f"<tool_call>{bad_call}</tool_call>")
    assert failed.messages[0]["content"].startswith("error:") and failed.info["tool_errors"] == 1

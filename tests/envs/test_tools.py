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
    parse_gemma4_tool_call,
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


Q = '<|"|>'


@pytest.mark.parametrize(
    "text, want",
    [
        (
            f"<|tool_call>call:calculate{{expression:{Q}123 * 456{Q}}}<tool_call|>",
            ("calculate", {"expression": "123 * 456"}),
        ),
        # strings keep what JSON would escape; numbers, booleans, nesting, quoted keys
        (
            f'ok <|tool_call>call:f{{a:{Q}say "hi": x{Q}, n:-2.5e1, b:true, "c":[1,{{d:null}}]}}'
            "<tool_call|> then",
            ("f", {"a": 'say "hi": x', "n": -25.0, "b": True, "c": [1, {"d": None}]}),
        ),
        ("<|tool_call>call:noargs{}<tool_call|>", ("noargs", {})),
        ("The answer is 3.", None),
        ("<|tool_call>call:f{a:1}", None),  # unclosed: a final answer
    ],
)
def test_parse_gemma4_tool_call_forms(text, want):
    """Gemma 4's format, as transformers' response template for ``gemma4`` reads it."""
    assert parse_gemma4_tool_call(text) == want


@pytest.mark.parametrize(
    "text",
    [
        f"<|tool_call>call:f{{a:{Q}unclosed}}<tool_call|>",
        "<|tool_call>call:f{a:}<tool_call|>",
        "<|tool_call>call:f[1]<tool_call|>",
        "<|tool_call>call:{a:1}<tool_call|>",
        "<|tool_call>call:f{" + "a" * 20_000 + "}<tool_call|>",
    ],
)
def test_unreadable_gemma4_tool_calls_are_error_replies(text):
    assert parse_gemma4_tool_call(text).startswith("error:")


def test_tools_env_reads_gemma4_calls_when_told():
    env = ToolEnv(tools=["calculator"], call_format="gemma4")
    opening = env.reset({"prompt": "What is 6 * 7?"})
    assert "<|tool_call>call:" in opening[0]["content"]
    step = env.step(f"<|tool_call>call:calculate{{expression:{Q}6*7{Q}}}<tool_call|>")
    assert step.messages == [{"role": "tool", "content": "42"}]
    assert env.step("42.").done
    with pytest.raises(ConfigError, match="call_format"):
        ToolEnv(tools=["calculator"], call_format="xml")


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


# ----- issue 31: hostile tool calls, tools that exit or hang -----------------------------------


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>" + "[" * 5_000 + "]" * 5_000 + "</tool_call>", "nested too deeply"),
        (
            '<tool_call>{"name": "calculate", "arguments": {"expression": ' + "7" * 5_000 + "}}"
            "</tool_call>",
            "cannot be read",
        ),
        ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", "first 65536 characters"),
        ("<tool_call>" + " " * 20_000 + "{}</tool_call>", None),  # stripped: not too long
        ("<tool_call>" + "1" * 20_000 + "</tool_call>", "longer than 16384 characters"),
    ],
)
def test_hostile_tool_calls_are_error_replies(text, error):
    got = parse_tool_call(text)
    if error is None:
        assert got == 'error: a tool call is {"name": <tool name>, "arguments": {...}}'
    else:
        assert isinstance(got, str) and got.startswith("error: ") and error in got, got
    env = ToolEnv()
    step = env.step(text)
    assert step.info == {"tool_calls": 1, "tool_errors": 1}
    assert step.messages[0]["content"].startswith("error: ")


@pytest.mark.parametrize("n", [5_000, 8_192, 20_000])
def test_parsing_many_unclosed_tags_is_linear(n):
    """8,192 unclosed tags took 8.4 s per turn with the regular expression (issue 31); now a
    turn within the scanned prefix (5,000 tags, 55,000 characters) is no call, a longer one an
    error reply, each in well under a millisecond (10 parses < 0.5 s on a loaded machine)."""
    import time

    t = time.perf_counter()
    for _ in range(10):
        got = parse_tool_call("<tool_call>" * n)
    assert time.perf_counter() - t < 0.5
    assert got is None if n * 11 <= 65_536 else got.startswith("error: no </tool_call>")


def exits(x: int) -> str:
    """Calls sys.exit.

    Args:
      x: anything.
    """
    import sys

    sys.exit(x)


def sleeps(seconds: float) -> str:
    """Sleeps.

    Args:
      seconds: how long.
    """
    import time

    time.sleep(seconds)
    return "woke"


def test_a_tool_that_exits_or_hangs_is_an_error_reply():
    env = ToolEnv(
        tools=[
            "tests.envs.test_tools:exits",
            {"name": "tests.envs.test_tools:sleeps", "timeout_s": 0.2},
        ]
    )
    step = env.step('<tool_call>{"name": "exits", "arguments": {"x": 3}}</tool_call>')
    assert step.messages[0]["content"] == "error: SystemExit: 3" and not step.done
    step = env.step('<tool_call>{"name": "sleeps", "arguments": {"seconds": 3}}</tool_call>')
    assert step.messages[0]["content"] == "error: timeout: no answer after 0.2 s"
    step = env.step('<tool_call>{"name": "sleeps", "arguments": {"seconds": 0.01}}</tool_call>')
    assert step.messages[0]["content"] == "woke"


def test_tools_given_as_one_string_is_a_one_element_list():
    assert list(ToolEnv(tools="calculator").tools) == ["calculate"]
    with pytest.raises(ConfigError, match="a tool is a name or"):
        ToolEnv(tools=[{"name": "calculator", "timeout_s": -1}])

"""gpt-oss's harmony tool calls as the ``tools`` environment's ``harmony`` call format
(jaxrl_llm/models/families/gpt_oss/harmony.py, registered in jaxrl_llm/envs/tools.py)."""

import pytest

from jaxrl_llm.envs.tools import ToolEnv, parse_harmony_tool_call

CALL = '{"expression": "6*7"}'


@pytest.mark.parametrize(
    "text,want",
    [
        # the recipient after the channel, with a constraint (the harmony guide's example)
        (
            "<|channel|>analysis<|message|>Multiply.<|end|><|start|>assistant<|channel|>"
            f"commentary to=functions.calculate <|constrain|>json<|message|>{CALL}<|call|>",
            ("calculate", {"expression": "6*7"}),
        ),
        # the recipient in the role part (transformers' gpt-oss chat template)
        (
            f"<|start|>assistant to=functions.calculate<|channel|>commentary json<|message|>"
            f"{CALL}<|call|>",
            ("calculate", {"expression": "6*7"}),
        ),
        # the sampler stopped on <|call|> and left it out
        (
            f"<|channel|>commentary to=functions.calculate json<|message|>{CALL}",
            ("calculate", {"expression": "6*7"}),
        ),
        # the first call wins; no arguments is an empty object
        (
            "<|channel|>commentary to=functions.now<|message|><|call|><|start|>assistant"
            f"<|channel|>commentary to=functions.calculate<|message|>{CALL}<|call|>",
            ("now", {}),
        ),
        # a final answer, and a function named only inside a message body: no call
        ("<|channel|>final<|message|>42<|return|>", None),
        ("<|channel|>analysis<|message|>I could use to=functions.calculate<|end|>", None),
    ],
)
def test_parse_harmony_tool_call_forms(text, want):
    assert parse_harmony_tool_call(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>commentary to=functions.calculate<|message|>{6*7}<|call|>",
        "<|channel|>commentary to=functions.calculate<|message|>[1, 2]<|call|>",
        "<|channel|>commentary to=functions.f<|message|>{" + '"a": 1, ' * 4000 + "}<|call|>",
    ],
)
def test_unreadable_harmony_tool_calls_are_error_replies(text):
    assert parse_harmony_tool_call(text).startswith("error:")


def test_tools_env_reads_harmony_calls_when_told():
    env = ToolEnv(tools=["calculator"], call_format="harmony")
    opening = env.reset({"prompt": "What is 6 * 7?"})
    assert "to=functions.NAME" in opening[0]["content"]
    step = env.step(f"<|channel|>commentary to=functions.calculate<|message|>{CALL}<|call|>")
    assert step.messages == [{"role": "tool", "content": "42"}]
    assert env.step("<|channel|>final<|message|>42<|return|>").done

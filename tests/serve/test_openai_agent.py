"""Agents written against the ``openai`` SDK (jaxrl_llm/serve/openai/agent.py, turns.py): every
request an episode makes is recorded as a turn with the exact ids the endpoint returned, the
turns merge into token-exact segments (the tool's tokens masked), text re-tokenised would
differ, new weights' versions are recorded, and a bad agent costs only its episode."""

import time

import jax
import pytest

from jaxrl_llm.data import CharTokenizer
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.serve import EngineLoop, ServerThread, make_app
from jaxrl_llm.serve.openai import (
    AgentRunner,
    Turn,
    check_rewards,
    endpoint,
    load_agent,
    segments,
)
from jaxrl_llm.serve.served import ServedModel

pytestmark = pytest.mark.slow  # compiles the engine (~40 s on 2 busy cores)

TOK = CharTokenizer()
CONFIG = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2,), pad_token_id=0)


@pytest.fixture(scope="module")
def served():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    p = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)
    return ServedModel("tiny-char", CONFIG, p, TOK, "tiny")


@pytest.fixture(scope="module")
def live(served):
    loop = EngineLoop().start()
    try:
        ep = endpoint(
            served,
            loop,
            max_len=96,
            max_tokens=12,
            num_slots=8,
            page_size=4,
            chunk_steps=4,
            record_turns=True,
        )
        with ServerThread(make_app([ep.protocol])) as s:
            yield s, ep
    finally:
        loop.stop()


def _runner(live, agent, **kw):
    s, ep = live
    return AgentRunner(agent, f"{s.url}/v1", "tiny-char", ep.recorder, **kw)


def chat_tool_agent(client, model, row):
    """Two chat turns with a tool answer between them (the tool: the question's length)."""
    kw = dict(model=model, max_tokens=8, seed=row["seed"], logprobs=True)
    kw["extra_body"] = {"return_token_ids": True}
    messages = [{"role": "user", "content": row["q"]}]
    first = client.chat.completions.create(messages=messages, **kw)
    reply = first.choices[0].message.content
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "tool", "content": str(len(row["q"]))},
    ]
    second = client.chat.completions.create(messages=messages, **kw)
    row["seen"] = [first.model_dump(), second.model_dump()]
    return {"correct": 1.0, "turns": 2}


def token_agent(client, model, row):
    """Token in, token out: the next prompt is the last prompt + the returned ids + a tool's
    tokens, so the two turns are one segment."""
    kw = dict(model=model, max_tokens=6, seed=row["seed"], extra_body={"return_token_ids": True})
    tool = TOK.encode("\ntool: 7\nassistant: ", add_special_tokens=False)
    first = client.completions.create(prompt=row["ids"], **kw).model_dump()["choices"][0]
    prompt = first["prompt_token_ids"] + first["token_ids"] + tool
    second = client.completions.create(prompt=prompt, **kw).model_dump()["choices"][0]
    row["seen"] = [first, second, tool]
    return 0.5


async def async_agent(client, model, row):
    r = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return float(len(r.choices[0].message.content) >= 0)


def test_two_chat_turns_are_recorded_exactly_and_retokenising_differs(live):
    """Each recorded turn holds the prompt ids, ids and log-probs the endpoint returned; the
    reply's text, re-tokenised as the next prompt, is not the sampled ids (lossy text of a
    random model's bytes), so the turns stay two segments, each token-exact."""
    rows = [{"q": "ab>", "seed": 4}, {"q": "xyz?", "seed": 9}]
    out = _runner(live, chat_tool_agent).run(rows)
    for row, o in zip(rows, out, strict=True):
        assert o.error is None and o.rewards == {"correct": 1.0, "turns": 2.0}
        assert len(o.turns) == 2
        for turn, seen in zip(o.turns, row["seen"], strict=True):
            ch = seen["choices"][0]
            assert turn.prompt_token_ids == seen["prompt_token_ids"]
            assert turn.token_ids == ch["token_ids"]
            assert turn.logprobs == [e["logprob"] for e in ch["logprobs"]["content"]]
            assert turn.versions == [0] * len(turn.token_ids)
        ids, text = o.turns[0].token_ids, row["seen"][0]["choices"][0]["message"]["content"]
        assert TOK.encode(text, add_special_tokens=False) != ids  # re-tokenising breaks
        segs = segments(o.turns)
        assert [s.prompt for s in segs] == [t.prompt_token_ids for t in o.turns]
        assert [s.tokens for s in segs] == [t.token_ids for t in o.turns]


def test_token_in_token_out_turns_merge_with_the_tool_masked(live):
    """An agent that extends its own token ids gets one segment: the policy's ids (mask 1,
    their log-probs) and the tool's tokens between them (mask 0)."""
    ids = TOK.apply_chat_template(
        [{"role": "user", "content": "ab>"}], add_generation_prompt=True, tokenize=True
    )
    row = {"ids": ids, "seed": 3}
    (o,) = _runner(live, token_agent).run([row])
    assert o.error is None and o.rewards == {"reward": 0.5}
    first, second, tool = row["seen"]
    (seg,) = segments(o.turns)
    assert seg.prompt == ids
    assert seg.tokens == first["token_ids"] + tool + second["token_ids"]
    n1, n2 = len(first["token_ids"]), len(second["token_ids"])
    assert seg.mask == [1] * n1 + [0] * len(tool) + [1] * n2
    assert seg.logprobs[n1 : n1 + len(tool)] == [0.0] * len(tool)
    assert seg.versions == [0] * n1 + [-1] * len(tool) + [0] * n2


def test_new_weights_record_their_version_and_async_agents_run(live, served):
    s, ep = live
    ep.generator.swap(served.params, 7)
    try:
        (o,) = _runner(live, async_agent).run([{}])
        assert o.error is None and o.rewards == {"reward": 1.0}
        assert o.turns and all(v == 7 for t in o.turns for v in t.versions)
    finally:
        ep.generator.swap(served.params, 0)


def _raises(client, model, row):
    raise ValueError("the harness broke")


def _none(client, model, row):
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "a"}], max_tokens=2
    )


def _text(client, model, row):
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "a"}], max_tokens=2
    )
    return "great"


def _silent(client, model, row):
    return 1.0


def _slow(client, model, row):
    time.sleep(3)
    return 1.0


def test_bad_agents_cost_their_episode_only(live):
    """An agent that raises, returns no reward, returns text, never calls the client or passes
    its timeout fails its own episode with one sentence; a good one beside them is fine."""
    agents = [_raises, _none, _text, _silent, _slow, chat_tool_agent]
    outcomes = [_runner(live, a, timeout_s=1.0).run([{"q": "ab>", "seed": 1}])[0] for a in agents]
    errors = [o.error for o in outcomes]
    assert errors[0] == "ValueError: the harness broke"
    assert "returned no reward" in errors[1]
    assert "str 'great', not a number" in errors[2]
    assert errors[3] == "the agent made no request to the client"
    assert outcomes[4].timed_out and errors[4].startswith("timeout")
    assert errors[5] is None and outcomes[5].rewards["correct"] == 1.0
    assert all(o.rewards is None for o in outcomes[:5])


def test_load_agent_and_check_rewards():
    assert load_agent("tests.serve.test_openai_agent:token_agent") is token_agent
    for spec, why in (("nocolon", "module:function"), ("no_such_mod:run", "cannot import")):
        with pytest.raises(ConfigError, match=why):
            load_agent(spec)
    assert check_rewards(2) == {"reward": 2.0}
    assert check_rewards({"a": 1, "b": 0.5}) == {"a": 1.0, "b": 0.5}
    for bad in (True, float("nan"), {}, {"a": "x"}):
        with pytest.raises(ValueError):
            check_rewards(bad)


def test_segments_split_when_the_context_is_rewritten():
    """A turn whose prompt does not extend the segment so far (a compacted context) starts a
    new segment; one that does is appended with the gap masked."""
    t1 = Turn([1, 2], [3, 4], [-0.1, -0.2], [0, 0], "stop")
    t2 = Turn([1, 2, 3, 4, 9], [5], [-0.3], [1], "stop")
    t3 = Turn([1, 8], [6], [-0.4], [1], "length")
    a, b = segments([t1, t2, t3])
    assert (a.prompt, a.tokens, a.mask) == ([1, 2], [3, 4, 9, 5], [1, 1, 0, 1])
    assert a.logprobs == [-0.1, -0.2, 0.0, -0.3] and a.versions == [0, 0, -1, 1]
    assert (b.prompt, b.tokens, b.mask) == ([1, 8], [6], [1])

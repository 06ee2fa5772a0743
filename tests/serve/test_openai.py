"""The OpenAI-compatible endpoint (jaxrl_llm/serve/openai/) driven by the ``openai`` SDK on a
tiny random model with the byte-level CharTokenizer: chat with log-probs and token ids (equal
to the trainer's log-probs of the same tokens), n > 1 and seeds, streaming, stop strings, tool
calls, completions from text and token ids, concurrent requests decoded together, and every
bad input answered with one sentence."""

import concurrent.futures
import json

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest

from jaxrl_llm.data import CharTokenizer
from jaxrl_llm.models import ModelConfig, forward, init_params
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.serve import EngineLoop, ServerThread, make_app
from jaxrl_llm.serve.openai import Sample, cut_at_stop, protocol, tool_calls
from jaxrl_llm.serve.openai.routes import OpenAIRoutes
from jaxrl_llm.serve.served import ServedModel

# the first test compiles the engine's programs (~50 s on 2 busy cores), the concurrent one
# more prefill buckets (~25 s): the module takes ~2 min
pytestmark = pytest.mark.slow

TOK = CharTokenizer()
CONFIG = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2,), pad_token_id=0)
MAX_LEN, MAX_TOKENS = 96, 24
USER = [{"role": "user", "content": "ab>"}]


@pytest.fixture(scope="module")
def served():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    p = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)  # peaked, varied outputs
    return ServedModel("tiny-char", CONFIG, p, TOK, "tiny")


@pytest.fixture(scope="module")
def server(served):
    loop = EngineLoop().start()
    try:
        proto = protocol(
            served,
            loop,
            max_len=MAX_LEN,
            max_tokens=MAX_TOKENS,
            num_slots=8,
            page_size=4,
            chunk_steps=4,
        )
        with ServerThread(make_app([proto])) as s:
            yield s, loop
    finally:
        loop.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0].url}/v1", api_key="none", max_retries=0)


def _chat(client, **kw):
    kw = {"model": "tiny-char", "messages": USER, "max_tokens": 12} | kw
    return client.chat.completions.create(**kw)


def _trainer_logprobs(params, prompt, tokens, temperature):
    ids = jnp.asarray([prompt + tokens])
    logits, _ = forward(params, ids, config=CONFIG)
    p = len(prompt)
    return np.asarray(token_logprobs(logits[:, p - 1 : -1], ids[:, p:], temperature=temperature))[0]


def test_models_and_chat_logprobs_and_token_ids_equal_the_trainers(client, served):
    """Chat with logprobs, top_logprobs and vLLM's return_token_ids: the prompt ids are the
    chat template's rendering, and each returned log-prob is the trainer's log π_τ of the
    same token (teacher-forced forward) within the engine/trainer tolerance (5e-6)."""
    assert [m.id for m in client.models.list().data] == ["tiny-char"]
    r = _chat(
        client,
        temperature=0.7,
        seed=3,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    body = r.model_dump()
    prompt = TOK.apply_chat_template(USER, add_generation_prompt=True, tokenize=True)
    assert body["prompt_token_ids"] == prompt
    choice = body["choices"][0]
    ids = choice["token_ids"]
    assert 1 <= len(ids) <= 12 and r.usage.completion_tokens == len(ids)
    assert r.usage.prompt_tokens == len(prompt)
    assert choice["message"]["content"] == TOK.decode(ids)
    assert choice["finish_reason"] == ("stop" if ids[-1] == 2 else "length")
    got = np.array([e["logprob"] for e in choice["logprobs"]["content"]])
    want = _trainer_logprobs(served.params, prompt, ids, 0.7)
    delta = np.abs(got - want).max()
    print(f"max |dlogp| endpoint vs trainer: {delta:.3g}")
    assert delta <= 5e-6
    for e in choice["logprobs"]["content"]:
        tops = e["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] >= tops[-1]["logprob"]
        assert e["logprob"] <= tops[0]["logprob"] + 1e-5


def test_n_samples_and_seed_reproduce(client):
    """n = 3 draws three choices; the same seed draws them again, another seed differs."""
    a = _chat(client, n=3, seed=11, extra_body={"return_token_ids": True}).model_dump()
    b = _chat(client, n=3, seed=11, extra_body={"return_token_ids": True}).model_dump()
    c = _chat(client, n=3, seed=12, extra_body={"return_token_ids": True}).model_dump()
    ids = [ch["token_ids"] for ch in a["choices"]]
    assert [ch["index"] for ch in a["choices"]] == [0, 1, 2]
    assert ids == [ch["token_ids"] for ch in b["choices"]]
    assert ids != [ch["token_ids"] for ch in c["choices"]]
    assert len({tuple(x) for x in ids}) > 1  # the samples of one request differ
    assert a["usage"]["completion_tokens"] == sum(map(len, ids))


def test_streaming_equals_the_whole_reply(client):
    """A streamed reply arrives in several chunks whose content and token ids add up to the
    unstreamed reply with the same seed; usage comes last when asked."""
    kw = dict(seed=5, max_tokens=20, extra_body={"return_token_ids": True, "top_k": 0})
    whole = _chat(client, **kw).model_dump()["choices"][0]
    stream = _chat(client, stream=True, stream_options={"include_usage": True}, **kw)
    chunks = [c.model_dump() for c in stream]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(p["delta"]["content"] or "" for p in pieces)
    ids = [t for p in pieces for t in (p.get("token_ids") or [])]
    assert text == whole["message"]["content"] and ids == whole["token_ids"]
    assert sum(1 for p in pieces if p.get("token_ids")) >= 2  # several decode chunks
    assert pieces[-1]["finish_reason"] == whole["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_stop_string_cuts_text_and_tokens(client):
    """A stop string taken from a sampled reply cuts the text before it and the token ids
    after the token that completed it; finish_reason is stop (also when streamed)."""
    kw = dict(seed=7, max_tokens=20, extra_body={"return_token_ids": True})
    full = _chat(client, **kw).model_dump()["choices"][0]
    text = full["message"]["content"]
    # an ASCII character (one byte, one token of the byte tokenizer) after the start
    at = next(i for i, ch in enumerate(text) if i >= 2 and ch.isascii())
    stop = text[at]
    at = text.find(stop)
    r = _chat(client, stop=[stop, "never"], **kw).model_dump()["choices"][0]
    assert r["message"]["content"] == text[:at]
    assert r["finish_reason"] == "stop"
    assert r["token_ids"] == full["token_ids"][: len(r["token_ids"])]
    assert len(r["token_ids"]) < len(full["token_ids"])
    assert stop in TOK.decode(r["token_ids"]) and stop not in TOK.decode(r["token_ids"][:-1])
    pieces = [c.choices[0] for c in _chat(client, stop=stop, stream=True, **kw) if c.choices]
    assert "".join(p.delta.content or "" for p in pieces) == text[:at]
    assert pieces[-1].finish_reason == "stop"


def test_cut_at_stop_and_tool_call_parser():
    """The helpers alone: a stop string spanning tokens; Hermes calls, several per reply, a
    malformed one left in the text."""
    ids = TOK.encode("hello world", add_special_tokens=False)
    assert cut_at_stop(TOK, ids, ["o w"]) == (7, "hell", True)
    assert cut_at_stop(TOK, ids, ["zz"]) == (len(ids), "hello world", False)
    text = (
        'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "neg", "arguments": "{\\"x\\": 3}"}</tool_call>'
    )
    content, calls = tool_calls(text, "hermes")
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add", "neg"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": 3}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert tool_calls("<tool_call>{oops</tool_call>", "hermes") == (
        "<tool_call>{oops</tool_call>",
        [],
    )


class _FakeGenerator:
    """Answers every job with fixed text (a tool call the tiny model cannot be made to write)."""

    max_len, gen_len, num_slots = MAX_LEN, MAX_TOKENS, 8
    forced = None  # no training run's sampling

    def __init__(self, text):
        self.ids = TOK.encode(text, add_special_tokens=False) + [2]
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job)
        f = concurrent.futures.Future()
        f.set_result([Sample(self.ids, [-0.5] * len(self.ids), True, [0] * len(self.ids))])
        return f


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def test_tool_call_on_the_route(served):
    """A reply holding a Hermes call comes back as ``tool_calls`` with finish_reason
    tool_calls, plain and streamed; with tool_choice none it stays text; the assistant's call
    and the tool's answer are accepted as history."""
    fake = _FakeGenerator('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    routes = OpenAIRoutes(served, fake, "hermes")
    from jaxrl_llm.serve.openai import error_body
    from jaxrl_llm.serve.server import Protocol

    app = make_app([Protocol("openai", routes.router, prefix="/v1/", error_body=error_body)])
    with ServerThread(app) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)
        r = _chat(client, tools=TOOLS)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        call = msg.tool_calls[0]
        assert call.function.name == "add" and json.loads(call.function.arguments) == {
            "a": 2,
            "b": 3,
        }
        chunks = [c for c in _chat(client, tools=TOOLS, stream=True) if c.choices]
        streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert streamed[0].function.name == "add" and streamed[0].index == 0
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        r = _chat(client, tools=TOOLS, tool_choice="none")
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content.startswith("<tool_call>")
        history = USER + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        _chat(client, messages=history, tools=TOOLS)
        assert "tool: 5" in TOK.decode(fake.jobs[-1].prompt)


def test_tools_on_the_real_model(client):
    """The tiny model with tools: a well-formed response whichever way it goes."""
    r = _chat(client, tools=TOOLS, tool_choice="auto")
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.choices[0].message.role == "assistant"


def test_completions_from_text_and_token_ids(client):
    """Completions take text (BOS added) or token ids, several prompts at once, logprobs as
    an int; choices are prompt-major and token-exact."""
    ids = TOK.encode("xy>", add_special_tokens=True)
    r = client.completions.create(
        model="tiny-char",
        prompt="xy>",
        max_tokens=8,
        seed=2,
        logprobs=2,
        extra_body={"return_token_ids": True},
    ).model_dump()
    ch = r["choices"][0]
    assert ch["prompt_token_ids"] == ids and ch["text"] == TOK.decode(ch["token_ids"])
    assert len(ch["logprobs"]["token_logprobs"]) == len(ch["token_ids"])
    assert all(len(t) <= 2 for t in ch["logprobs"]["top_logprobs"])
    r2 = client.completions.create(
        model="tiny-char",
        prompt=[ids, ids[1:]],
        max_tokens=8,
        seed=2,
        n=2,
        extra_body={"return_token_ids": True},
    ).model_dump()
    assert [c["index"] for c in r2["choices"]] == [0, 1, 2, 3]
    assert r2["choices"][0]["token_ids"] == ch["token_ids"]  # same prompt, seed and sample
    assert r2["choices"][2]["prompt_token_ids"] == ids[1:]


def test_concurrent_requests_are_batched_and_unchanged(client, server):
    """Eight requests at once are decoded together (fewer admissions than requests) and each
    draws what it draws alone (its seed keys its rows, not its neighbours)."""
    kw = dict(max_tokens=16, temperature=0.9, extra_body={"return_token_ids": True})
    alone = [
        _chat(client, seed=100 + i, **kw).choices[0].model_dump()["token_ids"] for i in range(8)
    ]
    loop = server[1]
    before = loop.groups["openai.admit"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(_chat, client, seed=100 + i, **kw) for i in range(8)]
        together = [f.result().choices[0].model_dump()["token_ids"] for f in futs]
    assert together == alone
    assert loop.groups["openai.admit"] - before < 8


def test_bad_inputs_get_one_sentence(client):
    """Over the context length (400 with the numbers), over the reply limit, an unknown model
    (404), malformed messages, malformed tools, a forced tool choice, a token id outside the
    vocabulary, n over the slots: each one sentence, and the server goes on."""
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=[{"role": "user", "content": "x" * 200}])
    assert "maximum context length is 96 tokens" in str(e.value)
    assert "your prompt has 218 tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=[{"role": "user", "content": "x" * 70}])
    assert "100 tokens (88 in the prompt, 12 in the completion)" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, max_tokens=80)
    assert "max_tokens is 80, more than this server's limit of 24" in str(e.value)
    with pytest.raises(openai.NotFoundError) as e:
        _chat(client, model="gpt-9")
    assert "'gpt-9' does not exist" in str(e.value) and "tiny-char" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=[{"role": "robot", "content": "hi"}])
    assert "messages[0].role" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    assert "only text parts" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, tools=[{"type": "function", "function": {"description": "no name"}}])
    assert "tools[0].function.name" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, tools=TOOLS, tool_choice="required")
    assert "constrained decoding" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-char", prompt=[5, 999], max_tokens=4)
    assert "token id 999" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, n=9)
    assert "at most 8" in str(e.value)
    assert _chat(client).choices[0].message.role == "assistant"  # still serving

"""The OpenAI-compatible endpoint on SmolLM2-135M-Instruct, driven by the ``openai`` SDK:
the chat template's prompt ids, the returned log-probs equal the trainer's teacher-forced
log-probs of the returned ids, n > 1 and streaming agree, a stop string cuts the reply."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is 37 + 45? Reply with just the number."}]


@pytest.fixture(scope="module")
def real():
    interop = pytest.importorskip("jaxrl_llm.interop")
    try:
        interop.resolve_alias("smollm2-135m-instruct")
    except Exception as e:  # package not installed
        pytest.skip(str(e))
    return interop.load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def client(real):
    openai = pytest.importorskip("openai")
    from jaxrl_llm.serve import EngineLoop, ServerThread, make_app
    from jaxrl_llm.serve.openai import protocol
    from jaxrl_llm.serve.served import ServedModel

    config, params, tok = real
    served = ServedModel("smollm2", config, params, tok, "smollm2-135m-instruct")
    loop = EngineLoop().start()
    try:
        proto = protocol(
            served, loop, max_len=256, max_tokens=32, num_slots=4, page_size=16, chunk_steps=8
        )
        with ServerThread(make_app([proto])) as s:
            yield openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)
    finally:
        loop.stop()


def test_chat_logprobs_equal_the_trainers(real, client):
    """Greedy chat: prompt ids are the template's, the text is the ids' text, and every
    log-prob equals the trainer's within the engine/trainer tolerance on this model (5e-5,
    tests/sampling/test_engine_real_model.py)."""
    from jaxrl_llm.models import forward
    from jaxrl_llm.ops import token_logprobs

    config, params, tok = real
    r = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        temperature=0,
        max_tokens=16,
        logprobs=True,
        extra_body={"return_token_ids": True},
    ).model_dump()
    prompt = tok.encode(
        tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    assert r["prompt_token_ids"] == prompt
    ch = r["choices"][0]
    ids = ch["token_ids"]
    assert ch["message"]["content"] == tok.decode(ids, skip_special_tokens=True)
    assert ch["message"]["content"].strip()  # (the 135M model answers "37 + 45 = 100")
    assert ch["finish_reason"] == "stop" and ids[-1] in config.eos_token_ids
    seq = jnp.asarray([prompt + ids])
    logits, _ = jax.jit(lambda p, t: forward(p, t, config=config))(params, seq)
    want = np.asarray(
        token_logprobs(logits[:, len(prompt) - 1 : -1], seq[:, len(prompt) :], temperature=1.0)
    )[0]
    got = np.array([e["logprob"] for e in ch["logprobs"]["content"]])
    delta = np.abs(got - want).max()
    print(f"SmolLM2 endpoint max |dlogp| {delta:.3g}")
    assert delta <= 5e-5


def test_samples_stream_and_stop(client):
    """n = 2 sampled replies; a streamed reply with the same seed is the same text and ids; a
    stop string (a space) cuts the first reply before its first space."""
    kw = dict(
        model="smollm2",
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
        temperature=0.8,
        seed=1,
        max_tokens=24,
        extra_body={"return_token_ids": True},
    )
    r = client.chat.completions.create(n=2, **kw).model_dump()
    first = r["choices"][0]
    assert len(r["choices"]) == 2 and r["choices"][1]["token_ids"] != first["token_ids"]
    pieces = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    assert "".join(p.delta.content or "" for p in pieces) == first["message"]["content"]
    assert [t for p in pieces for t in (p.model_extra.get("token_ids") or [])] == first["token_ids"]
    text = first["message"]["content"]
    assert " " in text
    cut = client.chat.completions.create(stop=" ", **kw).choices[0]
    assert cut.message.content == text[: text.index(" ")] and cut.finish_reason == "stop"

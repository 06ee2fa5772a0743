"""Training with an agent written against the ``openai`` SDK (``env: {name: openai_agent}``,
jaxrl_llm/train/online/agent_sampler.py): the experience holds exactly the ids the endpoint
returned per turn with the tool's tokens masked, the run's sampling settings apply whatever the
agent asks, failed agents cost their episodes, and a GRPO run trains 2 steps."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.data.tokenize import CharTokenizer, TokenizedPrompt
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, forward, init_params
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import SamplingConfig
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.config.sections import EnvSection, RolloutSection
from jaxrl_llm.train.online.agent_sampler import AgentSampler
from jaxrl_llm.train.online.trainer import train_online
from jaxrl_llm.train.run.logging import read_metrics

pytestmark = pytest.mark.slow  # compiles the engine and a train step (~1-2 min on 2 cores)

TOK = CharTokenizer()
TOOL = TOK.encode("\ntool: 42\nassistant: ", add_special_tokens=False)
SEEN: dict[str, list] = {}
_LOCK = threading.Lock()


def tool_agent(client, model, row):
    """Turn 1 by chat; turn 2 token in, token out: the last prompt + its reply's ids + the
    tool's answer. Records what the endpoint returned under the row's prompt text."""
    question = row["prompt"][-1]["content"] if isinstance(row["prompt"], list) else row["prompt"]
    first = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=12,
        temperature=0.1,  # overridden by the run's rollout.temperature
        extra_body={"return_token_ids": True},
        logprobs=True,
    ).model_dump()
    ids = first["prompt_token_ids"] + first["choices"][0]["token_ids"] + TOOL
    second = client.completions.create(
        model=model, prompt=ids, max_tokens=4, extra_body={"return_token_ids": True}
    ).model_dump()
    with _LOCK:
        SEEN.setdefault(question, []).append((first, second))
    return 1.0 if any(c.isdigit() for c in second["choices"][0]["text"]) else 0.0


def broken_agent(client, model, row):
    if "1" in str(row["prompt"]):
        raise RuntimeError("harness crashed")
    return tool_agent(client, model, row)


def _items(n):
    qs = [f"{a}{b}>" for a, b in zip("1234", "5678")][:n]
    return [
        TokenizedPrompt(
            prompt=({"role": "user", "content": q},),
            prompt_ids=tuple(
                TOK.apply_chat_template([{"role": "user", "content": q}], True, tokenize=True)
            ),
            extras={},
        )
        for q in qs
    ]


def test_experience_holds_the_returned_ids_with_the_tool_masked():
    config = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))
    env = EnvSection(name="openai_agent", kwargs={"agent": f"{__name__}:broken_agent"})
    settings = RolloutSection(max_new_tokens=40, group_size=2)
    sampler = AgentSampler(
        env,
        settings,
        None,
        tokenizer=TOK,
        model_config=config,
        prompt_buckets=(16, 32),
    )
    SEEN.clear()
    try:
        run = SamplingConfig(temperature=0.7)
        exp = sampler(params, 3, _items(2), sampling=run, seed=0, num_samples=2)
    finally:
        sampler.close()
    assert exp.valid.tolist() == [False, False, True, True]  # "15>" crashed its harness
    assert exp.metrics["env/failed"] == 2 and exp.metrics["agent/extra_segments"] == 0
    assert np.all(exp.policy_version == 3)
    ro = exp.rollout
    seen = SEEN["26>"]
    rows = []
    for i in (2, 3):
        n = int(ro.prompt_mask[i].sum())
        prompt = ro.prompt_tokens[i, -n:].tolist()
        k = int(exp.context_mask[i].sum())
        rows.append((prompt, ro.tokens[i, :k].tolist(), ro.mask[i, :k].tolist(), ro.logprobs[i]))
    for first, second in seen:
        c1, c2 = first["choices"][0], second["choices"][0]
        want = c1["token_ids"] + TOOL + c2["token_ids"]
        row = next(r for r in rows if r[1] == want)  # the experience row of this episode
        assert row[0] == first["prompt_token_ids"]
        n1 = len(c1["token_ids"])
        assert row[2] == [1] * n1 + [0] * len(TOOL) + [1] * len(c2["token_ids"])
        lp = [e["logprob"] for e in c1["logprobs"]["content"]]
        np.testing.assert_allclose(row[3][:n1], lp, rtol=0, atol=1e-6)
        # sampled at the run's temperature (0.7), not the agent's 0.1: the trainer's log-probs
        seq = jnp.asarray([row[0] + c1["token_ids"]])
        logits, _ = forward(params, seq, config=config)
        p = len(row[0])
        want_lp = token_logprobs(logits[:, p - 1 : -1], seq[:, p:], temperature=0.7)
        np.testing.assert_allclose(lp, np.asarray(want_lp)[0], rtol=0, atol=5e-6)


def test_grpo_run_with_an_openai_agent(chat_data, tmp_path):
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "run"),
            max_steps=2,
            algorithm="grpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
            optim=dict(lr=1e-2),
            data=dict(train=str(chat_data / "train.jsonl"), max_length=32),
            rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=40, engine="paged"),
            rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
            env=dict(name="openai_agent", kwargs=dict(agent=f"{__name__}:tool_agent")),
            logging=dict(tensorboard=False, plots=False),
        ),
    )
    train_online(cfg)
    rows = [r for r in read_metrics(tmp_path / "run") if r.get("loss") is not None]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["loss"]) and r["env/failed"] == 0 and r["env/turns_mean"] == 2


def test_a_missing_agent_is_refused_at_start(chat_data, tmp_path):
    from jaxrl_llm.train.online.episode_sampler import check_environment

    with pytest.raises(ConfigError, match="cannot import"):
        check_environment(EnvSection(name="openai_agent", kwargs={"agent": "nope:run"}), None)

"""Multi-turn episodes on the paged engine (jaxrl_llm.envs.episodes) with a scripted
environment and the tiny model: the transcript's layout (policy tokens with log-probs,
environment tokens masked), rewards, log-probs equal to a teacher-forced forward over the whole
conversation, environment calls beside generation, failures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import ops
from jaxrl_llm.data.tokenize import CharTokenizer
from jaxrl_llm.envs import ChatCodec, EnvError, Episode, run_episodes
from jaxrl_llm.models import ModelConfig, apply, init_params
from jaxrl_llm.sampling import SamplingConfig, stop_token_ids
from tests.envs.scripted import STOP, AlwaysFails, ReturnsDict, Scripted

TOK = CharTokenizer()
# letters and digits end a policy turn, so the random tiny model ends turns after a few tokens
SAMPLING = SamplingConfig(temperature=1.0, stop_token_ids=STOP)


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.tiny(vocab_size=259, max_position_embeddings=512)
    return config, init_params(config, jax.random.PRNGKey(0))


def _episodes(prompts, g, make_env):
    return [
        Episode(
            item={"prompt": p},
            prompt_id=i,
            sample_id=s,
            env=make_env(i, s),
            fallback_ids=TOK.encode(p),
        )
        for i, p in enumerate(prompts)
        for s in range(g)
    ]


def _play(model, episodes, g=2, **kw):
    config, params = model
    codec = ChatCodec(TOK, stop_token_ids(config, SAMPLING))
    args = dict(max_turns=4, turn_tokens=16, budget=160, workers=4)
    args.update(kw)
    stats = run_episodes(
        params, config, episodes, codec=codec, sampling=SAMPLING, seed=3, group_size=g, **args
    )
    return codec, stats


def _runs(mask):
    """(start, end, value) runs of a 0/1 list."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_transcript_layout_rewards_and_teacher_forced_logprobs(model):
    config, params = model
    eps = _episodes(["hi>", "yo>"], 2, lambda i, s: Scripted(replies=("ok", "more")))
    codec, _ = _play(model, eps)
    forward = jax.jit(lambda p, x: apply(p, x, config=config))
    assert {ep.turns for ep in eps} - {3} == {ep.turns for ep in eps if ep.truncated} - {3}
    for ep in eps:
        assert ep.error is None and ep.done
        assert len(ep.tokens) == len(ep.mask) == len(ep.logprobs) <= 160
        # the policy's turns and the environment's replies alternate, starting with the policy
        runs = _runs(ep.mask)
        assert [v for _, _, v in runs] == [1, 0] * (len(runs) // 2) + [1] * (len(runs) % 2)
        policy = [m for m in ep.messages if m["role"] == "assistant"]
        replies = [m for m in ep.messages[1:] if m["role"] == "user"]
        assert (
            len(policy) == ep.turns
            and [m["content"] for m in replies] == ["ok", "more"][: len(runs) // 2]
        )
        history = ep.messages[:1]
        for k, (a, b, v) in enumerate(runs):
            if v == 1:
                assert TOK.decode(ep.tokens[a:b]) == policy[k // 2]["content"]
                assert all(lp < 0 for lp in ep.logprobs[a:b])
                history = history + [policy[k // 2]]
            else:  # exactly what the chat template adds for the reply, after the stop token
                want = codec.reply(history, [replies[k // 2]], last_token=ep.tokens[a - 1])
                assert ep.tokens[a:b] == want
                assert all(lp == 0.0 for lp in ep.logprobs[a:b])
                history = history + [replies[k // 2]]
        # reward: every policy turn is answered; 0.25, 0.5, then 1.0 with done
        assert ep.reward == pytest.approx([0.25, 0.75, 1.75, 1.75][ep.turns - 1])
        # the sampler's log-probs equal a teacher-forced forward over the whole conversation
        full = np.asarray(ep.opening_ids + ep.tokens, np.int32)[None]
        out = forward(params, jnp.asarray(full))
        lp = np.asarray(
            ops.token_logprobs_from_hidden(
                out.hidden[:, :-1], out.unembed, jnp.asarray(full[:, 1:]), chunk_size=64
            )
        )[0]
        p = len(ep.opening_ids)
        m = np.asarray(ep.mask, bool)
        got = np.asarray(ep.logprobs)[m]
        want = lp[p - 1 : p - 1 + len(ep.tokens)][m]
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_environment_calls_overlap_and_other_rows_keep_decoding(model):
    """Two episodes whose environment sleeps 2 s per step and two whose environment answers at
    once: the slow calls run at the same time (a thread pool), and the fast episodes play all
    their turns while the slow ones wait (continuous batching, no batch-wide barrier)."""

    def make(i, s):
        if i == 0:
            return Scripted(replies=("a",), sleep=2.0, tag="slow")
        return Scripted(replies=("x", "y"), tag="fast")

    _play(model, _episodes(["p>", "q>"], 2, make))  # compile every program first
    Scripted.calls.clear()
    Scripted.max_in_flight = 0
    eps = _episodes(["p>", "q>"], 2, make)
    _, stats = _play(model, eps)
    slow = [c for c in Scripted.calls if c[0] == "slow"]
    fast = [c for c in Scripted.calls if c[0] == "fast"]
    assert Scripted.max_in_flight >= 2
    assert len(fast) == sum(ep.turns for ep in eps[2:]) and len(fast) > 2
    first_slow_answer = min(end for _, _, end in slow)
    assert max(end for _, _, end in fast) < first_slow_answer, (slow, fast)
    assert stats["idle_s"] > 0  # the host waited only when no row was decoding


def test_a_failing_environment_marks_its_episode_invalid(model):
    eps = _episodes(
        ["p>", "q>"],
        2,
        lambda i, s: Scripted(replies=("a",), fail_on=0 if (i, s) == (1, 0) else None),
    )
    _play(model, eps)
    assert [ep.error is not None for ep in eps] == [False, False, True, False]
    assert "scripted failure" in eps[2].error
    assert eps[2].turns == 1 and eps[2].done


def test_step_returning_a_non_step_is_a_clear_error(model):
    eps = _episodes(["p>"], 1, lambda i, s: ReturnsDict())
    with pytest.raises(EnvError, match="returned dict, not jaxrl_llm.envs.Step"):
        _play(model, eps, g=1)


def test_always_failing_env_episodes_all_invalid(model):
    eps = _episodes(["p>", "q>"], 1, lambda i, s: AlwaysFails())
    _play(model, eps, g=1)
    assert all(ep.error and "always fails" in ep.error for ep in eps)


# ----- issue 31: environments that exit, hang, overflow or write strings ---------------------


def test_misbehaving_environments_fail_only_their_episodes(model, caplog):
    """Each prompt's episodes misbehave on their first step as its mode says; the others play
    on. A hang is cut at ``step_timeout_s``; the run never sees an exception."""
    from tests.envs.scripted import Misbehaves

    modes = ["exit", "exit3", "interrupt", "raise", "hang", "huge", "text_info", "ok"]
    eps = [
        Episode(
            item={"prompt": f"{i}>", "mode": m},
            prompt_id=i,
            sample_id=0,
            env=Misbehaves(replies=("ok",), hang_s=3.0),
            fallback_ids=TOK.encode(f"{i}>"),
        )
        for i, m in enumerate(modes)
    ]
    import time

    t = time.perf_counter()
    _play(model, eps, g=1, step_timeout_s=0.5)
    assert time.perf_counter() - t < 30
    errors = {m: ep.error for m, ep in zip(modes, eps)}
    assert errors["exit"] == "step: SystemExit: 0"
    assert errors["exit3"] == "step: SystemExit: 3"
    assert errors["interrupt"] == "step: KeyboardInterrupt"
    assert errors["raise"] == "step: RuntimeError: misbehaving environment"
    assert errors["hang"] == "step: timeout: no answer after 0.5 s" and eps[4].timed_out
    # 1e308 is a finite float, but the float32 the update trains on cannot hold it
    assert errors["huge"] == "step: the episode's summed reward 1e+308 is not a finite float32"
    assert errors["text_info"] is None and errors["ok"] is None
    assert dict(eps[6].info) == {"n": 2} and eps[6].notes == {"note": "a string"}


def test_an_opening_past_the_context_or_empty_fails_its_episode(model):
    class Long(Scripted):
        def reset(self, item):
            return [{"role": "user", "content": "x" * 1000}]

    class Empty(Scripted):
        def reset(self, item):
            return []

    eps = _episodes(["p>", "q>", "r>"], 1, lambda i, s: [Scripted(), Long(), Empty()][i])
    _play(model, eps, g=1)  # context 512, budget 160: openings up to 352 tokens
    assert eps[0].error is None
    assert eps[1].opening_too_long and "more than the 352" in eps[1].error
    assert "reset returned no messages" in eps[2].error


def test_a_batch_whose_every_reset_fails_stops_with_the_knobs_to_turn(model):
    class Broken(Scripted):
        def reset(self, item):
            raise RuntimeError("no such task")

    class Long(Scripted):
        def reset(self, item):
            return [{"role": "user", "content": "x" * 1000}]

    eps = _episodes(["p>", "q>"], 2, lambda i, s: Broken())
    with pytest.raises(EnvError, match=r"every episode failed at reset \(4 of 4\).*no such task"):
        _play(model, eps)
    eps = _episodes(["p>"], 2, lambda i, s: Long())
    with pytest.raises(EnvError, match="raise data.max_length.*longer context"):
        _play(model, eps)
    # one episode that starts is enough to go on
    eps = _episodes(["p>", "q>"], 1, lambda i, s: [Scripted(), Broken()][i])
    _play(model, eps, g=1)
    assert eps[0].error is None and "no such task" in eps[1].error

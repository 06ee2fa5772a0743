"""The record between rollout and learner (train/online/experience.py): :class:`Experience` and its
group selection, :func:`concat_experience`, the ``rl`` learner batch of :func:`rl_batch`, and
the staleness rule of :class:`ExperienceBuffer`. Records are built by hand from tiny arrays."""

import dataclasses

import numpy as np
import pytest

from jaxrl_llm.sampling import Rollout
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.experience import (
    Experience,
    ExperienceBuffer,
    concat_experience,
    rl_batch,
)


def make_rollout(prompt_tokens, prompt_mask, tokens, mask, logprobs, truncated=None) -> Rollout:
    """A host Rollout of N rows from ``[N, P]`` prompts and ``[N, M]`` completions."""
    tokens, mask = np.asarray(tokens, np.int32), np.asarray(mask, np.int32)
    n = len(tokens)
    lengths = mask.sum(-1).astype(np.int32)
    trunc = np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool)
    return Rollout(
        tokens=tokens,
        mask=mask,
        lengths=lengths,
        finished=~trunc,
        truncated=trunc,
        logprobs=np.asarray(logprobs, np.float32) * mask,
        prompt_tokens=np.asarray(prompt_tokens, np.int32),
        prompt_mask=np.asarray(prompt_mask, np.int32),
        prompt_ids=np.arange(n, dtype=np.int32),
        sample_ids=np.zeros(n, np.int32),
    )


def make_experience(rollout: Rollout, rewards, *, group_size, valid=None, **kw) -> Experience:
    """An Experience around ``rollout``: texts/prompts/extras named after the row index."""
    n = len(rollout.tokens)
    rewards = np.asarray(rewards, np.float32)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    base = dict(
        rollout=rollout,
        texts=[f"completion {i}" for i in range(n)],
        prompts=[f"prompt {i}" for i in range(n)],
        extras=[{"answer": str(i)} for i in range(n)],
        rewards=np.where(valid, rewards, 0.0).astype(np.float32),
        valid=valid,
        scores={"r": np.where(valid, rewards, np.nan)},
        metrics={"reward/mean": float(rewards.mean())},
        group_size=group_size,
        policy_version=np.zeros(n, np.int64),
    )
    return Experience(**{**base, **kw})


def random_experience(seed: int, *, groups: int, group_size: int, p: int, m: int, **kw):
    """Left-padded prompts and right-padded completions of random lengths (padding filled with
    garbage ids and log-probs, which no result may read)."""
    rs = np.random.RandomState(seed)
    n = groups * group_size
    p_len = rs.randint(1, p + 1, n)
    c_len = rs.randint(1, m + 1, n)
    prompt_mask = (np.arange(p)[None, :] >= p - p_len[:, None]).astype(np.int32)
    mask = (np.arange(m)[None, :] < c_len[:, None]).astype(np.int32)
    ro = make_rollout(
        rs.randint(3, 50, (n, p)) * prompt_mask,
        prompt_mask,
        rs.randint(3, 50, (n, m)) * mask,
        mask,
        -rs.rand(n, m),
    )
    return make_experience(ro, rs.rand(n), group_size=group_size, **kw)


def grpo_plan(**rollout):
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir="/tmp/unused",
            max_steps=1,
            algorithm="grpo",
            model=dict(source="tiny", tokenizer="char"),
            data=dict(train="unused.jsonl"),
            loss=dict(kl_coef=0.0),
            rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=3, **rollout),
            rewards=[dict(name="math_answer")],
        ),
    )
    return plan_run(cfg, {"data": 1})


# ----- rl_batch --------------------------------------------------------------------------------


def test_rl_batch_hand_computed():
    # row 0: prompt [_, 5, 6] (one left pad), completion [7, 8] both real;
    # row 1: prompt [4, 5, 6], completion [9, pad]
    ro = make_rollout(
        prompt_tokens=[[0, 5, 6], [4, 5, 6]],
        prompt_mask=[[0, 1, 1], [1, 1, 1]],
        tokens=[[7, 8], [9, 0]],
        mask=[[1, 1], [1, 0]],
        logprobs=[[-0.5, -0.25], [-1.0, -9.0]],
    )
    exp = make_experience(ro, [1.0, 0.0], group_size=2)
    b = rl_batch(exp, np.array([2.0, -1.0], np.float32), np.ones(2, np.int32))
    np.testing.assert_array_equal(b["input_ids"], [[0, 5, 6, 7, 8], [4, 5, 6, 9, 0]])
    np.testing.assert_array_equal(b["attention_mask"], [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]])
    np.testing.assert_allclose(b["old_logp"], [[0, 0, 0, -0.5, -0.25], [0, 0, 0, -1.0, 0]])
    np.testing.assert_allclose(b["advantages"], [[0, 0, 0, 2, 2], [0, 0, 0, -1, 0]])


def test_rl_batch_dtypes_are_the_layouts():
    exp = random_experience(0, groups=1, group_size=2, p=3, m=2)
    b = rl_batch(exp, np.array([1.0, -1.0], np.float32), np.ones(2, np.int32))
    want = {
        k: np.dtype(dtype)
        for k, (_, dtype) in grpo_plan().input_layout.shapes(rows=2, tokens=5).items()
    }
    assert {k: v.dtype for k, v in b.items()} == want


def test_rl_batch_loss_weight_zeroes_a_row_and_its_entries():
    exp = random_experience(0, groups=2, group_size=2, p=4, m=3)
    adv = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    b = rl_batch(exp, adv, np.array([1, 0, 1, 1], np.int32))
    assert b["loss_mask"][1].sum() == 0
    assert not b["old_logp"][1].any() and not b["advantages"][1].any()
    # the row still attends to its tokens: a weight is not a mask of the model's input
    np.testing.assert_array_equal(b["attention_mask"][1, 4:], exp.rollout.mask[1])


@pytest.mark.parametrize("per_token", [False, True], ids=["per_sequence", "per_token"])
def test_rl_batch_targets_in_last_window_and_zero_off_mask(per_token):
    m = 5
    exp = random_experience(1, groups=3, group_size=2, p=6, m=m)
    n = len(exp)
    rs = np.random.RandomState(2)
    adv = rs.randn(n, m).astype(np.float32) if per_token else rs.randn(n).astype(np.float32)
    b = rl_batch(exp, adv, np.ones(n, np.int32))
    t = b["input_ids"].shape[1]
    assert t == 6 + m
    # every target sits in the last max_new_tokens columns (what the log-prob window reads)
    assert not b["loss_mask"][:, : t - m].any()
    np.testing.assert_array_equal(b["loss_mask"][:, t - m :], exp.rollout.mask)
    off = b["loss_mask"] == 0
    assert not b["old_logp"][off].any() and not b["advantages"][off].any()
    # on the mask: the behaviour log-probs and the advantage of the row (or token)
    on = b["loss_mask"][:, t - m :] == 1
    np.testing.assert_allclose(b["old_logp"][:, t - m :][on], exp.rollout.logprobs[on])
    want = adv if per_token else np.repeat(adv[:, None], m, 1)
    np.testing.assert_allclose(b["advantages"][:, t - m :][on], want[on])
    # and it is the batch the plan's rl layout describes
    grpo_plan().input_layout.check(b, where="rl_batch")


def test_rl_batch_context_mask_attends_to_environment_tokens_without_training_on_them():
    ro = make_rollout(
        prompt_tokens=[[5, 6]],
        prompt_mask=[[1, 1]],
        tokens=[[7, 30, 31, 8]],  # policy token, two environment tokens, policy token
        mask=[[1, 0, 0, 1]],
        logprobs=[[-0.5, 0.0, 0.0, -0.75]],
    )
    exp = make_experience(ro, [1.0], group_size=1, context_mask=np.array([[1, 1, 1, 1]]))
    b = rl_batch(exp, np.array([3.0], np.float32), np.ones(1, np.int32))
    np.testing.assert_array_equal(b["attention_mask"], [[1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 1, 0, 0, 1]])
    np.testing.assert_allclose(b["advantages"], [[0, 0, 3, 0, 0, 3]])


# ----- Experience ------------------------------------------------------------------------------


def test_experience_len_groups_and_select_groups_keeps_whole_groups_in_order():
    exp = random_experience(
        3,
        groups=3,
        group_size=2,
        p=3,
        m=2,
        policy_version=np.array([4, 4, 5, 5, 6, 6]),
        context_mask=np.arange(12).reshape(6, 2),
        token_version=np.arange(12).reshape(6, 2) + 100,
        messages=[[{"role": "user", "content": str(i)}] for i in range(6)],
        sources=[f"src {i}" for i in range(6)],
    )
    # a mixture of experts' recorded routing [N, P + M, L, k] (rollout routing replay)
    routing = np.arange(6 * 5 * 2 * 2, dtype=np.int16).reshape(6, 5, 2, 2)
    exp = dataclasses.replace(exp, rollout=exp.rollout._replace(routing=routing))
    assert len(exp) == 6 and exp.num_groups == 3
    sub = exp.select_groups(np.array([True, False, True]))
    np.testing.assert_array_equal(sub.routing, routing[[0, 1, 4, 5]])
    rows = [0, 1, 4, 5]
    assert len(sub) == 4 and sub.num_groups == 2 and sub.group_size == 2
    for name, value in sub.rollout._asdict().items():
        np.testing.assert_array_equal(value, getattr(exp.rollout, name)[rows], err_msg=name)
    assert sub.texts == [exp.texts[i] for i in rows]
    assert sub.prompts == [exp.prompts[i] for i in rows]
    assert sub.extras == [exp.extras[i] for i in rows]
    assert sub.messages == [exp.messages[i] for i in rows]
    assert sub.sources == [exp.sources[i] for i in rows]
    for name in ("rewards", "valid", "policy_version", "context_mask", "token_version"):
        np.testing.assert_array_equal(getattr(sub, name), getattr(exp, name)[rows], err_msg=name)
    np.testing.assert_array_equal(sub.scores["r"], exp.scores["r"][rows])
    assert sub.metrics == exp.metrics
    assert len(exp) == 6  # the original is untouched (frozen, replaced)


def test_concat_experience_left_pads_prompts_and_cuts_to_max_groups():
    a = make_experience(
        make_rollout([[5], [6]], [[1], [1]], [[7], [8]], [[1], [1]], [[-1.0], [-2.0]]),
        [1.0, 0.0],
        group_size=2,
        policy_version=np.array([3, 3]),
    )
    b = make_experience(
        make_rollout(
            [[4, 5, 6], [0, 5, 6], [4, 4, 4], [4, 4, 4]],
            [[1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]],
            [[9], [10], [11], [12]],
            [[1], [1], [1], [1]],
            [[-3.0], [-4.0], [-5.0], [-6.0]],
        ),
        [0.5, 0.25, 0.0, 1.0],
        group_size=2,
        policy_version=np.array([4, 4, 4, 4]),
    )
    out = concat_experience([a, b], max_groups=2)
    assert len(out) == 4 and out.num_groups == 2
    np.testing.assert_array_equal(
        out.rollout.prompt_tokens, [[0, 0, 5], [0, 0, 6], [4, 5, 6], [0, 5, 6]]
    )
    np.testing.assert_array_equal(
        out.rollout.prompt_mask, [[0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 1]]
    )
    np.testing.assert_array_equal(out.rollout.tokens[:, 0], [7, 8, 9, 10])
    np.testing.assert_allclose(out.rewards, [1.0, 0.0, 0.5, 0.25])
    np.testing.assert_array_equal(out.policy_version, [3, 3, 4, 4])
    assert out.texts == a.texts + b.texts[:2]
    assert out.metrics == a.metrics and out.context_mask is None


# ----- ExperienceBuffer ------------------------------------------------------------------------


def _versioned(*versions):
    exp = random_experience(0, groups=1, group_size=len(versions), p=2, m=2)
    return dataclasses.replace(exp, policy_version=np.array(versions))


def test_buffer_synchronous_put_then_get():
    buf = ExperienceBuffer()
    assert buf.get(0) is None and len(buf) == 0
    exp = _versioned(7, 7)
    buf.put(exp)
    assert len(buf) == 1
    assert buf.get(7) is exp
    assert len(buf) == 0 and buf.dropped == 0


def test_buffer_drops_batches_older_than_max_staleness_and_counts_them():
    buf = ExperienceBuffer(max_staleness=2)
    old, edge, fresh = _versioned(1, 1), _versioned(3, 4), _versioned(5, 5)
    for exp in (old, edge, fresh):
        buf.put(exp)
    # learner at version 5: old is 4 versions behind (dropped); edge's oldest row (3) is 2
    # behind: kept, and handed out first (FIFO)
    assert buf.get(5) is edge
    assert buf.dropped == 1 and len(buf) == 1
    assert buf.get(5) is fresh
    assert buf.get(5) is None and buf.dropped == 1


def test_buffer_staleness_is_the_oldest_rows():
    buf = ExperienceBuffer(max_staleness=1)
    buf.put(_versioned(9, 7))  # one row sampled at 7: two versions behind a learner at 9
    assert buf.get(9) is None
    assert buf.dropped == 1 and len(buf) == 0

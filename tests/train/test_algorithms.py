"""The algorithm strategies (train/online/algorithms.py, advantages.py): advantage estimators
by hand, token step ids, the loss weight, and each family's ``prepare`` on a hand-built
:class:`Experience`, checked against the plan's hand-over layout. Only PPO builds a (tiny)
model: its critic."""

import types

import numpy as np
import pytest

from jaxrl_llm.data.tokenize import CharTokenizer
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import ALGORITHMS, AdvantageEstimator, AlgorithmFamily
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.plan import plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.config.sections import RolloutSection
from jaxrl_llm.train.online.advantages import (
    estimate_advantages,
    invalid_to_zero,
    loss_weight,
    token_step_ids,
)
from jaxrl_llm.train.online.algorithms import (
    STRATEGIES,
    GroupPolicyGradient,
    OnlinePairs,
    PPOStrategy,
    make_strategy,
)
from tests.train.test_experience import make_experience, make_rollout

A = AdvantageEstimator


def config(algorithm, **over):
    base = dict(
        output_dir="/tmp/unused",
        max_steps=1,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        data=dict(train="unused.jsonl"),
        rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=2),
        rewards=[dict(name="math_answer")],
    )
    return from_dict(RunConfig, {**base, **over})


def plan(algorithm, **over):
    return plan_run(config(algorithm, **over), {"data": 1})


def experience(rewards, *, group_size, valid=None, truncated=None):
    """N rows: prompt [_, 5, 6] / [4, 5, 6] alternating, completions of 2 or 1 tokens."""
    n = len(rewards)
    p_mask = np.array([[0, 1, 1], [1, 1, 1]] * (n // 2) + [[1, 1, 1]] * (n % 2))
    c_mask = np.array([[1, 1], [1, 0]] * (n // 2) + [[1, 1]] * (n % 2))
    ro = make_rollout(
        prompt_tokens=p_mask * np.array([4, 5, 6]),
        prompt_mask=p_mask,
        tokens=c_mask * (10 + np.arange(n)[:, None]),
        mask=c_mask,
        logprobs=-0.5 * np.ones((n, 2)),
        truncated=truncated,
    )
    return make_experience(ro, rewards, group_size=group_size, valid=valid)


def no_reference(batch):
    raise AssertionError("the reference was called")


# ----- estimate_advantages ---------------------------------------------------------------------

MASK = np.ones((4, 2), np.int32)
SQRT_HALF = np.sqrt(0.5)


@pytest.mark.parametrize(
    "estimator,rewards,want",
    [
        # group of 2 (1, 0): centred ±0.5, unbiased std √0.5 → ±√0.5; a constant group → 0
        (A.GRPO, [1.0, 0.0, 3.0, 3.0], [SQRT_HALF, -SQRT_HALF, 0.0, 0.0]),
        (A.GRPO_NO_STD, [1.0, 0.0, 3.0, 5.0], [0.5, -0.5, -1.0, 1.0]),
        (A.RLOO, [1.0, 0.0, 3.0, 5.0], [1.0, -1.0, -2.0, 2.0]),
        (A.REWARD, [1.0, 0.0, 3.0, 5.0], [1.0, 0.0, 3.0, 5.0]),
    ],
)
def test_sequence_estimators_by_hand(estimator, rewards, want):
    adv = estimate_advantages(estimator, np.array(rewards), group_size=2, scale="group", mask=MASK)
    assert adv.shape == (4,)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)


def test_grpo_scale_none_is_dr_grpo_and_batch_uses_the_batch_std():
    r = np.array([1.0, 0.0, 3.0, 5.0])
    none = estimate_advantages(A.GRPO, r, group_size=2, scale="none", mask=MASK)
    np.testing.assert_allclose(none, [0.5, -0.5, -1.0, 1.0])
    batch = estimate_advantages(A.GRPO, r, group_size=2, scale="batch", mask=MASK)
    np.testing.assert_allclose(batch, none / np.std(r, ddof=1), rtol=1e-5)


def test_remax_subtracts_the_greedy_reward():
    adv = estimate_advantages(
        A.REMAX,
        np.array([1.0, 0.0]),
        group_size=1,
        scale="group",
        mask=MASK[:2],
        baseline=np.array([0.25, 0.25]),
    )
    np.testing.assert_allclose(adv, [0.75, -0.25])


def test_reinforce_pp_without_groups_whitens_the_return_to_go():
    # reward at the last real token; return-to-go = the reward on every real token:
    # {1, 1, 0}: mean 2/3, unbiased var 1/3 → (1 − 2/3)·√3 and (0 − 2/3)·√3
    mask = np.array([[1, 1], [1, 0]])
    adv = estimate_advantages(
        A.REINFORCE_PP, np.array([1.0, 0.0]), group_size=1, scale="group", mask=mask
    )
    s3 = np.sqrt(3.0)
    np.testing.assert_allclose(adv, [[s3 / 3, s3 / 3], [-2 * s3 / 3, 0.0]], rtol=1e-5)


def test_reinforce_pp_without_groups_rewards_the_last_policy_token_of_a_gappy_mask():
    # row 0: a policy token, two environment tokens, a policy token; same values as the
    # contiguous mask [[1, 1, 0, 0], [1, 1, 0, 0]] on the policy's tokens
    gappy = np.array([[1, 0, 0, 1], [1, 1, 0, 0]])
    adv = estimate_advantages(
        A.REINFORCE_PP, np.array([1.0, 0.0]), group_size=1, scale="group", mask=gappy
    )
    h = np.sqrt(3.0) / 2  # {1, 1, 0, 0}: mean 1/2, unbiased std 1/√3
    np.testing.assert_allclose(adv, [[h, 0, 0, h], [-h, -h, 0, 0]], rtol=1e-5)


def test_reinforce_pp_with_groups_whitens_the_group_centred_reward():
    # groups (1, 0), (2, 2): centred 0.5, −0.5, 0, 0 on every real token of the row
    mask = np.array([[1, 1], [1, 0], [1, 0], [1, 0]])
    adv = estimate_advantages(
        A.REINFORCE_PP, np.array([1.0, 0.0, 2.0, 2.0]), group_size=2, scale="group", mask=mask
    )
    vals = np.array([0.5, 0.5, -0.5, 0.0, 0.0])
    z = (vals - vals.mean()) / vals.std(ddof=1)
    want = np.array([[z[0], z[1]], [z[2], 0.0], [z[3], 0.0], [z[4], 0.0]])
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)


def test_gae_needs_a_critic():
    with pytest.raises(ConfigError, match="algorithm: ppo"):
        estimate_advantages(A.GAE, np.zeros(2), group_size=2, scale="group", mask=MASK[:2])


# ----- small helpers ---------------------------------------------------------------------------


def test_invalid_to_zero_per_sequence_and_per_token():
    valid = np.array([True, False])
    np.testing.assert_array_equal(invalid_to_zero(np.array([2.0, 3.0]), valid), [2.0, 0.0])
    np.testing.assert_array_equal(
        invalid_to_zero(np.array([[1.0, 2.0], [3.0, 4.0]]), valid), [[1.0, 2.0], [0.0, 0.0]]
    )


def test_loss_weight_masks_truncated_rows_only_when_asked():
    exp = experience([1.0, 0.0, 1.0], group_size=1, truncated=[False, True, False])
    np.testing.assert_array_equal(loss_weight(RolloutSection(), exp), [1, 1, 1])
    dapo = RolloutSection(mask_truncated=True)
    w = loss_weight(dapo, exp)
    np.testing.assert_array_equal(w, [1, 0, 1])
    assert w.dtype == np.int32


def test_token_step_ids_by_hand():
    tok = CharTokenizer()
    texts = ["ab\ncd", "ab\n\n", "x"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    m = 6
    tokens = np.zeros((3, m), np.int32)
    for i, row in enumerate(ids):
        tokens[i, : len(row)] = row
    tokens[0, 5] = tok.eos_token_id  # a special token after the text
    lengths = np.array([6, 4, 1])
    out, spans = token_step_ids(tok, tokens, lengths, texts, r"\n+")
    # row 0: steps "ab" [0, 2) and "cd" [3, 5); the newline joins the step after it; EOS
    # (no characters) lies after the last step; padding is −1
    np.testing.assert_array_equal(out[0], [0, 0, 1, 1, 1, -1])
    # row 1: one step; the trailing newlines come after it
    np.testing.assert_array_equal(out[1], [0, 0, -1, -1, -1, -1])
    np.testing.assert_array_equal(out[2], [0, -1, -1, -1, -1, -1])
    assert spans[0] == [("ab", 0, 2), ("cd", 3, 5)] and spans[1] == [("ab", 0, 2)]


# ----- the strategies --------------------------------------------------------------------------


def test_strategy_table_covers_every_online_family():
    online = {a.family for a in ALGORITHMS.values() if a.online}
    assert set(STRATEGIES) == online
    assert STRATEGIES[AlgorithmFamily.GROUP_POLICY_GRADIENT] is GroupPolicyGradient
    assert STRATEGIES[AlgorithmFamily.PPO] is PPOStrategy
    assert STRATEGIES[AlgorithmFamily.ONLINE_PAIRS] is OnlinePairs


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "online_dpo"])
def test_make_strategy_builds_the_familys_strategy(algorithm):
    p = plan(algorithm)
    s = make_strategy(p, None, None, log=lambda line: None)
    assert isinstance(s, STRATEGIES[p.algo.family])
    assert s.companions() == ()


def test_group_policy_gradient_prepare_by_hand():
    p = plan("grpo", loss=dict(kl_coef=0.0))
    exp = experience([1.0, 0.0, 3.0, 3.0], group_size=2)
    out = GroupPolicyGradient(p, None, None).prepare(exp, None)
    np.testing.assert_allclose(out.advantages, [SQRT_HALF, -SQRT_HALF, 0, 0], atol=1e-6)
    p.handover_layout.check(out.batch, where="GroupPolicyGradient.prepare")
    b = out.batch
    np.testing.assert_array_equal(b["loss_mask"][:, 3:], exp.rollout.mask)
    np.testing.assert_allclose(b["advantages"][0], [0, 0, 0, SQRT_HALF, SQRT_HALF], atol=1e-6)
    np.testing.assert_allclose(b["advantages"][1], [0, 0, 0, -SQRT_HALF, 0], atol=1e-6)
    assert not b["advantages"][2:].any() and out.metrics == {}


def test_group_policy_gradient_zeroes_invalid_rows_and_masks_truncated_ones():
    p = plan(
        "dapo",
        rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=2, mask_truncated=True),
    )
    exp = experience(
        [1.0, 0.0, 2.0, 0.0],
        group_size=2,
        valid=[True, True, True, False],
        truncated=[False, True, False, False],
    )
    out = GroupPolicyGradient(p, None, None).prepare(exp, no_reference)
    assert out.advantages[3] == 0.0  # the failed reward's row
    assert out.batch["loss_mask"][1].sum() == 0  # the truncated row (DAPO)
    assert out.batch["loss_mask"][[0, 2, 3]].sum() == exp.rollout.mask[[0, 2, 3]].sum()


def test_group_policy_gradient_adds_the_reference_when_the_loss_reads_it():
    p = plan("grpo", loss=dict(kl_coef=0.1))
    assert p.needs.reference_in_loss
    exp = experience([1.0, 0.0, 3.0, 3.0], group_size=2)
    seen = []

    def reference(batch):
        seen.append(sorted(batch))
        return {"ref_logp": np.full(batch["input_ids"].shape, -0.75, np.float32)}

    out = GroupPolicyGradient(p, None, None).prepare(exp, reference)
    # one reference forward, over the rl batch before its own entry is added
    assert seen == [sorted(p.input_layout.names)]
    np.testing.assert_allclose(out.batch["ref_logp"], -0.75)
    p.handover_layout.check(out.batch, where="GroupPolicyGradient.prepare")


def test_remax_asks_the_rollouts_for_the_greedy_baseline():
    p = plan("remax", rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=2))
    exp = experience([1.0, 0.0, 3.0, 5.0], group_size=2)
    rollouts = types.SimpleNamespace(greedy_rewards=lambda e: np.repeat([0.5, 4.0], 2))
    out = GroupPolicyGradient(p, None, rollouts).prepare(
        exp, lambda b: {"ref_logp": 0 * b["old_logp"]}
    )
    np.testing.assert_allclose(out.advantages, [0.5, -0.5, -1.0, 1.0])


def step_scorer(prompt, steps, **fields):
    """Process-reward scorer for the test below: a step scores its length."""
    return [float(len(s)) for s in steps]


def test_process_supervision_gives_per_token_advantages():
    p = plan(
        "grpo",
        loss=dict(kl_coef=0.0),
        process_reward=dict(name="tests.train.test_algorithms:step_scorer"),
    )
    tok = CharTokenizer()
    texts = ["a\nbbb", "cc"]
    tokens = np.zeros((2, 5), np.int32)
    for i, t in enumerate(texts):
        tokens[i, : len(t)] = tok.encode(t, add_special_tokens=False)
    mask = (tokens > 0).astype(np.int32)
    ro = make_rollout([[1], [1]], [[1], [1]], tokens, mask, -np.ones((2, 5)))
    exp = make_experience(ro, [1.0, 0.0], group_size=2, texts=texts)
    policy = types.SimpleNamespace(tokenizer=tok)
    outcome = types.SimpleNamespace(fn=None)  # unused: the scorer is an imported function
    rollouts = types.SimpleNamespace(rewards=types.SimpleNamespace(specs=[outcome]))
    out = GroupPolicyGradient(p, policy, rollouts).prepare(exp, None)
    # step scores {1, 3} and {2}: mean 2, unbiased std 1 → normalised −1, +1 and 0; a token's
    # advantage sums its step's and every later step's: "a" → −1 + 1 = 0; the newline joins
    # the step after it: "\nbbb" → 1; row 1's one step → 0 (padding 0 too)
    want = np.array([[0.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(out.advantages, want, atol=1e-5)
    assert out.metrics == {"process/steps_mean": 1.5, "process/failed": 0}


# ----- online pairs ----------------------------------------------------------------------------


def pairs_experience():
    """Three groups of 3: (0.2, 0.9, 0.5); (1, 1, 1), all equal; (x, 1, 0) with x failed."""
    n, g = 9, 3
    p_tok = np.arange(n)[:, None] * 10 + np.array([1, 2])
    ro = make_rollout(
        prompt_tokens=p_tok,
        prompt_mask=np.ones((n, 2)),
        tokens=np.arange(n)[:, None] * 10 + np.array([5, 6, 7]),
        mask=np.array([[1, 1, 0]] * n),
        logprobs=-np.ones((n, 3)),
    )
    rewards = [0.2, 0.9, 0.5, 1.0, 1.0, 1.0, 7.0, 1.0, 0.0]
    valid = [True] * 6 + [False, True, True]
    return make_experience(ro, rewards, group_size=g, valid=valid)


def test_online_pairs_picks_best_and_worst_and_masks_groups_without_a_pair():
    p = plan("online_dpo", rollout=dict(prompts_per_step=3, group_size=3, max_new_tokens=3))
    exp = pairs_experience()

    def reference(batch):
        k = len(batch["chosen_input_ids"])
        return {
            "ref_chosen_logps": -np.ones(k, np.float32),
            "ref_rejected_logps": np.full(k, -2.0, np.float32),
        }

    out = OnlinePairs(p, None, None).prepare(exp, reference)
    b = out.batch
    p.handover_layout.check(b, where="OnlinePairs.prepare")
    # group 0: best row 1 (0.9), worst row 0 (0.2); group 2: row 6 failed, best 7, worst 8
    np.testing.assert_array_equal(b["chosen_input_ids"][:, 0] // 10, [1, 3, 7])
    np.testing.assert_array_equal(b["rejected_input_ids"][[0, 2], 0] // 10, [0, 8])
    np.testing.assert_array_equal(b["chosen_input_ids"][0], [11, 12, 15, 16, 17])
    np.testing.assert_array_equal(b["chosen_attention_mask"][0], [1, 1, 1, 1, 0])
    for side in ("chosen", "rejected"):
        lm = b[f"{side}_loss_mask"]
        np.testing.assert_array_equal(lm[0], [0, 0, 1, 1, 0])  # the completion only
        assert not lm[1].any()  # all-equal group: no pair
        assert lm[2].sum() == 2
    assert out.metrics == {"dpo/pairs": 2} and out.advantages is None
    np.testing.assert_array_equal(b["ref_rejected_logps"], [-2, -2, -2])


def test_online_pairs_a_group_with_one_valid_sample_has_no_pair():
    p = plan(
        "online_dpo",
        loss=dict(beta=0.1),
        rollout=dict(prompts_per_step=1, group_size=3, max_new_tokens=3),
    )
    exp = make_experience(
        make_rollout(
            [[1, 2]] * 3, [[1, 1]] * 3, [[5, 6, 7]] * 3, [[1, 1, 1]] * 3, -np.ones((3, 3))
        ),
        [1.0, 5.0, 0.0],
        group_size=3,
        valid=[False, True, False],
    )
    out = OnlinePairs(p, None, None).prepare(exp, lambda b: {})
    assert out.metrics == {"dpo/pairs": 0}
    assert not out.batch["chosen_loss_mask"].any() and not out.batch["rejected_loss_mask"].any()


# ----- PPO (a tiny policy and its critic) ------------------------------------------------------


@pytest.fixture(scope="module")
def ppo():
    from jaxrl_llm.train.programs.policy import build_policy

    cfg = config(
        "ppo",
        rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=2),
        ppo=dict(whiten_advantages=False, kl_coef=0.5, lam=0.5),
    )
    p = plan_run(cfg, {"data": 1})
    return p, PPOStrategy(p, build_policy(cfg, plan=p), None)


def test_ppo_prepare_gae_by_hand(ppo):
    p, strategy = ppo
    exp = experience([1.0, 0.0, 2.0, 4.0], group_size=2, valid=[True, True, True, False])

    def reference(batch):  # log π_ref = log π − 0.2 on every completion token: k1 KL 0.2
        return {"ref_logp": batch["old_logp"] - 0.2 * batch["loss_mask"]}

    out = strategy.prepare(exp, reference)
    b = out.batch
    p.handover_layout.check(b, where="PPOStrategy.prepare")
    # the critic's head starts at zero: V = 0, so δ_t = r_t and A_t = Σ_k λ^k r_{t+k}, with
    # r_t = −β·KL = −0.1 per token and the score added at the last token
    assert not b["values"].any()
    a_two = lambda s: [-0.1 + 0.5 * (s - 0.1), s - 0.1]  # noqa: E731
    want = np.array(
        [
            [0, 0, 0, *a_two(1.0)],
            [0, 0, 0, 0.0 - 0.1, 0],
            [0, 0, 0, *a_two(2.0)],
            [0, 0, 0, 0, 0],  # the failed reward: left out of the update (issue 43)
        ]
    )
    np.testing.assert_allclose(b["advantages"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b["returns"], want, rtol=1e-5, atol=1e-6)  # returns = A + V
    np.testing.assert_array_equal(b["loss_mask"][3], 0)
    np.testing.assert_allclose(out.advantages, want[:, -2:], rtol=1e-5, atol=1e-6)
    assert out.metrics["kl_to_ref"] == pytest.approx(0.2, rel=1e-5)
    assert out.metrics["vf/value_mean"] == 0.0


def test_ppo_companion_is_the_critic(ppo):
    _, strategy = ppo
    (companion,) = strategy.companions()
    assert companion.name == "critic_checkpoints" and companion.policy is strategy.critic
    assert companion.policy.config.num_labels == 1


def test_ppo_critic_update_reads_the_critic_entries_and_steps_the_critic(ppo):
    _, strategy = ppo
    # 8 rows: the critic's step shards its rows over the suite's 8 CPU devices
    exp = experience([1.0, 0.0, 2.0, 0.0, 1.0, 1.0, 0.5, 0.0], group_size=2)
    out = strategy.prepare(exp, lambda b: {"ref_logp": b["old_logp"]})
    before = int(strategy.critic.state.step)
    (companion,) = strategy.companions()
    metrics = companion.update(out.batch)  # the whole hand-over: the actor's keys left out
    assert int(strategy.critic.state.step) == before + 1
    assert metrics and all(k.startswith("critic/") for k in metrics)
    assert np.isfinite(float(metrics["critic/loss"]))
    # the returns are nonzero and V = 0: the value loss is positive
    assert float(metrics["critic/loss"]) > 0

"""The learner side of the online loop (train/online/learner.py): the minibatch order, the skippable
micro-batch layout, the step's metrics over updates, and :class:`Learner.update` driving a
fake step function (no model compiles), plus :func:`context_padded`."""

import types

import numpy as np
import pytest

from jaxrl_llm.train.config.plan import PackSpec, Rows
from jaxrl_llm.train.online.learner import (
    Learner,
    context_padded,
    mean_metrics,
    minibatch_order,
    skippable_layout,
)
from jaxrl_llm.train.programs.step import split_micro_batches


def rows(*, n=8, minibatches=1, epochs=1, micro_batches=1, group=2, group_minibatches=True):
    return Rows(
        per_step=n,
        per_update=n // minibatches,
        minibatches=minibatches,
        epochs=epochs,
        micro_batches=micro_batches,
        forward=n,
        group=group,
        group_minibatches=group_minibatches,
        shards=1,
    )


def rl_rows(n=8, t=5, *, adv=None, seed=0):
    """An ``rl`` batch of n rows of T tokens; ``row`` holds each row's index, so that a test
    can see which rows a step received and in which order."""
    rs = np.random.RandomState(seed)
    lm = np.zeros((n, t), np.int32)
    lm[:, 2:] = 1
    a = rs.randn(n).astype(np.float32) if adv is None else np.asarray(adv, np.float32)
    return {
        "input_ids": rs.randint(3, 50, (n, t)).astype(np.int32),
        "attention_mask": np.ones((n, t), np.int32),
        "loss_mask": lm,
        "old_logp": -rs.rand(n, t).astype(np.float32) * lm,
        "advantages": a[:, None] * lm,
        "row": np.repeat(np.arange(n)[:, None], t, 1).astype(np.int32),
    }


class FakeStep:
    """A step function that records the batches it gets and threads the state (a counter)."""

    def __init__(self, metrics=None):
        self.batches, self.states, self.hparams = [], [], []
        self.metrics = metrics or (lambda i, batch: {"loss": float(i), "nonfinite": 0.0})

    def __call__(self, state, batch, frozen, *hparams):
        assert frozen == {"frozen": True}
        self.states.append(state)
        self.hparams.append(hparams)
        self.batches.append(batch)
        return state + 1, self.metrics(len(self.batches) - 1, batch)


def policy(context=1, pad_token_id=None, data=1):
    mesh = types.SimpleNamespace(shape={"data": data, "fsdp": 1, "context": context})
    config = types.SimpleNamespace(pad_token_id=pad_token_id)
    return types.SimpleNamespace(state=0, mesh=mesh, config=config)


def row_ids(batch):
    return batch["row"][:, 0].tolist()


# ----- minibatch_order -------------------------------------------------------------------------


def test_minibatch_order_is_the_identity_for_one_minibatch():
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(minibatch_order(rng, 6, 1, 3), np.arange(6))


def test_minibatch_order_permutes_rows_without_groups():
    order = minibatch_order(np.random.default_rng(0), 12, 3, 1)
    assert sorted(order.tolist()) == list(range(12))
    assert order.tolist() != list(range(12))  # a real shuffle at this seed


@pytest.mark.parametrize("seed", range(5))
def test_minibatch_order_keeps_groups_whole(seed):
    n, group, minibatches = 12, 3, 2
    order = minibatch_order(np.random.default_rng(seed), n, minibatches, group)
    assert sorted(order.tolist()) == list(range(n))
    chunks = order.reshape(-1, group)
    # each chunk of G is one group, its rows consecutive and in order
    np.testing.assert_array_equal(chunks - chunks[:, :1], np.tile(np.arange(group), (4, 1)))
    assert (chunks[:, 0] % group == 0).all()


def test_minibatch_order_is_a_function_of_the_generator():
    a = minibatch_order(np.random.default_rng(7), 16, 4, 2)
    b = minibatch_order(np.random.default_rng(7), 16, 4, 2)
    np.testing.assert_array_equal(a, b)


# ----- skippable_layout ------------------------------------------------------------------------


def test_skippable_layout_hand_computed():
    # 4 groups of 2 rows, 2 micro-batches; groups 1 and 3 informative. Group 0's advantage
    # sits where the loss mask is 0, so it is not informative.
    adv = np.array([[5, 0], [5, 0], [0, 0], [1, 1], [0, 0], [0, 0], [0, 2], [0, 0]], np.float32)
    mask = np.array([[0, 1]] * 8, np.int32)
    batch = {"advantages": adv, "loss_mask": mask, "row": np.arange(8)}
    out = skippable_layout(batch, 2, 2)
    # micro-batch m holds rows m, m + 2, ...: [2, 3, 6, 7] then [0, 1, 4, 5]
    np.testing.assert_array_equal(out["row"], [2, 0, 3, 1, 6, 4, 7, 5])
    stacked, _ = split_micro_batches(out, 2)
    np.testing.assert_array_equal(stacked["row"][0], [2, 3, 6, 7])
    np.testing.assert_array_equal(stacked["row"][1], [0, 1, 4, 5])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("group,micro", [(2, 2), (2, 4), (3, 2), (1, 3)])
def test_skippable_layout_is_a_permutation_of_whole_informative_first_groups(seed, group, micro):
    rs = np.random.RandomState(seed)
    n_groups = 12
    n = n_groups * group
    informative = rs.rand(n_groups) < 0.5
    adv = np.where(np.repeat(informative, group), rs.randn(n) + 3.0, 0.0)[:, None] * np.ones(4)
    batch = {"advantages": adv, "loss_mask": np.ones((n, 4), np.int32), "row": np.arange(n)}
    out = skippable_layout(batch, group, micro)
    assert sorted(out["row"].tolist()) == list(range(n))  # a permutation of rows
    np.testing.assert_array_equal(out["advantages"], adv[out["row"]])  # every key moved alike
    stacked, _ = split_micro_batches(out, micro)
    per_micro = stacked["row"]  # [M, n / M]
    groups_of = []
    for rows_m in per_micro:
        chunks = rows_m.reshape(-1, group)
        assert (chunks // group == chunks[:, :1] // group).all()  # whole groups only
        groups_of.append(chunks[:, 0] // group)
    # informative groups come first: in micro-batch order, then within each micro-batch
    flat = np.concatenate(groups_of)
    flags = informative[flat]
    assert (np.diff(flags.astype(int)) <= 0).all(), flags
    # stable: the groups keep their order within each class
    assert (np.diff(flat[flags]) > 0).all() and (np.diff(flat[~flags]) > 0).all()


# ----- mean_metrics ----------------------------------------------------------------------------


def test_mean_metrics_weights_the_loss_metrics_by_the_micro_batches_that_ran():
    per_update = [
        {
            "loss": 0.3,
            "vf/loss": 1.0,
            "grad_norm": 2.0,
            "entropy": 3.0,
            "computed_micro_batches": 2,
        },
        {
            "loss": 0.1,
            "vf/loss": 3.0,
            "grad_norm": 4.0,
            "entropy": 6.0,
            "computed_micro_batches": 1,
        },
        {
            "loss": 0.2,
            "vf/loss": 2.0,
            "grad_norm": 0.0,
            "entropy": 0.0,
            "computed_micro_batches": 0,
        },
    ]
    out = mean_metrics(per_update)
    assert out["entropy"] == pytest.approx((3.0 * 2 + 6.0 * 1) / 3)  # weighted, skipped out
    # step metrics and loss shares: plain means over the updates
    assert out["loss"] == pytest.approx(0.2)
    assert out["vf/loss"] == pytest.approx(2.0)
    assert out["grad_norm"] == pytest.approx(2.0)
    assert out["computed_micro_batches"] == pytest.approx(1.0)


def test_mean_metrics_without_micro_batch_counts_is_the_plain_mean():
    out = mean_metrics([{"loss": 1.0, "kl": 2.0}, {"loss": 3.0, "kl": 5.0}])
    assert out == {"loss": 2.0, "kl": 3.5}


def test_mean_metrics_leaves_out_loss_metrics_when_nothing_ran():
    out = mean_metrics([{"loss": 0.0, "entropy": 0.0, "computed_micro_batches": 0.0}] * 2)
    assert out == {"loss": 0.0, "computed_micro_batches": 0.0}


# ----- Learner.update --------------------------------------------------------------------------


def test_update_runs_epochs_times_minibatches_steps_over_whole_groups():
    batch = rl_rows(8)
    batch["values"] = np.zeros((8, 5), np.float32)
    step, seen = FakeStep(), []

    def companion(sub):
        seen.append(sub)
        return {"critic/loss": float(len(seen))}

    learner = Learner(
        step,
        rows(n=8, minibatches=2, epochs=3, group=2),
        seed=1,
        companions=(companion,),
        actor_drop=("values",),
    )
    p = policy()
    out = learner.update(p, batch, step=4, frozen={"frozen": True})
    assert len(step.batches) == 6 and len(seen) == 6  # 3 epochs × 2 minibatches
    assert step.states == list(range(6)) and p.state == 6  # the state is threaded through
    for i in range(3):  # each epoch's minibatches cover every row once, in whole groups
        ids = row_ids(step.batches[2 * i]) + row_ids(step.batches[2 * i + 1])
        assert sorted(ids) == list(range(8))
        for b in step.batches[2 * i : 2 * i + 2]:
            pairs = np.reshape(row_ids(b), (-1, 2))
            assert (pairs[:, 0] % 2 == 0).all() and (pairs[:, 1] == pairs[:, 0] + 1).all()
    for b, sub in zip(step.batches, seen, strict=True):
        assert "values" not in b and "values" in sub  # dropped for the actor only
        assert row_ids(b) == row_ids(sub)  # the companion sees the same minibatch
        np.testing.assert_array_equal(b["advantages"], batch["advantages"][row_ids(b)])
    assert step.hparams == [()] * 6  # no hparams: the three-argument call
    assert out["loss"] == pytest.approx(np.mean(range(6)))
    assert out["critic/loss"] == pytest.approx(np.mean(range(1, 7)))
    assert out["nonfinite"] == 0.0 and "update/computed_frac" not in out


def test_update_permutations_are_functions_of_seed_and_step():
    def orders(seed, step_no):
        step = FakeStep()
        Learner(step, rows(n=8, minibatches=4, group=2), seed=seed).update(
            policy(), rl_rows(8), step_no, frozen={"frozen": True}
        )
        return [row_ids(b) for b in step.batches]

    assert orders(0, 3) == orders(0, 3)
    assert orders(0, 3) != orders(0, 4) or orders(0, 3) != orders(1, 3)


def test_update_passes_hparams_and_reports_the_worst_nonfinite():
    step = FakeStep(metrics=lambda i, b: {"loss": 1.0, "nonfinite": float(i == 1)})
    learner = Learner(step, rows(n=4, minibatches=2, group=2), seed=0)
    out = learner.update(policy(), rl_rows(4), 1, frozen={"frozen": True}, hparams={"kl": 0.5})
    assert step.hparams == [({"kl": 0.5},)] * 2
    assert out["nonfinite"] == 1.0  # the max, not the mean (0.5)


def test_update_lays_micro_batches_out_for_skipping_and_reports_computed_frac():
    # 4 groups of 2; only group 2 informative. M = 2 micro-batches of 2 groups.
    adv = [0, 0, 0, 0, 1, -1, 0, 0]

    def metrics(i, batch):
        stacked, _ = split_micro_batches(batch, 2)
        ran = sum(bool(np.any(mb != 0)) for mb in stacked["advantages"])
        return {"loss": 0.5, "entropy": 2.0, "nonfinite": 0.0, "computed_micro_batches": ran}

    step = FakeStep(metrics)
    learner = Learner(step, rows(n=8, micro_batches=2, group=2), seed=0)
    out = learner.update(policy(), rl_rows(8, adv=adv), 0, frozen={"frozen": True})
    (b,) = step.batches
    stacked, _ = split_micro_batches(b, 2)
    # micro-batch 0: the informative group 2, then group 0 (stable); micro-batch 1 skippable
    np.testing.assert_array_equal(stacked["row"][0][:, 0], [4, 5, 0, 1])
    assert out["update/computed_frac"] == pytest.approx(0.5)
    assert "computed_micro_batches" not in out and out["entropy"] == 2.0


def test_update_metrics_weight_the_micro_batches_that_ran_over_minibatches_and_epochs():
    # 4 groups of 2, groups 0 and 1 informative; 2 minibatches × 2 epochs, M = 2 each
    adv = [1, -1, 2, -2, 0, 0, 0, 0]

    def ran_in(batch):
        stacked, _ = split_micro_batches(batch, 2)
        return sum(bool(np.any(mb != 0)) for mb in stacked["advantages"])

    def metrics(i, batch):
        ran = ran_in(batch)
        entropy = 1.0 + i if ran else 0.0  # a skipped update reports a placeholder 0
        return {
            "loss": float(ran),
            "entropy": entropy,
            "nonfinite": 0.0,
            "computed_micro_batches": ran,
        }

    step = FakeStep(metrics)
    learner = Learner(step, rows(n=8, minibatches=2, epochs=2, micro_batches=2), seed=3)
    out = learner.update(policy(), rl_rows(8, adv=adv), 5, frozen={"frozen": True})
    assert len(step.batches) == 4
    ran = np.array([ran_in(b) for b in step.batches], float)
    assert ran.sum() >= 2  # every epoch runs the informative groups
    entropy = np.array([1.0 + i if r else 0.0 for i, r in enumerate(ran)])
    assert out["entropy"] == pytest.approx((entropy * ran).sum() / ran.sum())
    assert out["loss"] == pytest.approx(ran.mean())  # a step metric: the plain mean
    assert out["update/computed_frac"] == pytest.approx(ran.mean() / 2)


def test_update_left_pads_tokens_to_the_context_axis():
    batch = rl_rows(4, t=5)
    step = FakeStep()
    Learner(step, rows(n=4, group=2), seed=0).update(
        policy(context=4, pad_token_id=9), batch, 0, frozen={"frozen": True}
    )
    (b,) = step.batches
    assert b["input_ids"].shape == (4, 8)
    assert (b["input_ids"][:, :3] == 9).all() and not b["attention_mask"][:, :3].any()
    assert not b["loss_mask"][:, :3].any() and not b["advantages"][:, :3].any()
    np.testing.assert_array_equal(b["input_ids"][:, 3:], batch["input_ids"][b["row"][:, -1]])


def test_update_packs_rows_before_the_step():
    batch = rl_rows(4, t=5)
    step = FakeStep()
    out = Learner(step, rows(n=4, group=2), seed=0, pack=PackSpec(window=3)).update(
        policy(), batch, 0, frozen={"frozen": True}
    )
    (b,) = step.batches
    assert {"segment_ids", "positions", "unpack_index"} <= set(b)
    assert b["loss_mask"].shape == (4, 3)  # per-token entries cut to the completion window
    assert 0.0 < out["pack/fill"] <= 1.0


# ----- context_padded --------------------------------------------------------------------------


def test_context_padded_is_a_no_op_without_context_parallelism():
    batch = rl_rows(2)
    got = []
    out = context_padded(lambda b: got.append(b) or {"x": 1}, batch, policy(context=1))
    assert got == [batch] and got[0] is batch and out == {"x": 1}


def test_context_padded_pads_left_and_crops_back():
    batch = rl_rows(2, t=5)

    def fn(b):
        assert b["input_ids"].shape == (2, 8) and (b["input_ids"][:, :3] == 7).all()
        return {
            "per_token": np.arange(16).reshape(2, 8),
            "per_row": np.array([1.0, 2.0]),
            "other_width": np.zeros((2, 3)),
        }

    out = context_padded(fn, batch, policy(context=4, pad_token_id=7))
    np.testing.assert_array_equal(out["per_token"], [[3, 4, 5, 6, 7], [11, 12, 13, 14, 15]])
    np.testing.assert_array_equal(out["per_row"], [1.0, 2.0])
    assert out["other_width"].shape == (2, 3)


def test_context_padded_passes_per_pair_results_unchanged():
    pairs = {
        f"{side}_{k}": np.ones((2, 5), np.int32)
        for side in ("chosen", "rejected")
        for k in ("input_ids", "attention_mask", "loss_mask")
    }

    def fn(b):
        assert b["chosen_input_ids"].shape == (2, 8)  # padded for the ring
        return {"ref_chosen_logps": np.array([-1.0, -2.0]), "wide": np.zeros((2, 8))}

    out = context_padded(fn, pairs, policy(context=4))
    np.testing.assert_array_equal(out["ref_chosen_logps"], [-1.0, -2.0])
    assert out["wide"].shape == (2, 8)

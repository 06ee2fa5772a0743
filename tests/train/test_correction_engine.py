"""``rollout.correction`` end to end against the paged engine (issue 19): a tiny online GRPO run
samples with ``rollout.engine: paged``; the corrector's batch and logged metrics are recomputed
here by hand from the sampler's log-probs (the batch's ``old_logp`` before the correction) and
the learner's (a plain full-vocabulary forward of the pre-update weights).

In ``rollout.dtype: bfloat16`` the engine's weights and KV cache are bfloat16 while the learner
is float32: the weights must show that mismatch (k3 KL > 0, weights away from 1, truncated /
masked where the bounds say). In ``float32`` the two are the same policy up to the engine's
float32 rounding, and the weights are 1 to within 1e-5.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.correction import recompute_rows
from jaxrl_llm.train.online.trainer import OnlineTrainer


def parity_reward(prompts, completions, **_):
    """1 when the completion starts with an even code point, else 0: random completions score
    in about half the rows of a group, so most groups carry an advantage (and are recomputed)."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    d = tmp_path_factory.mktemp("prompts")
    rows = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return d / "train.jsonl"


def _config(prompts, out, *, dtype, correction, steps=1):
    return from_dict(
        RunConfig,
        dict(
            output_dir=str(out),
            max_steps=steps,
            algorithm="grpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char"),
            optim=dict(name="sgd", lr=1e-2),
            data=dict(train=str(prompts), max_length=32),
            loss=dict(kl_coef=0.0),
            rollout=dict(
                prompts_per_step=4,
                group_size=4,
                max_new_tokens=8,
                engine="paged",
                dtype=dtype,
                correction=correction,
            ),
            rewards=[dict(name="tests.train.test_correction_engine:parity_reward")],
            logging=dict(tensorboard=False, plots=False),
            eval=dict(before=False),
        ),
    )


class _Spy:
    """Wraps the trainer's corrector: keeps the batch it got, the batch and metrics it
    returned, and the (pre-update) parameters it ran with."""

    def __init__(self, corrector):
        self.inner, self.calls = corrector, []

    def __call__(self, batch):
        params = jax.device_get(self.inner.policy.state.params)
        out, metrics = self.inner(batch)
        self.calls.append((batch, out, metrics, params))
        return out, metrics


def _run(prompts, out, *, dtype, steps=1, **correction):
    """Train ``steps`` steps; returns (the corrector's first call, every step's metrics,
    the trainer's model config)."""
    trainer = OnlineTrainer(
        _config(prompts, out, dtype=dtype, correction=correction, steps=steps),
        log_stream=open(os.devnull, "w"),
    )
    try:
        spy = trainer.corrector = _Spy(trainer.corrector)
        metrics = [trainer.train_step(s) for s in range(1, steps + 1)]
        return spy.calls[0], metrics, trainer.policy.config
    finally:
        trainer.close()


@functools.partial(jax.jit, static_argnames="config")
def _logits(params, ids, attn, *, config):
    return models.forward(params, ids, config=config, attention_mask=attn)[0]


def _by_hand(call, config):
    """(rows, mask, sampler log-probs, learner log-probs) of the corrector's first batch:
    the learner's from a full-vocabulary log-softmax of the pre-update float32 forward (not
    the chunked path the trainer uses)."""
    batch, _, _, params = call
    mask = np.asarray(batch["loss_mask"]) > 0
    rows = recompute_rows(batch["advantages"], batch["loss_mask"], group_size=4)
    ids = jnp.asarray(batch["input_ids"])
    logits = _logits(params, ids, jnp.asarray(batch["attention_mask"]), config=config)
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    tok = jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]
    learner = np.pad(np.asarray(tok), ((0, 0), (1, 0))) * mask
    sampler = np.asarray(batch["old_logp"], np.float64)
    return rows, mask[rows], sampler[rows], learner[rows].astype(np.float64)


def _k3(d, mask):
    return float(np.mean((np.expm1(d) - d)[mask]))


# Measured on this run (seed 0, 8 recomputed rows x 8 tokens): bfloat16 sampler, learner /
# sampler ratios in [0.99865, 1.00129], k3 KL 1.65e-7; float32 sampler, |ratio - 1| <= 4.8e-7,
# k3 KL 3.7e-14. The bounds below sit inside the bfloat16 spread.
CAP = 1.0005
BAND = (0.9995, 1.0005)


@pytest.mark.slow
def test_truncated_importance_weights_show_the_bfloat16_sampler(prompts, tmp_path):
    call, steps, config = _run(prompts, tmp_path / "tis", dtype="bfloat16", steps=2, high=CAP)
    _, out, m, _ = call
    rows, mask, sampler, learner = _by_hand(call, config)
    assert m["correction/rows_frac"] == len(rows) / len(out["loss_mask"]) >= 0.5
    # the learner's recompute is the update's old_logp: equal to the hand forward
    np.testing.assert_allclose(np.asarray(out["old_logp"])[rows], learner, atol=2e-6)
    d = learner - sampler
    ratio = np.exp(d)
    want = np.where(mask, np.minimum(ratio, CAP), 0.0)
    np.testing.assert_allclose(np.asarray(out["is_weights"])[rows], want, rtol=0, atol=2e-6)
    # the real mismatch of a bfloat16 sampler: a positive k3 KL, weights away from 1, and some
    # ratios above the cap (truncated), others below it (kept)
    kl = _k3(d, mask)
    assert kl > 1e-8 and m["correction/mismatch_kl"] == pytest.approx(kl, rel=1e-2)
    assert np.max(np.abs(ratio - 1)[mask]) > 5e-4
    above = float(np.mean((ratio > CAP)[mask]))
    assert 0 < above < 1
    assert m["correction/outside_frac"] == pytest.approx(above, abs=1.5 / mask.sum())
    assert m["correction/weight_mean"] == pytest.approx(np.mean(want[mask]), abs=1e-6)
    assert m["correction/ratio_max"] == pytest.approx(np.max(ratio[mask]), abs=2e-6)
    assert m["correction/weight_max"] == pytest.approx(CAP, abs=1e-7)
    # logged every step, with the recompute's wall time inside the step's
    for logged in steps:
        for k in ("weight_mean", "weight_max", "ratio_max", "outside_frac", "mismatch_kl"):
            assert np.isfinite(logged[f"correction/{k}"]), k
        assert 0 < logged["time/recompute_s"] < logged["time/step_s"]
    assert steps[0]["correction/mismatch_kl"] == m["correction/mismatch_kl"]


@pytest.mark.slow
def test_masked_importance_weights_zero_the_tokens_outside_the_bounds(prompts, tmp_path):
    low, high = BAND
    call, _, config = _run(
        prompts, tmp_path / "mis", dtype="bfloat16", mode="mask", low=low, high=high
    )
    _, out, m, _ = call
    rows, mask, sampler, learner = _by_hand(call, config)
    ratio = np.exp(learner - sampler)
    outside = ((ratio < low) | (ratio > high)) & mask
    w = np.asarray(out["is_weights"])[rows]
    # masked tokens: weight exactly 0 but still in the loss mask (the denominator); kept
    # tokens: the ratio itself. A token within the two forwards' rounding of a bound is not
    # checked.
    near = (np.abs(ratio - low) < 2e-6) | (np.abs(ratio - high) < 2e-6)
    assert 0 < outside.sum() < mask.sum()
    assert np.all(w[outside & ~near] == 0) and np.all(np.asarray(out["loss_mask"])[rows][outside])
    keep = mask & ~outside & ~near
    np.testing.assert_allclose(w[keep], ratio[keep], rtol=0, atol=2e-6)
    frac = float(np.mean(outside[mask]))
    assert m["correction/outside_frac"] == pytest.approx(frac, abs=1.5 / mask.sum())
    assert m["correction/weight_mean"] < float(np.mean(ratio[mask]))


@pytest.mark.slow
def test_a_float32_sampler_gives_weights_of_one(prompts, tmp_path):
    call, _, config = _run(prompts, tmp_path / "f32", dtype="float32", high=2.0)
    _, out, m, _ = call
    rows, mask, sampler, learner = _by_hand(call, config)
    w = np.asarray(out["is_weights"])[rows]
    assert np.max(np.abs(w - 1)[mask]) < 1e-5
    assert abs(m["correction/weight_mean"] - 1) < 1e-6 and m["correction/mismatch_kl"] < 1e-10
    assert _k3(learner - sampler, mask) < 1e-10

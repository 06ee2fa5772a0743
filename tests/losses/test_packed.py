"""Packed == padded (issue 22 §4): the losses and gradients of a GRPO-family step over a
rollout batch packed by ``pack_rl_batch``, and of the DPO family over pairs packed by
``pack_preferences``, equal the padded batch's to ≤ 1e-5 (float32)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.data import (
    TokenizedPreference,
    collate_preferences,
    pack_preferences,
    pack_rl_batch,
)
from jaxrl_llm.losses import (
    LOSSES,
    dpo_config,
    dr_grpo_config,
    grpo_config,
    gspo_config,
    orpo_config,
    preference_reference_logps,
    simpo_config,
)
from jaxrl_llm.objectives import AggregationMode
from tests.data.test_packing import rl_rows

ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    cfg = models.ModelConfig.tiny("qwen2")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    return params, functools.partial(models.apply, config=cfg)


def _value_and_grad(fn, params, batch, **kw):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    (loss, metrics), grads = jax.jit(jax.value_and_grad(functools.partial(fn, **kw), has_aux=True))(
        params, batch
    )
    return float(loss), metrics, grads


def _close(a, b):
    diffs = jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b))
    assert max(diffs) <= ATOL, max(diffs)


@pytest.mark.parametrize(
    "name, config",
    [
        ("grpo", grpo_config(kl_coef=0.04)),
        ("grpo", grpo_config(aggregation=AggregationMode.SEQ_MEAN_TOKEN_MEAN, entropy_coef=0.01)),
        ("dr_grpo", dr_grpo_config(max_len=30)),
        ("gspo", gspo_config()),
    ],
    ids=["grpo-kl", "grpo-seq-mean-entropy", "dr-grpo", "gspo"],
)
@pytest.mark.parametrize("p, w", [(7, 9), (2, 30)], ids=["short-completions", "long-completions"])
def test_packed_policy_gradient_loss_and_gradient_equal_padded(model, name, config, p, w):
    params, apply_fn = model
    rng = np.random.default_rng(0)
    batch = rl_rows(rng, 8, p, w)
    del batch["row_weight"]
    m = batch["loss_mask"].astype(bool)
    batch["ref_logp"] = (rng.normal(size=m.shape) * m).astype(np.float32)
    batch["old_logp"] = (batch["old_logp"] * 0.1 - 2.0 * m).astype(np.float32)
    spec = LOSSES[name]
    packed = pack_rl_batch(batch, window=w)
    r, length = packed["input_ids"].shape
    assert r < 8  # the padded batch has 8 rows
    # which side _packed_logps unembeds: only the 8 × W targets (short completions), or
    # every packed token (long, ragged completions)
    assert (8 * w < r * (length - 1)) == (w == 9)
    l1, m1, g1 = _value_and_grad(spec.loss_fn, params, batch, apply_fn=apply_fn, config=config)
    l2, m2, g2 = _value_and_grad(spec.loss_fn, params, packed, apply_fn=apply_fn, config=config)
    assert abs(l1 - l2) <= ATOL
    _close(g1, g2)
    for k in ("entropy", "pg/clipfrac"):
        assert abs(float(m1[k]) - float(m2[k])) <= ATOL, k


def _pairs(seed, n=6):
    rng = np.random.default_rng(seed)

    def toks(k):
        return tuple(int(x) for x in rng.integers(3, 60, k))

    return [
        TokenizedPreference(toks(int(a)), toks(int(b)), toks(int(c)))
        for a, b, c in rng.integers(1, 10, (n, 3))
    ]


@pytest.mark.parametrize(
    "name, config", [("dpo", dpo_config()), ("simpo", simpo_config()), ("orpo", orpo_config())]
)
def test_packed_pairs_loss_and_gradient_equal_padded(model, name, config):
    params, apply_fn = model
    items = _pairs(1)
    padded = collate_preferences(items)
    packed = pack_preferences(items, row_len=24)
    assert packed["input_ids"].size < padded["chosen_input_ids"].size * 2
    if name == "dpo":  # the reference log-probs: same per pair from either layout
        ref_params = jax.tree.map(lambda x: x * 0.9, params)
        refs = [
            preference_reference_logps(
                ref_params, {k: jnp.asarray(v) for k, v in b.items()}, apply_fn=apply_fn
            )
            for b in (padded, packed)
        ]
        _close(refs[0], refs[1])
        padded, packed = {**padded, **refs[0]}, {**packed, **refs[1]}
    fn = LOSSES[name].loss_fn
    l1, m1, g1 = _value_and_grad(fn, params, padded, apply_fn=apply_fn, config=config)
    l2, m2, g2 = _value_and_grad(fn, params, packed, apply_fn=apply_fn, config=config)
    assert abs(l1 - l2) <= ATOL
    _close(g1, g2)
    _close(m1, m2)
    den = LOSSES[name].denominator_fn
    assert float(den(packed)) == float(den(padded)) == len(items)

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError


def _grad(f):
    """Jitted gradient (op-by-op eager differentiation is slow on CPU)."""
    return jax.jit(jax.grad(f))


sp = lambda x: math.log1p(math.exp(x))  # noqa: E731  softplus = −log σ(−x)
Z = jnp.zeros(1)


def test_dpo_seed_worked_example_reference_free(run):
    # Seed 003: β = 0.5, log π(A) = −45.6 (preferred), log π(B) = −28.3 -> logit −8.65,
    # loss −log σ(−8.65) ≈ 8.65 (the text rounds σ to 0.00018 and prints 8.62).
    losses, met = run(obj.dpo_loss, jnp.array([-45.6]), jnp.array([-28.3]), Z, Z, beta=0.5)
    assert float(losses[0]) == pytest.approx(8.650175, rel=1e-5)
    assert float(met["rewards/margins"]) == pytest.approx(-8.65, rel=1e-5)
    assert float(met["rewards/accuracies"]) == 0.0


@pytest.mark.parametrize(
    "kind, ls, expected",
    [
        ("sigmoid", 0.0, math.log(2.0)),
        ("cdpo", 0.2, math.log(2.0)),
        ("robust", 0.2, math.log(2.0)),
        ("hinge", 0.0, 1.0),
        ("ipo", 0.0, 25.0),
    ],
)
def test_dpo_at_reference(kind, ls, expected):
    lp = jnp.array([-3.0, -7.0])
    losses, _ = obj.dpo_loss(lp, lp + 1, lp, lp + 1, beta=0.1, kind=kind, label_smoothing=ls)
    np.testing.assert_allclose(losses, [expected] * 2, rtol=1e-6)


# chosen log-ratio 4, rejected log-ratio −2 -> h = 6
C, R, RC, RR = jnp.array([-10.0]), jnp.array([-12.0]), jnp.array([-14.0]), jnp.array([-10.0])


@pytest.mark.parametrize(
    "kind, beta, ls, expected",
    [
        ("sigmoid", 0.5, 0.0, sp(-3.0)),
        ("sigmoid", 0.5, 0.1, 0.9 * sp(-3.0) + 0.1 * sp(3.0)),
        ("cdpo", 0.5, 0.1, 0.9 * sp(-3.0) + 0.1 * sp(3.0)),
        ("robust", 0.5, 0.1, (0.9 * sp(-3.0) - 0.1 * sp(3.0)) / 0.8),
        ("hinge", 0.1, 0.0, 0.4),
        ("hinge", 0.5, 0.0, 0.0),
        ("ipo", 0.5, 0.0, 25.0),  # (6 − 1)²
    ],
)
def test_dpo_kinds_hand_values(run, kind, beta, ls, expected):
    losses, met = run(obj.dpo_loss, C, R, RC, RR, beta=beta, kind=kind, label_smoothing=ls)
    assert float(losses[0]) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert float(met["rewards/chosen"]) == pytest.approx(4 * beta)
    assert float(met["rewards/rejected"]) == pytest.approx(-2 * beta)
    assert float(met["rewards/accuracies"]) == 1.0


def test_ipo_length_normalised():
    # per-token log-ratios: 4/4 = 1 and −2/2 = −1 -> h = 2; β = 0.5 -> (2 − 1)² = 1
    losses, _ = obj.dpo_loss(
        C,
        R,
        RC,
        RR,
        beta=0.5,
        kind="ipo",
        chosen_lengths=jnp.array([4]),
        rejected_lengths=jnp.array([2]),
    )
    assert float(losses[0]) == pytest.approx(1.0, rel=1e-6)


def test_dpo_errors_and_gradient():
    with pytest.raises(ConfigError, match="label_smoothing"):
        obj.dpo_loss(C, R, RC, RR, kind="robust", label_smoothing=0.5)
    with pytest.raises(ConfigError, match="label_smoothing"):
        obj.dpo_loss(C, R, RC, RR, kind="ipo", label_smoothing=0.1)
    with pytest.raises(ConfigError, match="kind"):
        obj.dpo_loss(C, R, RC, RR, kind="exo")
    g = _grad(lambda c: obj.dpo_loss(c, R, RC, RR, beta=0.5)[0].sum())(C)
    # d/dc softplus(−β h) = −β σ(−β h)
    assert float(g[0]) == pytest.approx(-0.5 / (1 + math.exp(3.0)), rel=1e-5)


def test_kto_hand_values(run):
    losses, met = run(
        obj.kto_loss,
        jnp.array([1.0]),
        jnp.array([-0.5]),
        jnp.array([0.2, 0.4]),
        beta=0.1,
        undesirable_weight=2.0,
    )
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    np.testing.assert_allclose(losses, [1 - sig(0.07), 2 * (1 - sig(0.08))], rtol=1e-5)
    assert float(met["kl"]) == pytest.approx(0.3)
    # negative KL estimates clamp to z0 = 0; no gradient flows into kl
    losses0, met0 = obj.kto_loss(jnp.array([1.0]), jnp.zeros((0,)), jnp.array(-1.0))
    assert float(met0["kl"]) == 0.0
    assert float(losses0[0]) == pytest.approx(1 - sig(0.1), rel=1e-6)
    gk = _grad(lambda k: obj.kto_loss(jnp.array([1.0]), jnp.array([-0.5]), k)[0].sum())(
        jnp.array([0.2, 0.4])
    )
    np.testing.assert_array_equal(gk, 0.0)


def test_orpo_hand_value_and_stability(run):
    # P_w = 0.5 -> log odds 0; P_l = 0.2 -> odds 0.25; −log σ(log 4) = log 1.25
    losses, met = run(obj.orpo_loss, jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.2])), beta=0.1)
    assert float(losses[0]) == pytest.approx(0.1 * math.log(1.25), rel=1e-5)
    assert float(met["log_odds_chosen"]) == pytest.approx(math.log(4.0), rel=1e-5)
    extreme = jnp.array([-1e-9, -1e-3, -0.69, -0.7, -80.0])
    g = _grad(lambda c: obj.orpo_loss(c, extreme[::-1])[0].sum())(extreme)
    assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(
        obj.log1mexp(jnp.array([-1e-3, -1.0, -30.0])),
        [math.log(-math.expm1(-1e-3)), math.log1p(-math.exp(-1.0)), math.log1p(-math.exp(-30.0))],
        rtol=1e-5,
    )


def test_simpo_hand_value(run):
    losses, met = run(obj.simpo_loss, jnp.array([-0.5]), jnp.array([-1.0]))
    assert float(losses[0]) == pytest.approx(sp(-0.5), rel=1e-6)  # β·0.5 − γ = 0.5
    assert float(met["rewards/margins"]) == pytest.approx(1.0)


def test_bradley_terry_hand_values(run):
    losses, met = run(obj.bradley_terry_loss, jnp.array([2.0, 0.0]), jnp.array([1.0, 1.0]))
    np.testing.assert_allclose(losses, [sp(-1.0), sp(1.0)], rtol=1e-6)
    assert float(met["accuracy"]) == 0.5
    with_margin, _ = obj.bradley_terry_loss(
        jnp.array([2.0, 0.0]), jnp.array([1.0, 1.0]), margin=jnp.array([0.5, 0.0])
    )
    np.testing.assert_allclose(with_margin, [sp(-0.5), sp(1.0)], rtol=1e-6)


def test_pairwise_rank_seed_example(run):
    # Seed 003, "four summaries", β = 0.3, ranking 2 > 3 > 1 > 4 (scores are ranks).
    lp = jnp.array([-32.1, -67.4, -58.9, -18.2])
    scores = jnp.array([2.0, 4.0, 3.0, 1.0])
    losses, met = run(obj.pairwise_rank_loss, lp, scores, group_size=4, beta=0.3)
    pairs = [(1, 2), (1, 0), (1, 3), (2, 0), (2, 3), (0, 3)]
    terms = [sp(-0.3 * (float(lp[i]) - float(lp[j]))) for i, j in pairs]
    # the seed's printed pair terms: (2>3) 2.63, (2>1) 10.60, (1>4) 4.20
    assert terms[0] == pytest.approx(2.63, abs=0.01)
    assert terms[1] == pytest.approx(10.59, abs=0.01)
    assert terms[5] == pytest.approx(4.19, abs=0.01)
    assert float(losses[0]) == pytest.approx(sum(terms), rel=1e-5)
    assert float(losses[0]) == pytest.approx(52.4109, rel=1e-5)
    assert float(met["num_pairs"]) == 6.0


def test_pairwise_rank_ties_skipped_and_groups():
    lp = jnp.array([-1.0, -2.0, -3.0, -1.0, -1.0, -5.0])
    scores = jnp.array([1.0, 1.0, 0.0, 2.0, 2.0, 2.0])
    losses, met = obj.pairwise_rank_loss(lp, scores, group_size=3, beta=1.0)
    np.testing.assert_allclose(losses, [sp(-2.0) + sp(-1.0), 0.0], rtol=1e-6)
    assert float(met["num_pairs"]) == 1.0  # 2 pairs in group 0, none in group 1
    assert float(met["pair_accuracy"]) == 1.0
    with pytest.raises(ConfigError, match="group_size"):
        obj.pairwise_rank_loss(lp, scores, group_size=4, beta=1.0)


def test_vmap_dpo():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    xs = [jax.random.normal(ki, (2, 5)) for ki in k]
    got = jax.vmap(lambda *a: obj.dpo_loss(*a, kind="robust", label_smoothing=0.1)[0])(*xs)
    for i in range(2):
        want = obj.dpo_loss(*[x[i] for x in xs], kind="robust", label_smoothing=0.1)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-6)

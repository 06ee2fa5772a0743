import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError
from tests.objectives._helpers import batch, check_grad_fd, pad_with_garbage, tokens


def _grad(f):
    return jax.jit(jax.grad(f))


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- CISPO


def test_cispo_hand_values_and_clip_shares(run):
    # ratios 1.5 (clipped to 1.2), 0.5 (clipped to 0.8), 1.1 (kept); loss −ŵ·A·log π
    logp, old, adv, m = tokens([1.5, 0.5, 1.1], [1.0, -1.0, 2.0])
    loss, met = run(obj.cispo_loss, logp, old, adv, m)
    lp = np.asarray(logp)[0]
    want = np.mean([-1.2 * 1.0 * lp[0], -0.8 * -1.0 * lp[1], -1.1 * 2.0 * lp[2]])
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(met["clipfrac"]) == pytest.approx(2 / 3)
    assert float(met["clipfrac_low"]) == pytest.approx(1 / 3)
    assert float(met["clipfrac_high"]) == pytest.approx(1 / 3)
    assert float(met["is_weight_mean"]) == pytest.approx((1.2 + 0.8 + 1.1) / 3, rel=1e-5)
    # every token keeps its gradient −ŵ·A/N, clipped ones included (PPO would zero them)
    g = _grad(lambda x: obj.cispo_loss(x, old, adv, m)[0])(logp)
    np.testing.assert_allclose(g[0], [-1.2 / 3, 0.8 / 3, -2.2 / 3], rtol=1e-5)


def test_cispo_no_lower_bound_is_the_papers_setting():
    logp, old, adv, m = tokens([0.05, 3.0], [1.0, 1.0])
    _, met = obj.cispo_loss(logp, old, adv, m, clip_eps_low=None, clip_eps_high=0.2)
    assert float(met["clipfrac_low"]) == 0.0
    assert float(met["clipfrac_high"]) == pytest.approx(0.5)
    g = _grad(lambda x: obj.cispo_loss(x, old, adv, m, clip_eps_low=None)[0])(logp)
    np.testing.assert_allclose(g[0], [-0.05 / 2, -1.2 / 2], rtol=1e-5)
    with pytest.raises(ConfigError, match="clip_eps_low"):
        obj.cispo_loss(logp, old, adv, m, clip_eps_low=-0.1)


def test_cispo_without_active_clip_has_the_policy_gradient():
    logp, old, adv, m = batch(0, scale=0.05)  # every ratio within [0.8, 1.2]
    _, met = obj.cispo_loss(logp, old, adv, m)
    assert float(met["clipfrac"]) == 0.0
    # vanilla PG at r = 1 ...
    g = _grad(lambda x: obj.cispo_loss(x, x, adv, m)[0])(logp)
    g_pg = _grad(lambda x: -jnp.sum(adv[:, None] * x * m) / jnp.sum(m))(logp)
    np.testing.assert_allclose(g, g_pg, rtol=1e-5, atol=1e-7)
    # ... and, off-policy, the gradient of PPO's unclipped surrogate −A·r.
    g = _grad(lambda x: obj.cispo_loss(x, old, adv, m)[0])(logp)
    g_ppo = _grad(lambda x: obj.policy_loss(x, old, adv, m)[0])(logp)
    np.testing.assert_allclose(g, g_ppo, rtol=1e-5, atol=1e-7)
    # CISPO's gradient is that of the loss with the (constant) weights frozen, whose gradient
    # agrees with finite differences
    w = jnp.exp(logp - old)
    g_fd = check_grad_fd(lambda x: -jnp.sum(w * adv[:, None] * x * m) / jnp.sum(m), logp, m)
    np.testing.assert_allclose(g, g_fd, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- SAPO


def test_sapo_hand_values(run):
    # (r, A): (1, +1) -> −2/τ_pos·... ; (2, +1); (1, −1) uses τ_neg; (0.5, −2)
    ratios, advs = [1.0, 2.0, 1.0, 0.5], [1.0, 1.0, -1.0, -2.0]
    logp, old, adv, m = tokens(ratios, advs)
    loss, met = run(obj.sapo_loss, logp, old, adv, m, tau_pos=1.0, tau_neg=1.05)
    want = []
    for r, a in zip(ratios, advs):
        tau = 1.0 if a > 0 else 1.05
        want.append(-(4 / tau) * _sigmoid(tau * (r - 1)) * a)
    assert float(loss) == pytest.approx(np.mean(want), rel=1e-5)
    assert float(met["ratio_max"]) == pytest.approx(2.0, rel=1e-5)


def test_sapo_gate_derivative_is_one_at_ratio_one():
    logp, _, adv, m = batch(1)
    for tau in (0.5, 1.0, 3.0):
        f = lambda x: obj.sapo_loss(x, logp, adv, m, tau_pos=tau, tau_neg=2 * tau)[0]  # noqa
        g = _grad(f)(logp)
        g_pg = _grad(lambda x: obj.aggregate(-adv[:, None] * x, m, mode="seq_mean_token_mean"))(
            logp
        )
        np.testing.assert_allclose(g, g_pg, rtol=1e-5, atol=1e-7)
    _, met = obj.sapo_loss(logp, logp, adv, m)
    assert float(met["gate_weight_mean"]) == pytest.approx(1.0, rel=1e-6)


def test_sapo_gradient_matches_finite_differences_and_fades_off_policy():
    logp, old, adv, m = batch(2, scale=0.4)
    check_grad_fd(lambda x: obj.sapo_loss(x, old, adv, m)[0], logp, m)
    # far off-policy tokens get almost no gradient (the soft trust region)
    lp, o, a, mm = tokens([1.0, 20.0], [1.0, 1.0])
    g = _grad(lambda x: obj.sapo_loss(x, o, a, mm)[0])(lp)
    assert abs(float(g[0, 1])) < 1e-5 < abs(float(g[0, 0]))
    with pytest.raises(ConfigError, match="tau"):
        obj.sapo_loss(lp, o, a, mm, tau_neg=0.0)


# ---------------------------------------------------------------- GMPO


def test_gmpo_hand_values_sign_aware_clip(run):
    lr = jnp.array([[0.5, -0.5, 0.1], [0.5, -0.5, 0.1]])
    old = jnp.full((2, 3), -1.0)
    logp = old + lr
    adv = jnp.array([1.0, -1.0])
    m = jnp.ones((2, 3))
    loss, met = run(obj.gmpo_loss, logp, old, adv, m, clip_eps=0.4)
    # A > 0 caps +0.5 at 0.4, keeps −0.5; A < 0 floors −0.5 at −0.4, keeps +0.5
    row0 = -1.0 * math.exp((0.4 - 0.5 + 0.1) / 3)
    row1 = 1.0 * math.exp((0.5 - 0.4 + 0.1) / 3)
    assert float(loss) == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert float(met["clipfrac"]) == pytest.approx(2 / 6)
    assert float(met["clipfrac_high"]) == pytest.approx(1 / 6)
    assert float(met["clipfrac_low"]) == pytest.approx(1 / 6)
    g = _grad(lambda x: obj.gmpo_loss(x, old, adv, m, clip_eps=0.4)[0])(logp)
    # capped tokens: 0; others −A·exp(mean)/(|y|·B)
    e0, e1 = math.exp(0.0 / 3), math.exp(0.2 / 3)
    np.testing.assert_allclose(
        g, [[0.0, -e0 / 6, -e0 / 6], [e1 / 6, 0.0, e1 / 6]], rtol=1e-5, atol=1e-7
    )


def test_gmpo_matches_finite_differences_and_token_advantages():
    logp, old, adv, m = batch(3, scale=0.1)
    check_grad_fd(lambda x: obj.gmpo_loss(x, old, adv, m)[0], logp, m)
    a, _ = obj.gmpo_loss(logp, old, adv, m)
    b, _ = obj.gmpo_loss(logp, old, jnp.broadcast_to(adv[:, None], m.shape), m)
    assert float(a) == pytest.approx(float(b), rel=1e-6)
    # one-token rows without clipping: the geometric mean is the token ratio itself
    m1 = jnp.zeros_like(m).at[:, 0].set(1)
    c, _ = obj.gmpo_loss(logp, old, adv, m1, clip_eps=10.0)
    assert float(c) == pytest.approx(float(jnp.mean(-adv * jnp.exp(logp - old)[:, 0])), rel=1e-5)


# ---------------------------------------------------------------- all three

LOSSES = {
    "cispo": (obj.cispo_loss, obj.cispo_loss_parts, {}),
    "sapo": (obj.sapo_loss, obj.sapo_loss_parts, {}),
    "gmpo": (obj.gmpo_loss, obj.gmpo_loss_parts, {"clip_eps": 0.2}),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_padding_changes_nothing(name):
    fn, _, kw = LOSSES[name]
    logp, old, adv, m = batch(4)
    want, met = fn(logp, old, adv, m, **kw)
    padded = pad_with_garbage(logp, old, adv, m)
    got, met2 = fn(*padded, **kw)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for k in met:
        assert float(met2[k]) == pytest.approx(float(met[k]), rel=1e-5, abs=1e-7), k
    g = _grad(lambda x: fn(x, *padded[1:], **kw)[0])(padded[0])
    assert np.isfinite(np.asarray(g)).all()
    assert (np.asarray(g)[np.asarray(padded[3]) == 0] == 0).all()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_parts_accumulate_to_whole_batch(name):
    fn, parts_fn, kw = LOSSES[name]
    logp, old, adv, m = batch(5)
    whole, _ = fn(logp, old, adv, m, **kw)
    parts = [parts_fn(logp[a:b], old[a:b], adv[a:b], m[a:b], **kw) for a, b in [(0, 1), (1, 4)]]
    total = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    assert float(total) == pytest.approx(float(whole), rel=1e-5)


# ---------------------------------------------------------------- rollout-correction weights


@pytest.mark.parametrize("name", ["cispo_loss", "sapo_loss"])
def test_rollout_weights_multiply_each_tokens_loss(name, run):
    # w·ℓ per token with the denominator unchanged: the loss is linear in the weights, so
    # weights 1 change nothing, 2 doubles it, and a split of the tokens adds up to the whole
    fn = getattr(obj, name)
    logp, old, adv, m = tokens([1.5, 0.5, 1.1, 0.9], [1.0, -1.0, 2.0, -0.5])
    plain, _ = run(fn, logp, old, adv, m)
    ones = jnp.ones_like(logp)
    first = jnp.asarray([[1.0, 1.0, 0.0, 0.0]])
    loss1, met = run(fn, logp, old, adv, m, is_weights=ones)
    loss2, _ = run(fn, logp, old, adv, m, is_weights=2 * ones)
    a, _ = run(fn, logp, old, adv, m, is_weights=first)
    b, _ = run(fn, logp, old, adv, m, is_weights=1 - first)
    assert float(loss1) == pytest.approx(float(plain), rel=1e-6)
    assert float(loss2) == pytest.approx(2 * float(plain), rel=1e-6)
    assert float(a) + float(b) == pytest.approx(float(plain), rel=1e-5)
    assert float(a) != pytest.approx(float(b))
    assert float(met["rollout_weight_mean"]) == pytest.approx(1.0)


# ---------------------------------------------------------------- DRO


def test_dro_hand_values_and_gradient(run):
    # ℓ_t = −(A·log π − β/2·(log π − log q)²), token mean; ∇ = −(A − β·log r)/N
    logp, old, adv, m = tokens([1.5, 0.5, 1.1], [1.0, -1.0, 2.0])
    loss, met = run(obj.dro_loss, logp, old, adv, m, beta=0.5)
    lp, lq = np.asarray(logp)[0], np.asarray(old)[0]
    lr = lp - lq
    want = np.mean(-(np.array([1.0, -1.0, 2.0]) * lp - 0.25 * lr**2))
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(met["penalty_mean"]) == pytest.approx(np.mean(lr**2), rel=1e-5)
    g = _grad(lambda x: obj.dro_loss(x, old, adv, m, beta=0.5)[0])(logp)
    np.testing.assert_allclose(g[0], -(np.array([1.0, -1.0, 2.0]) - 0.5 * lr) / 3, rtol=1e-5)
    with pytest.raises(ConfigError, match="beta"):
        obj.dro_loss(logp, old, adv, m, beta=-1.0)

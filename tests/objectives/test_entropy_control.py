import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError
from tests.objectives._helpers import batch, check_grad_fd, pad_with_garbage


def _grad(f):
    return jax.jit(jax.grad(f))


def _np_cov(logp, adv, mask):
    """Reference Cov_t over the valid tokens, written out in NumPy."""
    lp, a, m = (
        np.asarray(x, np.float64)
        for x in (logp, np.broadcast_to(np.asarray(adv)[:, None], np.shape(logp)), mask)
    )
    valid = m > 0
    return np.where(valid, (lp - lp[valid].mean()) * (a - a[valid].mean()), 0.0)


def test_token_covariance_hand_values(run):
    logp = jnp.array([[-1.0, -2.0, -3.0], [-0.5, 9.0, 9.0]])
    adv = jnp.array([1.0, -1.0])
    m = jnp.array([[1, 1, 1], [1, 0, 0]])
    cov = run(obj.token_covariance, logp, adv, m)
    # means over the 4 valid tokens: logp −1.625, A 0.5
    want = [[0.625 * 0.5, -0.375 * 0.5, -1.375 * 0.5], [1.125 * -1.5, 0.0, 0.0]]
    np.testing.assert_allclose(cov, want, rtol=1e-6)
    np.testing.assert_allclose(cov, _np_cov(logp, adv, m), rtol=1e-6)


def _kl_cov_reference(logp, old, adv, m, ratio, coef):
    cov = _np_cov(logp, adv, m)
    valid = np.asarray(m) > 0
    k = max(1, int(valid.sum() * ratio))
    order = np.argsort(-np.where(valid, cov, -np.inf), kind="stable", axis=None)[:k]
    sel = np.zeros(valid.size, bool)
    sel[order] = True
    sel = sel.reshape(valid.shape)
    lr = np.asarray(logp - old, np.float64)
    a = np.broadcast_to(np.asarray(adv)[:, None], lr.shape)
    per = -a * np.exp(lr) + np.where(sel, coef * np.abs(lr), 0.0)
    return per[valid].mean(), sel


def test_kl_cov_matches_reference_selection(run):
    logp, old, adv, m = batch(0)
    loss, met = run(obj.kl_cov_loss, logp, old, adv, m, kl_cov_ratio=0.25, kl_coef=0.7)
    want, sel = _kl_cov_reference(logp, old, adv, m, 0.25, 0.7)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    n = int(np.sum(m))  # 14 valid tokens -> k = floor(3.5) = 3
    assert float(met["kl_cov_frac"]) == pytest.approx(3 / n)
    assert sel.sum() == 3
    cov = _np_cov(logp, adv, m)
    assert float(met["cov_selected_min"]) == pytest.approx(cov[sel].min(), rel=1e-5)
    assert float(met["cov_mean"]) == pytest.approx(cov[np.asarray(m) > 0].mean(), rel=1e-5)
    # gradient: −A·r everywhere, plus coef·sign(log r) on the selected tokens
    g = _grad(lambda x: obj.kl_cov_loss(x, old, adv, m, kl_cov_ratio=0.25, kl_coef=0.7)[0])(logp)
    lr = np.asarray(logp - old)
    a = np.broadcast_to(np.asarray(adv)[:, None], lr.shape)
    want_g = (
        np.where(np.asarray(m) > 0, -a * np.exp(lr) + np.where(sel, 0.7 * np.sign(lr), 0), 0) / n
    )
    np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-7)
    check_grad_fd(lambda x: obj.kl_cov_loss(x, old, adv, m, kl_cov_ratio=0.25)[0], logp, m, h=1e-4)


def test_kl_cov_token_count_at_least_one_and_exact_products():
    logp, old, adv, _ = batch(1, b=4, t=25)
    m = jnp.ones((2, 25), jnp.int32)
    args = (logp[:2], old[:2], adv[:2], m)
    _, met = obj.kl_cov_loss(*args)  # 50 · 2e-4 = 0.01 -> at least one token
    assert float(met["kl_cov_frac"]) == pytest.approx(1 / 50)
    _, met = obj.kl_cov_loss(*args, kl_cov_ratio=0.06)  # 50 · 0.06 = 3 exactly
    assert float(met["kl_cov_frac"]) == pytest.approx(3 / 50)
    with pytest.raises(ConfigError, match="kl_cov_ratio"):
        obj.kl_cov_loss(*args, kl_cov_ratio=0.0)
    # equal advantages: every Cov_t is 0, ties go to the first tokens in row-major order
    flat_adv = jnp.full((2,), 0.5)
    loss, _ = obj.kl_cov_loss(logp[:2], old[:2], flat_adv, m, kl_cov_ratio=0.06)
    want, sel = _kl_cov_reference(logp[:2], old[:2], flat_adv, m, 0.06, 1.0)
    assert sel.reshape(-1)[:3].all() and sel.sum() == 3
    assert float(loss) == pytest.approx(want, rel=1e-5)


def test_kl_cov_with_zero_coefficient_is_the_unclipped_policy_gradient():
    logp, old, adv, m = batch(2)
    a, _ = obj.kl_cov_loss(logp, old, adv, m, kl_coef=0.0)
    b, _ = obj.policy_loss(logp, old, adv, m, clip_eps=1e9)
    assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_kl_cov_gradient_matches_finite_differences():
    # the selection is piecewise constant in logp: away from ties, the loss is smooth, and its
    # gradient (unclipped surrogate + coef·sign(log ρ) on the selected tokens) is the FD one
    logp, old, adv, m = batch(6)
    f = lambda x: obj.kl_cov_loss(x, old, adv, m, kl_cov_ratio=0.3, kl_coef=0.5)[0]  # noqa: E731
    g = check_grad_fd(f, logp, m)
    g_pg = _grad(lambda x: obj.policy_loss(x, old, adv, m, clip_eps=1e9)[0])(logp)
    assert float(jnp.max(jnp.abs(g - g_pg))) > 1e-3  # the |log ρ| term is in the gradient


def test_clip_cov_gradient_matches_finite_differences_off_the_detached_tokens():
    # along directions that leave the detached tokens (value kept, gradient 0) alone, the
    # Clip-Cov gradient is the derivative of its value
    logp, old, adv, m = batch(3, b=4, t=6, scale=0.1)
    adv = adv * 6.0
    kw = dict(clip_cov_ratio=0.15, clip_cov_lb=0.05, clip_cov_ub=5.0, key=jax.random.PRNGKey(0))
    f = lambda x: obj.clip_cov_loss(x, old, adv, m, **kw)[0]  # noqa: E731
    g = np.asarray(_grad(f)(logp))
    detached = (g == 0) & (np.asarray(_ppo_grad(logp, old, adv, m)) != 0)
    assert detached.sum() == 2
    check_grad_fd(f, logp, m * jnp.asarray(~detached))


def _ppo_grad(logp, old, adv, m):
    return _grad(lambda x: obj.policy_loss(x, old, adv, m)[0])(logp)


def test_clip_cov_detaches_a_random_subset_of_candidates(run):
    logp, old, adv, m = batch(3, b=4, t=6, scale=0.1)
    adv = adv * 6.0  # covariances large enough to fall in (lb, ub)
    cov = np.asarray(obj.token_covariance(logp, adv, m))
    r = np.exp(np.asarray(logp - old))
    a = np.broadcast_to(np.asarray(adv)[:, None], r.shape)
    ppo_clipped = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
    cand = (np.asarray(m) > 0) & ~ppo_clipped & (cov > 0.05) & (cov < 5.0)
    assert cand.sum() >= 3
    ppo_g = np.asarray(_ppo_grad(logp, old, adv, m))
    ppo_loss = float(obj.policy_loss(logp, old, adv, m)[0])
    kw = dict(clip_cov_ratio=0.15, clip_cov_lb=0.05, clip_cov_ub=5.0)  # k = floor(2.1) = 2
    loss, met = run(obj.clip_cov_loss, logp, old, adv, m, key=jax.random.PRNGKey(0), **kw)
    assert float(loss) == pytest.approx(ppo_loss, rel=1e-6)  # the value is kept (detach)
    assert float(met["cov_clipfrac"]) == pytest.approx(2 / int(np.sum(m)))
    assert float(met["cov_candidate_frac"]) == pytest.approx(cand.sum() / np.sum(m))
    grad = jax.jit(jax.grad(lambda x, key: obj.clip_cov_loss(x, old, adv, m, key=key, **kw)[0]))
    subsets = set()
    for seed in range(4):
        g = np.asarray(grad(logp, jax.random.PRNGKey(seed)))
        zeroed = (g == 0) & (ppo_g != 0)
        assert zeroed.sum() == 2 and (zeroed <= cand).all()
        np.testing.assert_allclose(g[~zeroed], ppo_g[~zeroed], rtol=1e-6, atol=1e-8)
        subsets.add(tuple(np.flatnonzero(zeroed)))
    assert len(subsets) > 1  # the key picks the subset


def test_clip_cov_all_candidates_or_none():
    logp, old, adv, m = batch(4, scale=0.1)
    key = jax.random.PRNGKey(0)
    ppo_g = _ppo_grad(logp, old, adv, m)
    # empty band: nothing detached, PPO's gradient
    g = _grad(
        lambda x: obj.clip_cov_loss(x, old, adv, m, key=key, clip_cov_lb=1e6, clip_cov_ub=2e6)[0]
    )(logp)
    np.testing.assert_allclose(g, ppo_g, rtol=1e-6)
    # ratio 1 and a band holding everything: every unclipped token detached
    g = _grad(
        lambda x: obj.clip_cov_loss(
            x, old, adv, m, key=key, clip_cov_ratio=1.0, clip_cov_lb=-1e6, clip_cov_ub=1e6
        )[0]
    )(logp)
    assert float(jnp.max(jnp.abs(g))) == 0.0
    with pytest.raises(ConfigError, match="clip_cov_lb"):
        obj.clip_cov_loss(logp, old, adv, m, key=key, clip_cov_lb=5.0, clip_cov_ub=1.0)


@pytest.mark.parametrize("which", ["kl_cov", "clip_cov"])
def test_padding_changes_nothing(which):
    logp, old, adv, m = batch(5)
    if which == "kl_cov":
        fn = lambda *a: obj.kl_cov_loss(*a, kl_cov_ratio=0.2)  # noqa: E731
    else:
        fn = lambda *a: obj.clip_cov_loss(
            *a,
            key=jax.random.PRNGKey(1),
            clip_cov_ratio=1.0,  # noqa
            clip_cov_lb=-1.0,
            clip_cov_ub=0.1,
        )
    want, met = fn(logp, old, adv, m)
    padded = pad_with_garbage(logp, old, adv, m)
    got, met2 = fn(*padded)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for k in met:
        assert float(met2[k]) == pytest.approx(float(met[k]), rel=1e-5, abs=1e-7), k
    g = _grad(lambda x: fn(x, *padded[1:])[0])(padded[0])
    assert np.isfinite(np.asarray(g)).all()
    assert (np.asarray(g)[np.asarray(padded[3]) == 0] == 0).all()
    if which == "kl_cov":
        parts = [obj.kl_cov_loss_parts(*padded, kl_cov_ratio=0.2)]
        assert float(parts[0][0] / parts[0][1]) == pytest.approx(float(want), rel=1e-6)

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError
from tests.objectives._helpers import check_grad_fd, pad_with_garbage


def _grad(f):
    """Jitted gradient (op-by-op eager differentiation is slow on CPU)."""
    return jax.jit(jax.grad(f))


def _batch(seed=0, b=4, t=6):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    logp = -jax.random.uniform(k[0], (b, t), minval=0.1, maxval=3.0)
    old = logp + 0.3 * jax.random.normal(k[1], (b, t))
    adv = jax.random.normal(k[2], (b,))
    lens = jnp.array([t, t - 2, 3, 1])[:b]
    mask = (jnp.arange(t)[None, :] < lens[:, None]).astype(jnp.int32)
    return logp, old, adv, mask


def test_ratio_one_no_clip_is_vanilla_policy_gradient(run):
    logp, _, adv, mask = _batch()
    loss, metrics = run(obj.policy_loss, logp, logp, adv, mask)
    expected = -float(jnp.sum(adv[:, None] * mask) / jnp.sum(mask))
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    g = _grad(lambda lp: obj.policy_loss(lp, logp, adv, mask)[0])(logp)
    g_pg = _grad(lambda lp: -jnp.sum(adv[:, None] * lp * mask) / jnp.sum(mask))(logp)
    np.testing.assert_allclose(g, g_pg, rtol=1e-5, atol=1e-7)
    assert float(metrics["clipfrac"]) == 0.0
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0)
    assert float(metrics["approx_kl"]) == pytest.approx(0.0, abs=1e-7)


def _tokens(ratios, advs):
    """One row of tokens with given ratios and per-token advantages."""
    old = jnp.full((1, len(ratios)), -1.0)
    logp = old + jnp.log(jnp.array([ratios]))
    return logp, old, jnp.array([advs]), jnp.ones((1, len(ratios)))


def test_clip_hand_values_and_clipfracs(run):
    # tokens: (ρ=1.5, A=+1) clipped high -> -1.2; (ρ=0.5, A=+1) unclipped -> -0.5;
    # (ρ=0.5, A=-1) clipped low -> 0.8; (ρ=1.5, A=-1) unclipped -> 1.5
    logp, old, adv, m = _tokens([1.5, 0.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0])
    loss, met = run(obj.policy_loss, logp, old, adv, m, clip_eps=0.2)
    assert float(loss) == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5) / 4, rel=1e-5)
    assert float(met["clipfrac_high"]) == pytest.approx(0.25)
    assert float(met["clipfrac_low"]) == pytest.approx(0.25)
    assert float(met["clipfrac"]) == pytest.approx(0.5)
    assert float(met["ratio_min"]) == pytest.approx(0.5, rel=1e-5)
    assert float(met["ratio_max"]) == pytest.approx(1.5, rel=1e-5)
    g = _grad(lambda lp: obj.policy_loss(lp, old, adv, m)[0])(logp)
    # clipped tokens have zero gradient; unclipped: -A·ρ/N
    np.testing.assert_allclose(g[0], [0.0, -0.5 / 4, 0.0, 1.5 / 4], rtol=1e-5, atol=1e-8)


def test_clip_higher():
    logp, old, adv, m = _tokens([1.25], [1.0])
    default, _ = obj.policy_loss(logp, old, adv, m)
    higher, met = obj.policy_loss(logp, old, adv, m, clip_eps=0.2, clip_eps_high=0.28)
    assert float(default) == pytest.approx(-1.2)
    assert float(higher) == pytest.approx(-1.25, rel=1e-5)
    assert float(met["clipfrac_high"]) == 0.0


def test_dual_clip():
    logp, old, adv, m = _tokens([5.0, 5.0], [-1.0, 1.0])
    plain, _ = obj.policy_loss(logp, old, adv, m)
    dual, met = obj.policy_loss(logp, old, adv, m, dual_clip=3.0)
    assert float(plain) == pytest.approx((5.0 - 1.2) / 2, rel=1e-5)
    assert float(dual) == pytest.approx((3.0 - 1.2) / 2, rel=1e-5)
    assert float(met["dual_clipfrac"]) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="dual_clip"):
        obj.policy_loss(logp, old, adv, m, dual_clip=0.5)


def test_sequence_ratio_equals_token_ratio_for_one_token_responses(run):
    logp, old, adv, _ = _batch(1, b=4, t=3)
    m = jnp.zeros((4, 3), jnp.int32).at[:, 0].set(1)
    a, ma = run(obj.policy_loss, logp, old, adv, m, ratio_level="token")
    b, mb = run(obj.policy_loss, logp, old, adv, m, ratio_level="sequence")
    assert float(a) == pytest.approx(float(b), rel=1e-6)
    ga = _grad(lambda lp: obj.policy_loss(lp, old, adv, m)[0])(logp)
    gb = _grad(lambda lp: obj.policy_loss(lp, old, adv, m, ratio_level="sequence")[0])(logp)
    np.testing.assert_allclose(ga, gb, rtol=1e-6)


def test_gspo_value_and_gradient_match_sequence_objective():
    logp, old, adv, m = _batch(2)
    clip = 0.05

    def gspo(lp):  # GSPO eq. 5 with the true sequence ratio s_i (no stop-gradient trick)
        n = jnp.sum(m, 1)
        s = jnp.exp(jnp.sum((lp - old) * m, 1) / n)
        return -jnp.mean(jnp.minimum(s * adv, jnp.clip(s, 1 - clip, 1 + clip) * adv))

    def ours(lp):
        return obj.policy_loss(
            lp,
            old,
            adv,
            m,
            clip_eps=clip,
            ratio_level="sequence",
            aggregation="seq_mean_token_mean",
        )[0]

    assert float(ours(logp)) == pytest.approx(float(gspo(logp)), rel=1e-5)
    np.testing.assert_allclose(_grad(ours)(logp), _grad(gspo)(logp), rtol=1e-4, atol=1e-7)
    lr = obj.sequence_log_ratio(logp, old, m)
    row = np.asarray(jnp.sum((logp - old) * m, 1) / jnp.sum(m, 1))
    np.testing.assert_allclose(np.asarray(lr), row[:, None] * np.asarray(m), rtol=1e-5, atol=1e-7)


def test_advantage_shapes_broadcast():
    logp, old, adv, m = _batch(3)
    a, _ = obj.policy_loss(logp, old, adv, m)
    b, _ = obj.policy_loss(logp, old, jnp.broadcast_to(adv[:, None], m.shape), m)
    assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_padding_changes_nothing_and_gradients_finite():
    logp, old, adv, m = _batch(4)
    ref = logp - 0.1
    kw = dict(ref_logp=ref, kl_coef=0.05, dual_clip=3.0)
    loss, met = obj.policy_loss(logp, old, adv, m, **kw)
    bad = lambda x, v: jnp.where(m > 0, x, v)  # noqa: E731
    pad = lambda x, v: jnp.concatenate([x, jnp.full((1, x.shape[1]), v)], 0)  # noqa: E731
    logp2, old2, ref2 = (
        pad(bad(logp, -jnp.inf), jnp.nan),
        pad(bad(old, jnp.nan), 0.0),
        pad(bad(ref, jnp.inf), jnp.nan),
    )
    m2 = pad(m, 0)
    adv2 = jnp.concatenate([adv, jnp.array([jnp.nan])])
    for level in ("token", "sequence"):
        kw2 = dict(kw, ratio_level=level)
        want, _ = obj.policy_loss(logp, old, adv, m, **kw2)
        got, met2 = obj.policy_loss(logp2, old2, adv2, m2, **dict(kw2, ref_logp=ref2))
        assert float(got) == pytest.approx(float(want), rel=1e-6)
        g = _grad(lambda lp: obj.policy_loss(lp, old2, adv2, m2, **dict(kw2, ref_logp=ref2))[0])(
            logp2
        )
        assert np.isfinite(np.asarray(g)).all()
        assert (np.asarray(g)[np.asarray(m2) == 0] == 0).all()
    for k in met:
        assert np.isfinite(float(met[k]))


def test_kl_term_added_with_coefficient():
    logp, old, adv, m = _batch(5)
    ref = logp + 0.2 * jnp.sin(jnp.arange(6.0))
    base, _ = obj.policy_loss(logp, old, adv, m, ref_logp=ref)
    with_kl, met = obj.policy_loss(logp, old, adv, m, ref_logp=ref, kl_coef=0.1)
    k3 = obj.aggregate(obj.kl_penalty(logp, ref, kind="k3"), m)
    assert float(met["kl"]) == pytest.approx(float(k3), rel=1e-5)
    assert float(with_kl) == pytest.approx(float(base) + 0.1 * float(k3), rel=1e-5)
    with pytest.raises(ConfigError, match="ref_logp"):
        obj.policy_loss(logp, old, adv, m, kl_coef=0.1)


def test_approx_kl_is_k3_old_to_new():
    logp, old, adv, m = _tokens([2.0], [1.0])
    _, met = obj.policy_loss(logp, old, adv, m)
    assert float(met["approx_kl"]) == pytest.approx(2.0 - 1.0 - math.log(2.0), rel=1e-5)


@pytest.mark.parametrize(
    "mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
)
def test_parts_accumulate_to_whole_batch(mode):
    logp, old, adv, m = _batch(6)
    whole, _ = obj.policy_loss(logp, old, adv, m, aggregation=mode, max_len=6)
    parts = [
        obj.policy_loss_parts(logp[a:b], old[a:b], adv[a:b], m[a:b], aggregation=mode, max_len=6)
        for a, b in [(0, 1), (1, 4)]
    ]
    total = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    assert float(total) == pytest.approx(float(whole), rel=1e-5)


def test_vmap_over_independent_batches():
    batches = [_batch(s) for s in (7, 8)]
    stacked = [jnp.stack(x) for x in zip(*batches)]
    got = jax.vmap(lambda *a: obj.policy_loss(*a, clip_eps=0.1)[0])(*stacked)
    for i, bt in enumerate(batches):
        assert float(got[i]) == pytest.approx(
            float(obj.policy_loss(*bt, clip_eps=0.1)[0]), rel=1e-5
        )


def test_is_weights_of_ones_equal_no_weights():
    logp, old, adv, m = _batch(9)
    kw = dict(dual_clip=3.0, ref_logp=logp - 0.1, kl_coef=0.05)
    f = jax.jit(
        jax.value_and_grad(lambda lp, w: obj.policy_loss(lp, old, adv, m, **kw, is_weights=w)[0])
    )
    g = jax.jit(jax.value_and_grad(lambda lp: obj.policy_loss(lp, old, adv, m, **kw)[0]))
    (a, ga), (b, gb) = f(logp, jnp.ones_like(logp)), g(logp)
    assert float(a) == float(b)
    np.testing.assert_array_equal(ga, gb)


def test_is_weights_scale_the_surrogate_not_the_kl_and_keep_the_denominator(run):
    # tokens (ρ=1.5, A=+1) -> −1.2 and (ρ=0.5, A=+1) -> −0.5, weights 2 and 0
    logp, old, adv, m = _tokens([1.5, 0.5], [1.0, 1.0])
    w = jnp.array([[2.0, 0.0]])
    loss, met = run(obj.policy_loss, logp, old, adv, m, is_weights=w)
    assert float(loss) == pytest.approx((2 * -1.2 + 0 * -0.5) / 2, rel=1e-6)
    assert float(met["is_weight_mean"]) == pytest.approx(1.0)
    ref = old  # KL term untouched by the weights
    with_kl, _ = run(obj.policy_loss, logp, old, adv, m, is_weights=w, ref_logp=ref, kl_coef=0.5)
    k3 = obj.aggregate(obj.kl_penalty(logp, ref, kind="k3"), m)
    assert float(with_kl) == pytest.approx(float(loss) + 0.5 * float(k3), rel=1e-5)
    # gradient: w·(PPO gradient); finite differences agree
    lp, o, a, mm = _batch(10)
    wts = jnp.exp(0.3 * jnp.cos(jnp.arange(24.0))).reshape(4, 6)
    gw = check_grad_fd(lambda x: obj.policy_loss(x, o, a, mm, is_weights=wts)[0], lp, mm)
    g = _grad(lambda x: obj.policy_loss(x, o, a, mm)[0])(lp)
    np.testing.assert_allclose(gw, wts * g, rtol=1e-5, atol=1e-7)


def test_proximal_equal_to_old_is_plain_ppo():
    logp, old, adv, m = _batch(11)
    for level in ("token", "sequence"):
        kw = dict(ratio_level=level, dual_clip=3.0)
        a, ma = obj.policy_loss(logp, old, adv, m, **kw)
        b, mb = obj.policy_loss(logp, old, adv, m, proximal_logp=old, **kw)
        assert float(a) == pytest.approx(float(b), rel=1e-7)
        ga = _grad(lambda x: obj.policy_loss(x, old, adv, m, **kw)[0])(logp)
        gb = _grad(lambda x: obj.policy_loss(x, old, adv, m, proximal_logp=old, **kw)[0])(logp)
        np.testing.assert_allclose(ga, gb, rtol=1e-7)
        assert float(mb["behav_weight_mean"]) == pytest.approx(1.0)
        for k in ma:
            assert float(ma[k]) == pytest.approx(float(mb[k]), rel=1e-6, abs=1e-8), k


def test_decoupled_ppo_hand_values(run):
    # behaviour μ, proximal π_prox, current π_θ per token; ratio and clip around π_prox
    behav = jnp.log(jnp.array([[0.2, 0.5]]))
    prox = jnp.log(jnp.array([[0.3, 0.25]]))  # π_prox/μ = 1.5, 0.5
    logp = prox + jnp.log(jnp.array([[1.5, 1.1]]))  # π_θ/π_prox = 1.5 (clipped), 1.1
    adv = jnp.array([[1.0, -1.0]])
    m = jnp.ones((1, 2))
    loss, met = run(obj.policy_loss, logp, behav, adv, m, proximal_logp=prox)
    want = (1.5 * -1.2 + 0.5 * 1.1) / 2
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(met["behav_weight_max"]) == pytest.approx(1.5, rel=1e-5)
    assert float(met["clipfrac_high"]) == pytest.approx(0.5)
    g = _grad(lambda x: obj.policy_loss(x, behav, adv, m, proximal_logp=prox)[0])(logp)
    np.testing.assert_allclose(g[0], [0.0, 0.5 * 1.1 / 2], rtol=1e-5)
    lp, o, a, mm = _batch(12)
    p = o + 0.1 * jnp.sin(jnp.arange(6.0))
    check_grad_fd(lambda x: obj.policy_loss(x, o, a, mm, proximal_logp=p)[0], lp, mm)


def test_padding_with_weights_and_proximal_changes_nothing():
    logp, old, adv, m = _batch(13)
    prox = old + 0.05
    w = jnp.full(m.shape, 0.7)
    want, _ = obj.policy_loss(logp, old, adv, m, is_weights=w, proximal_logp=prox)
    logp2, old2, adv2, m2 = pad_with_garbage(logp, old, adv, m)
    prox2, _, _, _ = pad_with_garbage(prox, old, adv, m)
    w2 = jnp.concatenate([jnp.where(m > 0, w, jnp.nan), jnp.full((1, 6), jnp.inf)])
    f = lambda x: obj.policy_loss(x, old2, adv2, m2, is_weights=w2, proximal_logp=prox2)  # noqa
    assert float(f(logp2)[0]) == pytest.approx(float(want), rel=1e-6)
    g = _grad(lambda x: f(x)[0])(logp2)
    assert np.isfinite(np.asarray(g)).all()
    assert (np.asarray(g)[np.asarray(m2) == 0] == 0).all()

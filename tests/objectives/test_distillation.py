import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError

# Two positions, vocabulary 3: distributions chosen by hand.
P_S = np.array([[[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]]])
P_T = np.array([[[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]]])
S_LOGITS = jnp.log(jnp.array(P_S, jnp.float32)) + 3.0  # a shift: softmax is unchanged
T_LOGITS = jnp.log(jnp.array(P_T, jnp.float32)) - 1.0
MASK = jnp.ones((1, 2), jnp.int32)


def kl(p, q):
    return np.sum(p * np.log(p / q), axis=-1)


def jsd_np(ps, pt, beta):
    if beta == 0:
        return kl(pt, ps)
    if beta == 1:
        return kl(ps, pt)
    m = (1 - beta) * ps + beta * pt
    return beta * kl(pt, m) + (1 - beta) * kl(ps, m)


def softmax_np(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jsd_hand_values(run, beta):
    got = run(obj.generalized_jsd, S_LOGITS, T_LOGITS, MASK, beta=beta)
    assert got.shape == (1, 2) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, jsd_np(P_S, P_T, beta), rtol=1e-5, atol=1e-7)


def test_endpoints_are_forward_and_reverse_kl_by_hand():
    # position 0: KL(T‖S) = .5 log(.5/.7) + .25 log(.25/.2) + .25 log(.25/.1)
    fwd = 0.5 * math.log(0.5 / 0.7) + 0.25 * math.log(0.25 / 0.2) + 0.25 * math.log(2.5)
    rev = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.25) + 0.1 * math.log(0.1 / 0.25)
    f = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=0.0)
    r = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=1.0)
    assert float(f[0, 0]) == pytest.approx(fwd, rel=1e-5)
    assert float(r[0, 0]) == pytest.approx(rev, rel=1e-5)
    assert fwd != pytest.approx(rev, rel=1e-2)  # the two KLs differ, so the test can fail


def test_half_is_symmetric_and_bounded_by_log2():
    a = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=0.5)
    b = obj.generalized_jsd(T_LOGITS, S_LOGITS, MASK, beta=0.5)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    far = jnp.array([[[20.0, 0.0, 0.0]]]), jnp.array([[[0.0, 0.0, 20.0]]])
    assert float(obj.generalized_jsd(*far, jnp.ones((1, 1)), beta=0.5)[0, 0]) <= math.log(2)


def test_swapping_roles_maps_beta_to_one_minus_beta():
    # JSD_β(S, T) = JSD_{1−β}(T, S): the weights and the mixture swap together.
    a = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=0.2)
    b = obj.generalized_jsd(T_LOGITS, S_LOGITS, MASK, beta=0.8)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    f = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=0.0)
    r = obj.generalized_jsd(T_LOGITS, S_LOGITS, MASK, beta=1.0)
    np.testing.assert_allclose(f, r, rtol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_zero_when_student_equals_teacher(run, beta):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 11)) * 3
    got = run(obj.generalized_jsd, x, x, jnp.ones((2, 5)), beta=beta)
    np.testing.assert_allclose(got, 0.0, atol=1e-6)


def test_interior_tends_to_zero_at_the_endpoints_unlike_the_exact_kls():
    # The documented discontinuity: JSD(β)/β → KL(T‖S) as β → 0, JSD(β)/(1−β) → KL(S‖T).
    eps = 1e-3
    lo = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=eps) / eps
    hi = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=1 - eps) / eps
    np.testing.assert_allclose(lo, kl(P_T, P_S), rtol=5e-3)
    np.testing.assert_allclose(hi, kl(P_S, P_T), rtol=5e-3)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_temperature_divides_both_logits(run, beta):
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 7)) * 2
    y = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 7)) * 2
    m = jnp.ones((2, 3))
    got = run(obj.generalized_jsd, x, y, m, beta=beta, temperature=2.5)
    ps, pt = softmax_np(np.asarray(x, np.float64) / 2.5), softmax_np(np.asarray(y) / 2.5)
    np.testing.assert_allclose(got, jsd_np(ps, pt, beta), rtol=1e-4, atol=1e-6)
    plain = obj.generalized_jsd(x / 2.5, y / 2.5, m, beta=beta)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-7)


def test_traced_beta_matches_python_beta_including_endpoints():
    f = jax.jit(lambda b: obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=b))
    for beta in (0.0, 0.4, 1.0):
        np.testing.assert_allclose(
            f(jnp.float32(beta)),
            obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=beta),
            rtol=1e-6,
        )


def test_bfloat16_logits_are_computed_in_float32():
    got = obj.generalized_jsd(
        S_LOGITS.astype(jnp.bfloat16), T_LOGITS.astype(jnp.bfloat16), MASK, beta=0.5
    )
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, jsd_np(P_S, P_T, 0.5), rtol=3e-2)


def _batch(seed=0, b=3, t=5, v=13):
    k = jax.random.split(jax.random.PRNGKey(seed), 2)
    s = jax.random.normal(k[0], (b, t, v)) * 2
    te = jax.random.normal(k[1], (b, t, v)) * 2
    lens = jnp.array([t, 3, 1])[:b]
    mask = (jnp.arange(t)[None, :] < lens[:, None]).astype(jnp.int32)
    return s, te, mask


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_masked_positions_are_zero_and_padding_changes_nothing(run, beta):
    s, te, mask = _batch()
    per = run(obj.generalized_jsd, s, te, mask, beta=beta)
    assert (np.asarray(per)[np.asarray(mask) == 0] == 0).all()
    loss, _ = run(obj.generalized_jsd_loss, s, te, mask, beta=beta)
    # garbage (NaN) logits at padded positions and an extra all-padding row
    bad = lambda x: jnp.where(mask[..., None] > 0, x, jnp.nan)  # noqa: E731
    pad = lambda x: jnp.concatenate([x, jnp.full((1,) + x.shape[1:], jnp.nan)], 0)  # noqa: E731
    mask2 = jnp.concatenate([mask, jnp.zeros_like(mask[:1])], 0)
    loss2, _ = run(obj.generalized_jsd_loss, pad(bad(s)), pad(bad(te)), mask2, beta=beta)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)
    # longer rows (extra padded columns) change nothing either
    s3, te3 = (jnp.pad(x, ((0, 0), (0, 4), (0, 0))) for x in (s, te))
    loss3, _ = run(obj.generalized_jsd_loss, s3, te3, jnp.pad(mask, ((0, 0), (0, 4))), beta=beta)
    assert float(loss3) == pytest.approx(float(loss), rel=1e-6)


def test_loss_is_masked_token_mean_and_parts_add_up(run):
    s, te, mask = _batch(seed=3)
    per = np.asarray(obj.generalized_jsd(s, te, mask, beta=0.5))
    m = np.asarray(mask)
    loss, metrics = run(obj.generalized_jsd_loss, s, te, mask, beta=0.5)
    assert float(loss) == pytest.approx(float((per * m).sum() / m.sum()), rel=1e-6)
    assert float(metrics["jsd"]) == pytest.approx(float(loss), rel=1e-6)
    assert float(metrics["jsd_max"]) == pytest.approx(float(per.max()), rel=1e-6)
    assert 0.0 <= float(metrics["teacher_student_top1_agree"]) <= 1.0
    # two micro-batches of rows accumulate to the global token mean
    n1, d1, _ = obj.generalized_jsd_loss_parts(s[:1], te[:1], mask[:1], beta=0.5)
    n2, d2, _ = obj.generalized_jsd_loss_parts(s[1:], te[1:], mask[1:], beta=0.5)
    assert float((n1 + n2) / (d1 + d2)) == pytest.approx(float(loss), rel=1e-6)
    empty, _ = obj.generalized_jsd_loss(s, te, jnp.zeros_like(mask), beta=0.5)
    assert float(empty) == 0.0


def test_top1_agreement_metric_by_hand():
    _, metrics = obj.generalized_jsd_loss(S_LOGITS, T_LOGITS, MASK, beta=0.5)
    # position 0: argmax 0 vs 0 (agree); position 1: argmax 2 vs 1 (disagree)
    assert float(metrics["teacher_student_top1_agree"]) == 0.5


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_gradients_finite_with_minus_inf_logits(beta):
    # A padded vocabulary: the last two entries are -inf for both models, a third is -1e9.
    s, te, mask = _batch(seed=5)
    neg = jnp.array([0.0] * 10 + [-1e9, -jnp.inf, -jnp.inf])
    s, te = s + neg, te + neg

    def f(x):
        return obj.generalized_jsd_loss(x, te, mask, beta=beta)[0]

    loss, g = jax.value_and_grad(f)(s)
    assert np.isfinite(float(loss))
    assert np.isfinite(np.asarray(g)).all()
    assert np.abs(np.asarray(g)).sum() > 0
    np.testing.assert_array_equal(np.asarray(g)[..., -3:], 0.0)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_gradient_matches_finite_differences(beta):
    s, te, mask = _batch(seed=7)
    f = jax.jit(lambda x: obj.generalized_jsd_loss(x, te, mask, beta=beta)[0])
    g = jax.grad(f)(s)
    v = jax.random.normal(jax.random.PRNGKey(9), s.shape)
    h = 1e-2
    fd = (float(f(s + h * v)) - float(f(s - h * v))) / (2 * h)
    assert float(jnp.sum(g * v)) == pytest.approx(fd, rel=2e-2, abs=1e-4)
    # zero gradient at the optimum (student == teacher) for every β
    g0 = jax.grad(lambda x: obj.generalized_jsd_loss(x, te, mask, beta=beta)[0])(te)
    np.testing.assert_allclose(g0, 0.0, atol=1e-6)


def test_jsd_rejects_bad_hyperparameters_and_shapes():
    with pytest.raises(ConfigError, match="beta=1.5"):
        obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=1.5)
    with pytest.raises(ConfigError, match="temperature=0"):
        obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=0.5, temperature=0)
    with pytest.raises(AssertionError):
        obj.generalized_jsd(S_LOGITS, T_LOGITS[..., :2], MASK, beta=0.5)
    with pytest.raises(AssertionError):
        obj.generalized_jsd(S_LOGITS, T_LOGITS, jnp.ones((1, 3)), beta=0.5)


# ---- sampled-token advantages ----------------------------------------------------------


def test_reverse_kl_advantages_hand_values(run):
    s = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    t = jnp.array([[-1.5, -1.0, -0.5, 0.0]])
    m = jnp.array([[1, 1, 1, 0]])
    got = run(obj.reverse_kl_advantages, s, t, m)
    np.testing.assert_allclose(got, [[-0.5, 1.0, 0.0, 0.0]], atol=1e-7)
    assert got.dtype == jnp.float32


def test_reverse_kl_advantages_discounted_by_hand(run):
    s = jnp.array([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    t = jnp.array([[-1.5, -1.0, 0.0, 0.0, -2.0]])
    m = jnp.array([[1, 1, 0, 1, 1]])  # a hole: position 2 neither counts nor steps
    r = [-0.5, 1.0, 0.0, 3.0, -1.0]
    g = 0.5
    a4 = r[4]
    a3 = r[3] + g * a4
    a1 = r[1] + g * a3
    a0 = r[0] + g * a1
    got = run(obj.reverse_kl_advantages, s, t, m, gamma=g)
    np.testing.assert_allclose(got, [[a0, a1, 0.0, a3, a4]], rtol=1e-6)
    full = run(obj.reverse_kl_advantages, s, t, m, gamma=1.0)
    np.testing.assert_allclose(full[0, 0], sum(r), rtol=1e-6)


def test_sampled_estimate_expectation_is_reverse_kl_exactly():
    # Enumerate y over the vocabulary with weights π_S(y): E[−A] = KL(π_S‖π_T), which is
    # generalized_jsd at β = 1 on the same logits.
    ls = jax.nn.log_softmax(S_LOGITS, -1)  # [1, 2, 3]
    lt = jax.nn.log_softmax(T_LOGITS, -1)
    v = ls.shape[-1]
    # one row per vocabulary entry: every (position, y) pair as a sampled token
    s_rows = jnp.moveaxis(ls[0], -1, 0)  # [V, 2]
    t_rows = jnp.moveaxis(lt[0], -1, 0)
    adv = obj.reverse_kl_advantages(s_rows, t_rows, jnp.ones((v, 2)))
    expect = -jnp.sum(jnp.exp(s_rows) * adv, axis=0)  # [2]
    rev = obj.generalized_jsd(S_LOGITS, T_LOGITS, MASK, beta=1.0)[0]
    np.testing.assert_allclose(expect, rev, rtol=1e-5)
    np.testing.assert_allclose(expect, kl(P_S, P_T)[0], rtol=1e-5)


def test_sampled_estimate_monte_carlo_mean_approaches_reverse_kl():
    ls = jax.nn.log_softmax(S_LOGITS[0, 0])
    lt = jax.nn.log_softmax(T_LOGITS[0, 0])
    y = jax.random.categorical(jax.random.PRNGKey(0), ls, shape=(1, 20000))
    adv = obj.reverse_kl_advantages(ls[y], lt[y], jnp.ones_like(y))
    rev = float(kl(P_S[0, 0], P_T[0, 0]))
    assert float(-adv.mean()) == pytest.approx(rev, abs=0.01)


def test_teacher_equal_to_student_gives_zero_advantages(run):
    s = -jax.random.uniform(jax.random.PRNGKey(0), (3, 6), minval=0.1, maxval=3.0)
    got = run(obj.reverse_kl_advantages, s, s, jnp.ones((3, 6)), gamma=0.9)
    np.testing.assert_array_equal(got, 0.0)


def test_reverse_kl_advantages_padding_invariance_and_checks():
    s = jnp.array([[-1.0, -2.0, -0.5]])
    t = jnp.array([[-0.5, -1.0, -1.5]])
    m = jnp.array([[1, 1, 1]])
    a = obj.reverse_kl_advantages(s, t, m, gamma=0.7)
    s2 = jnp.array([[-1.0, -jnp.inf, -2.0, -0.5, jnp.nan]])
    t2 = jnp.array([[-0.5, -jnp.inf, -1.0, -1.5, 0.0]])
    m2 = jnp.array([[1, 0, 1, 1, 0]])
    b = obj.reverse_kl_advantages(s2, t2, m2, gamma=0.7)
    np.testing.assert_allclose(b[0, [0, 2, 3]], a[0], rtol=1e-6)
    np.testing.assert_array_equal(b[0, [1, 4]], 0.0)
    with pytest.raises(ConfigError, match="gamma=1.5"):
        obj.reverse_kl_advantages(s, t, m, gamma=1.5)
    with pytest.raises(AssertionError):
        obj.reverse_kl_advantages(s, t[:, :2], m)


def test_advantages_drive_policy_loss_toward_teacher():
    # One policy-gradient step with these advantages lowers the exact reverse KL.
    te = T_LOGITS[0, 0]
    lt = jax.nn.log_softmax(te)

    def rev(x):
        return obj.generalized_jsd(x[None, None], te[None, None], jnp.ones((1, 1)), beta=1.0)[0, 0]

    def pg(x):
        # expectation over the vocabulary of the policy-gradient surrogate at ratio 1
        ls = jax.nn.log_softmax(x)
        adv = obj.reverse_kl_advantages(
            jax.lax.stop_gradient(ls)[None], lt[None], jnp.ones((1, 3))
        )[0]
        w = jax.lax.stop_gradient(jnp.exp(ls))
        return -jnp.sum(w * adv * ls)

    x = S_LOGITS[0, 0]
    g_pg, g_rev = jax.grad(pg)(x), jax.grad(rev)(x)
    np.testing.assert_allclose(g_pg, g_rev, rtol=1e-5, atol=1e-6)
    assert float(rev(x - 0.5 * g_pg)) < float(rev(x))

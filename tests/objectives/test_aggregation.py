import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError

L = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 6.0, 0.0, 0.0]])
M = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
EXPECTED = {
    "token_mean": 21.0 / 6.0,
    "seq_mean_token_mean": (2.0 + 4.0 + 5.5) / 3.0,
    "seq_mean_token_sum": (6.0 + 4.0 + 11.0) / 3.0,
    "seq_mean_token_sum_norm": 21.0 / (3 * 4),
}
MODES = list(EXPECTED)


@pytest.mark.parametrize("mode", MODES)
def test_hand_values(run, mode):
    got = run(obj.aggregate, L, M, mode=mode, max_len=4)
    assert float(got) == pytest.approx(EXPECTED[mode], rel=1e-6)
    num, den = obj.aggregate_parts(L, M, mode=mode, max_len=4)
    assert float(num / den) == pytest.approx(EXPECTED[mode], rel=1e-6)
    assert float(den) == float(obj.aggregation_denominator(M, mode=mode, max_len=4))


@pytest.mark.parametrize("mode", MODES)
def test_padding_rows_and_nan_padding_change_nothing(mode):
    pad_l = jnp.concatenate([jnp.where(M > 0, L, jnp.nan), jnp.full((1, 4), jnp.inf)], 0)
    pad_l = jnp.concatenate([pad_l, jnp.full((4, 2), jnp.nan)], 1)  # extra time padding
    pad_m = jnp.concatenate([M, jnp.zeros((1, 4), M.dtype)], 0)
    pad_m = jnp.concatenate([pad_m, jnp.zeros((4, 2), M.dtype)], 1)
    got = obj.aggregate(pad_l, pad_m, mode=mode, max_len=4)
    assert float(got) == pytest.approx(EXPECTED[mode], rel=1e-6)
    g = jax.grad(lambda x: obj.aggregate(x, pad_m, mode=mode, max_len=4))(pad_l)
    assert np.isfinite(np.asarray(g)).all()
    assert (np.asarray(g)[np.asarray(pad_m) == 0] == 0).all()


@pytest.mark.parametrize("mode", MODES)
def test_microbatch_parts_sum_to_global_value(mode):
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (7, 5))
    m = (jax.random.uniform(jax.random.PRNGKey(1), (7, 5)) > 0.4).astype(jnp.int32)
    m = m.at[3].set(0)  # a row with no valid token
    whole = obj.aggregate(x, m, mode=mode, max_len=5)
    splits = [(0, 2), (2, 3), (3, 7)]
    parts = [obj.aggregate_parts(x[a:b], m[a:b], mode=mode, max_len=5) for a, b in splits]
    total = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    assert float(total) == pytest.approx(float(whole), rel=1e-5)
    # the mean of micro-batch means is NOT the global value for token_mean (sanity of the test)
    if mode == "token_mean":
        naive = np.mean([float(obj.aggregate(x[a:b], m[a:b], mode=mode)) for a, b in splits])
        assert naive != pytest.approx(float(whole), rel=1e-3)


def test_empty_mask_is_zero_not_nan():
    for mode in MODES:
        assert float(obj.aggregate(L, jnp.zeros_like(M), mode=mode, max_len=4)) == 0.0


def test_errors():
    with pytest.raises(ConfigError, match="max_len"):
        obj.aggregate(L, M, mode="seq_mean_token_sum_norm")
    with pytest.raises(ConfigError, match="token_mean"):
        obj.aggregate(L, M, mode="mean")


def test_enum_and_vmap():
    a = obj.aggregate(L, M, mode=obj.AggregationMode.SEQ_MEAN_TOKEN_MEAN)
    stacked = jax.vmap(lambda l, m: obj.aggregate(l, m, mode="seq_mean_token_mean"))(
        jnp.stack([L, 2 * L]), jnp.stack([M, M])
    )
    np.testing.assert_allclose(stacked, [float(a), 2 * float(a)], rtol=1e-6)


@pytest.mark.parametrize(
    "mode, ours, verl",
    [
        ("seq_mean_token_mean", 11.5 / 3, 11.5 / 4),
        ("seq_mean_token_sum", 21.0 / 3, 21.0 / 4),
        ("seq_mean_token_sum_norm", 21.0 / 12, 21.0 / 16),
        ("token_mean", 3.5, 3.5),
    ],
)
def test_empty_row_conventions(mode, ours, verl):
    l4 = jnp.concatenate([L, jnp.ones((1, 4))], 0)
    m4 = jnp.concatenate([M, jnp.zeros((1, 4), M.dtype)], 0)
    assert float(obj.aggregate(l4, m4, mode=mode, max_len=4)) == pytest.approx(ours)
    got = obj.aggregate(l4, m4, mode=mode, max_len=4, count_empty_rows=True)
    assert float(got) == pytest.approx(verl)

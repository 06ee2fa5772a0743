import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import objectives as obj
from jaxrl_llm.errors import ConfigError


def _grad(f):
    """Jitted gradient (op-by-op eager differentiation is slow on CPU)."""
    return jax.jit(jax.grad(f))


V = jnp.array([[1.0, 2.0, 2.0, 7.0]])
OLD = jnp.array([[1.5, 1.5, 1.9, 0.0]])
RET = jnp.array([[0.0, 3.0, 0.0, 0.0]])
M = jnp.array([[1, 1, 1, 0]])


def test_unclipped_hand_value(run):
    loss, met = run(obj.value_loss, V, OLD, RET, M)
    assert float(loss) == pytest.approx(0.5 * (1.0 + 1.0 + 4.0) / 3)
    assert float(met["vf_clipfrac"]) == 0.0


def test_clipped_hand_value_ppo2(run):
    # token 0: V_clip = 1.3 -> (1.3)² = 1.69 > 1;  token 1: V_clip = 1.7 -> 1.69 > 1;
    # token 2: V within clip of V_old -> 4.
    loss, met = run(obj.value_loss, V, OLD, RET, M, clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.69 + 4.0) / 3, rel=1e-5)
    assert float(met["vf_clipfrac"]) == pytest.approx(2 / 3)
    g = _grad(lambda v: obj.value_loss(v, OLD, RET, M, clip=0.2)[0])(V)
    # the clipped branch is flat in V for tokens 0 and 1; token 2: (V − R)/3
    np.testing.assert_allclose(g, [[0.0, 0.0, 2.0 / 3, 0.0]], atol=1e-6)


def test_padding_and_errors():
    v2 = jnp.concatenate([V, jnp.full((1, 4), jnp.nan)], 0)
    m2 = jnp.concatenate([M, jnp.zeros((1, 4), M.dtype)], 0)
    pad = lambda x: jnp.concatenate([x, jnp.full((1, 4), jnp.inf)], 0)  # noqa: E731
    loss, _ = obj.value_loss(v2, pad(OLD), pad(RET), m2, clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.69 + 4.0) / 3, rel=1e-5)
    g = _grad(lambda v: obj.value_loss(v, pad(OLD), pad(RET), m2, clip=0.2)[0])(v2)
    assert np.isfinite(np.asarray(g)).all()
    with pytest.raises(ConfigError, match="clip"):
        obj.value_loss(V, OLD, RET, M, clip=-1.0)


def test_parts():
    num, den, _ = obj.value_loss_parts(V, OLD, RET, M, aggregation="seq_mean_token_sum")
    assert float(num) == pytest.approx(3.0)
    assert float(den) == 1.0

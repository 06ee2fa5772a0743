import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm.train import measure_matmul_flops, mfu, timed_step


def test_mfu_hand_computed():
    # 6 · 1e6 params · 1000 tokens = 6e9 FLOPs in 2 s = 3e9 FLOP/s; of a 1e10 peak = 30 %
    assert mfu(num_params=1_000_000, tokens=1000, seconds=2.0, peak_flops=1e10) == pytest.approx(
        0.3
    )
    with pytest.raises(ValueError):
        mfu(num_params=1, tokens=1, seconds=0.0, peak_flops=1.0)


def test_measured_matmul_rate_and_timed_step():
    peak = measure_matmul_flops(n=64, repeats=2)
    assert peak > 1e6  # any real device does > 1 MFLOP/s

    @jax.jit
    def step(state, batch, frozen):
        del frozen
        return state + 1, {"loss": jnp.sum(batch["x"]), "tokens": jnp.float32(batch["x"].size)}

    state, m = timed_step(
        step, jnp.zeros(()), {"x": jnp.ones((4, 5))}, num_params=10, peak_flops=peak
    )
    assert float(state) == 1.0 and m["loss"] == 20.0 and m["tokens"] == 20.0
    assert m["step_time_s"] > 0
    assert m["tokens_per_s"] == pytest.approx(20.0 / m["step_time_s"])
    assert m["mfu"] == pytest.approx(6 * 10 * 20 / m["step_time_s"] / peak)

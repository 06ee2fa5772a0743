"""Rollout rows over the mesh's batch axes (jaxrl_llm/sampling/rows.py, issue 30 item 1).

On 8 forced CPU devices (tests/conftest.py): the static engine splits its prompts, decode
state and KV cache by rows over ``data`` × ``fsdp``; the same seed gives the same tokens on
every layout; a prompt count the split does not divide is padded and trimmed; the compiled
decode loop of a data-parallel layout moves nothing between devices but the loop's
"all rows done?" flag.
"""

import collections
import re
import sys

import jax
import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig, init_params, param_logical_axes
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh
from jaxrl_llm.sampling import SamplingConfig, generate
from jaxrl_llm.sampling.rows import pad_rows, replica_axes, row_split

CONFIG = ModelConfig.tiny(eos_token_ids=(96,), pad_token_id=0)
SAMPLED = SamplingConfig(temperature=0.8, top_k=40)
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 30, 8, 1], [60], [7, 7, 7, 7, 7]] * 2

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced) devices")


@pytest.fixture(scope="module")
def params():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)


def _on(params, devices=None, **axes):
    """``params`` laid out on a mesh of ``axes`` (over the first ``devices`` devices)."""
    mesh = make_mesh(**axes, devices=None if devices is None else jax.devices()[:devices])
    shardings = logical_to_sharding(param_logical_axes(CONFIG), mesh, DEFAULT_RULES, shapes=params)
    return jax.device_put(params, shardings), mesh


def _rows_per_device(x) -> set[int]:
    return {s.data.shape[0] for s in x.addressable_shards}


def test_split_and_padding_sizes():
    assert row_split(None) == 1 and replica_axes(None) == ()
    assert pad_rows(8, 8) == 0 and pad_rows(6, 4) == 2 and pad_rows(1, 8) == 7


@needs_8
@pytest.mark.parametrize(
    "axes", [dict(data=8), dict(data=2, fsdp=4), dict(data=4, tensor=2)], ids=str
)
def test_same_seed_same_tokens_on_every_layout(params, axes):
    one = generate(
        params, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=4, seed=3, max_new_tokens=12
    )
    placed, mesh = _on(params, **axes)
    split = row_split(mesh)
    assert split == axes.get("data", 1) * axes.get("fsdp", 1)
    out = generate(
        placed,
        CONFIG,
        PROMPTS,
        sampling=SAMPLED,
        num_samples=4,
        seed=3,
        max_new_tokens=12,
        mesh=mesh,
    )
    # every device holds its own N / split rows (/ tensor: each samples its share of a
    # replica's rows), not all N
    t = axes.get("tensor", 1)
    assert _rows_per_device(out.tokens) == {len(PROMPTS) * 4 // split // t}
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(one.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)
    assert (np.asarray(one.mask).sum() > 100) and not np.array_equal(one.tokens[0], one.tokens[1])


@needs_8
def test_prompts_the_split_does_not_divide_are_padded_and_trimmed(params):
    prompts = PROMPTS[:3]
    one = generate(
        params,
        CONFIG,
        prompts,
        sampling=SAMPLED,
        num_samples=2,
        seed=5,
        max_new_tokens=8,
        prompt_ids=[10, 11, 12],
    )
    placed, mesh = _on(params, data=8)
    out = generate(
        placed,
        CONFIG,
        prompts,
        mesh=mesh,
        sampling=SAMPLED,
        num_samples=2,
        seed=5,
        max_new_tokens=8,
        prompt_ids=[10, 11, 12],
    )
    assert out.tokens.shape == one.tokens.shape == (6, 8)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(out.prompt_ids), [10, 10, 11, 11, 12, 12])


@needs_8
def test_data_parallel_decode_loop_moves_only_the_done_flag(params):
    """The compiled decode loop on ``data=8``: no all-gather (rows stay put; weights are
    replicated), one all-reduce (``all(done)`` in the loop's condition)."""
    decode_mod = sys.modules["jaxrl_llm.sampling.decode"]
    placed, mesh = _on(params, data=8)
    seen = []
    real = decode_mod._decode

    def spy(*args, **kwargs):
        seen.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    decode_mod._decode = spy
    try:
        generate(
            placed,
            CONFIG,
            PROMPTS,
            sampling=SAMPLED,
            num_samples=2,
            seed=1,
            max_new_tokens=8,
            mesh=mesh,
        )
    finally:
        decode_mod._decode = real
    (hlo,) = seen
    ops = collections.Counter(
        re.findall(r"= \S+ (all-reduce|all-gather|all-to-all|collective-permute)\(", hlo)
    )
    assert ops == {"all-reduce": 1}, ops

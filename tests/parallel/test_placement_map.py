"""The placement map and the sampler's copy (jaxrl_llm/parallel/placement.py, issue 39).

On 8 forced CPU devices: the plan resolves one layout per role; the sampler's copy of an
FSDP learner's weights is made by one jitted reshard into ``data`` replicas × ``tensor``, and
the decode loop that reads it holds no all-gather of weights; the same seed gives the same
tokens from every learner layout and every sampler layout.
"""

import collections
import re
import sys

import jax
import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, init_params, param_logical_axes
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh
from jaxrl_llm.parallel.decode_model import Chip, choose_sampler_tensor, tensor_candidates
from jaxrl_llm.parallel.placement import plan_placement, resolve_sampler
from jaxrl_llm.parallel.sampler_copy import SamplerCopy
from jaxrl_llm.sampling import SamplingConfig, generate, generate_paged

# heads and KV heads that split over tensor=2 (the KV cache by KV heads), a vocabulary too
CONFIG = ModelConfig.tiny(
    num_heads=4, num_kv_heads=2, vocab_size=96, eos_token_ids=(90,), pad_token_id=0
)
SAMPLED = SamplingConfig(temperature=0.8, top_k=40)
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 30, 8, 1], [60], [7, 7, 7, 7, 7]] * 2
KW = dict(sampling=SAMPLED, num_samples=4, seed=3, max_new_tokens=12)

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced) devices")


@pytest.fixture(scope="module")
def params():
    p = init_params(CONFIG, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)


def _learner(params, devices=None, **axes):
    mesh = make_mesh(**axes, devices=devices)
    shardings = logical_to_sharding(param_logical_axes(CONFIG), mesh, DEFAULT_RULES, shapes=params)
    return jax.device_put(params, shardings)


def _collectives(hlo: str) -> collections.Counter:
    return collections.Counter(
        re.findall(r"= \S+ (all-reduce|all-gather|all-to-all|collective-permute)\(", hlo)
    )


def _gathered_shapes(hlo: str) -> set[tuple[int, ...]]:
    """The result shapes of the program's all-gathers."""
    found = re.findall(r"= \w+\[([\d,]*)\]\S* all-gather\(", hlo)
    return {tuple(int(d) for d in dims.split(",") if d) for dims in found}


def test_plan_places_every_role():
    p = plan_placement({"fsdp": 8}, num_devices=8, tensor=2, dtype="bfloat16")
    assert set(p.roles) == {"learner", "sampler", "reference", "teacher", "critic"}
    assert p.learner.sizes == {"fsdp": 8} and p.learner.count == 8
    assert p["reference"].sizes == p.learner.sizes and p.colocated
    s = p.sampler
    assert (s.replicas, s.tensor, s.first, s.count, s.dtype) == (4, 2, 0, 8, "bfloat16")
    # separate devices: the last 4 sample, the learner has the first 4
    split = plan_placement({"data": 4}, num_devices=8, rollout_devices=4, tensor=2)
    assert (split.sampler.first, split.sampler.count, split.learner.count) == (4, 4, 4)
    assert not split.colocated
    # two processes: tensor within a process, the sizes one process's
    two = plan_placement({"fsdp": 8}, num_devices=8, processes=2, tensor=4)
    assert two.sampler.per_process and two.sampler.sizes["data"] == 1
    assert not two.sampler.spans_processes
    # a degree that is a multiple of a process's devices: one program over both processes
    both = plan_placement({"fsdp": 8}, num_devices=8, processes=2, tensor=8)
    assert both.sampler.spans_processes and both.sampler.tensor == 8
    assert "over 2 processes" in both.sampler.describe()
    # the learner's own arrays: the same sizes, devices and dtype (no copy, none counted)
    assert plan_placement({"data": 8}, num_devices=8, tensor=1).sampler_reads_learner
    assert not plan_placement(
        {"data": 8}, num_devices=8, tensor=1, dtype="bfloat16"
    ).sampler_reads_learner
    assert not p.sampler_reads_learner and not split.sampler_reads_learner
    with pytest.raises(ConfigError, match=r"must divide the sampler's devices per process \(4\)"):
        plan_placement({"fsdp": 8}, num_devices=8, processes=2, tensor=3)


def test_auto_tensor_follows_the_decode_model():
    """An 8B-sized model on a v5p-like chip: weights dominate the bytes a decode step reads,
    so the largest degree within a host wins; a 135M model on the same chip: the per-layer
    all-reduces cost more than the weights saved, so tensor=1."""
    chip = Chip("v5p-like", 95e9, 2765e9, 1200e9)
    big = dict(devices=4, weight_bytes=16e9, kv_bytes_per_row=0.13e9, rows=32, layers=32)
    t, why, costs = choose_sampler_tensor([1, 2, 4], chip, hidden=4096, **big)
    assert t == 4 and "tensor=4" in why
    assert [c.step_s for c in costs] == sorted((c.step_s for c in costs), reverse=True)
    small = dict(devices=4, weight_bytes=0.27e9, kv_bytes_per_row=1e6, rows=32, layers=30)
    assert choose_sampler_tensor([1, 2, 4], chip, hidden=576, **small)[0] == 1
    # a model that does not fit whole: the smallest degree that fits
    tight = Chip("small-hbm", 6e9, 819e9, 400e9)
    assert choose_sampler_tensor([1, 2, 4], tight, hidden=4096, **big)[0] == 4
    assert choose_sampler_tensor([1, 2], None, hidden=1, **small)[0] == 1  # CPU: no model
    assert tensor_candidates(8, heads=32, kv_heads=8) == [1, 2, 4, 8]
    assert tensor_candidates(4, heads=3, kv_heads=1) == [1]


def test_auto_placement_resolves_with_the_model():
    auto = plan_placement({"fsdp": 8}, num_devices=8, tensor="auto", dtype="bfloat16")
    assert auto.tensor_auto
    big = ModelConfig.tiny(
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
    )
    chip = Chip("v5p-like", 95e9, 2765e9, 1200e9)
    out = resolve_sampler(auto, big, rows=64, tokens=1024, chip=chip)
    assert not out.tensor_auto and out.sampler.tensor == 8 and "auto" in out.why
    assert resolve_sampler(auto, big, rows=64, tokens=1024, chip=None).sampler.tensor == 1
    # two hosts of 4: within a host unless the chips' links span the hosts (a TPU slice)
    hosts = plan_placement({"fsdp": 8}, num_devices=8, processes=2, tensor="auto")
    assert resolve_sampler(hosts, big, rows=64, tokens=1024, chip=chip).sampler.tensor == 4
    slice_ = plan_placement(
        {"fsdp": 8}, num_devices=8, processes=2, tensor="auto", cross_process=True
    )
    spans = resolve_sampler(slice_, big, rows=64, tokens=1024, chip=chip).sampler
    assert spans.tensor == 8 and spans.spans_processes


@needs_8
@pytest.mark.parametrize(
    "learner,sampler",
    [
        (dict(fsdp=8), dict(tensor=1)),
        (dict(fsdp=8), dict(tensor=2)),
        (dict(data=2, fsdp=4), dict(tensor=2)),
        (dict(data=4), dict(tensor=2, rollout_devices=4)),
    ],
    ids=str,
)
def test_same_tokens_from_every_layout(params, learner, sampler):
    """One device's tokens, from a learner on ``learner`` whose sampler's copy is laid out as
    ``sampler`` (colocated or on the last 4 devices)."""
    one = generate(params, CONFIG, PROMPTS, **KW)
    n_rollout = sampler.get("rollout_devices", 0)
    devices = jax.devices()[: 8 - n_rollout]
    placement = plan_placement(
        learner, num_devices=8, rollout_devices=n_rollout, tensor=sampler["tensor"]
    )
    copy = SamplerCopy(placement.sampler, param_logical_axes(CONFIG))
    weights = copy(_learner(params, devices=devices, **learner))
    assert {d for x in jax.tree.leaves(weights) for d in x.sharding.device_set} == set(
        placement.sampler.devices()
    )
    out = generate(weights, CONFIG, PROMPTS, mesh=copy.local_mesh, **KW)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)
    assert np.asarray(one.mask).sum() > 100


@needs_8
def test_fsdp_run_decodes_without_gathering_weights(params):
    """The decode loop of an fsdp=8 learner's sampler (4 replicas × tensor 2) gathers no
    weight, only a few rows' activations, tokens and flags (the copy holds whole
    tensor-parallel shards; rows stay on their replica, the logits come to the devices that
    sample their rows by an all-to-all). Decoding on the learner's layout, as before the
    copy, all-gathers weights in the loop: the test tells the two apart."""
    decode_mod = sys.modules["jaxrl_llm.sampling.decode"]
    learner_mesh = make_mesh(fsdp=8)
    on_learner = _learner(params, fsdp=8)
    placement = plan_placement({"fsdp": 8}, num_devices=8, tensor=2)
    copy = SamplerCopy(placement.sampler, param_logical_axes(CONFIG))
    seen = []
    real = decode_mod._decode

    def spy(*args, **kwargs):
        seen.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    decode_mod._decode = spy
    try:
        generate(copy(on_learner), CONFIG, PROMPTS, mesh=copy.local_mesh, **KW)
        generate(on_learner, CONFIG, PROMPTS, mesh=learner_mesh, **KW)
    finally:
        decode_mod._decode = real
    resharded, on_fsdp = seen
    weight_shapes = {tuple(x.shape) for x in jax.tree.leaves(params)}
    weight_shapes |= {s[1:] for s in weight_shapes}  # one layer's slice of a stacked weight
    weight_shapes |= {s[::-1] for s in weight_shapes if len(s) == 2}  # the tied unembedding
    gathered = _gathered_shapes(resharded)
    assert not gathered & weight_shapes, gathered
    assert all(s[0] <= 8 for s in gathered), gathered  # a replica's 8 rows at most
    assert _collectives(resharded)["all-reduce"] >= 2  # tensor parallel: the partial sums
    assert _gathered_shapes(on_fsdp) & weight_shapes, _gathered_shapes(on_fsdp)


@needs_8
def test_copy_reuses_its_buffers_and_is_skipped_when_the_layout_is_the_same(params):
    on_learner = _learner(params, fsdp=8)
    copy = SamplerCopy(
        plan_placement({"fsdp": 8}, num_devices=8, tensor=2).sampler, param_logical_axes(CONFIG)
    )
    first = copy(on_learner, reuse=True)
    ptrs = [x.addressable_shards[0].data.unsafe_buffer_pointer() for x in jax.tree.leaves(first)]
    second = copy(on_learner, reuse=True)
    again = [x.addressable_shards[0].data.unsafe_buffer_pointer() for x in jax.tree.leaves(second)]
    assert ptrs == again  # the donated copy's buffers took the new one
    assert copy.metrics()["rollout/weight_sync_bytes"] > 0
    # a data=8 learner already is a tensor=1 sampler: no copy, unless one is asked for
    same = SamplerCopy(
        plan_placement({"data": 8}, num_devices=8, tensor=1).sampler, param_logical_axes(CONFIG)
    )
    replicated = _learner(params, data=8)
    assert same(replicated) is replicated and same.metrics() == {}
    snap = same(replicated, copy=True)
    assert jax.tree.leaves(snap)[0] is not jax.tree.leaves(replicated)[0]


@needs_8
def test_paged_engine_reads_the_copy_with_the_same_tokens(params):
    placement = plan_placement({"fsdp": 4}, num_devices=4, tensor=2)
    devices = jax.devices()[:4]
    copy = SamplerCopy(placement.sampler, param_logical_axes(CONFIG), devices=devices)
    weights = copy(_learner(params, devices=devices, fsdp=4))
    one = generate_paged(params, CONFIG, PROMPTS, num_slots=8, **KW)
    out = generate_paged(weights, CONFIG, PROMPTS, num_slots=8, mesh=copy.local_mesh, **KW)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))

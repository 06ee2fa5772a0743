"""The paged engine's data-parallel replicas as one program (jaxrl_llm/sampling/engine.py,
slots.py: ``over_replicas``; issue 39 item 3).

On 8 forced CPU devices (tests/conftest.py): on a mesh of R batch positions every engine
program compiles once, not once per replica; the same seed draws the same tokens and
log-probs as one device, with partial rollouts (a weight swap mid-rollout), routing records
of a mixture of experts, multi-turn continuations (kept rows, :meth:`PagedEngine.extend`), a
hybrid stack's recurrent states (Qwen3.5) and a sampler mesh with fsdp > 1 (one replica per
(data, fsdp) position).
"""

import logging
import re

import jax
import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig, init_params, param_logical_axes
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh
from jaxrl_llm.sampling import PagedEngine, SamplingConfig, generate, generate_paged
from jaxrl_llm.sampling.rows import replica_axes

CONFIG = ModelConfig.tiny(eos_token_ids=(96,), pad_token_id=0)
SAMPLED = SamplingConfig(temperature=0.8, top_k=40)
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 30, 8, 1], [60], [7, 7, 7, 7, 7]] * 2

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced) devices")


def _scaled(config, seed=0):
    p = init_params(config, jax.random.PRNGKey(seed))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)


@pytest.fixture(scope="module")
def params():
    return _scaled(CONFIG)


# a hybrid stack (Qwen3.5: Gated DeltaNet and attention layers), each slot with its recurrent state
HYBRID = ModelConfig.tiny("qwen3_5_text", eos_token_ids=(96,), pad_token_id=0, delta_chunk_size=4)


@pytest.fixture(scope="module")
def hybrid_params():
    return _scaled(HYBRID)


def _on(params, config=CONFIG, **axes):
    """``params`` laid out on a mesh of ``axes`` over the first devices it needs."""
    n = int(np.prod(list(axes.values())))
    mesh = make_mesh(**axes, devices=jax.devices()[:n])
    shardings = logical_to_sharding(param_logical_axes(config), mesh, DEFAULT_RULES, shapes=params)
    return jax.device_put(params, shardings), mesh


@needs_8
def test_each_program_compiles_once_on_four_replicas(params, caplog):
    """data=4: one compile of each engine program (per-replica engines compiled each program
    once per replica: their executables were bound to each replica's devices)."""
    placed, mesh = _on(params, data=4)
    # every group admitted in the first round and one attention width: one shape per program
    kw = dict(sampling=SAMPLED, num_samples=2, seed=3, max_new_tokens=12, num_slots=16)
    jax.clear_caches()
    with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
        out = generate_paged(placed, CONFIG, PROMPTS, mesh=mesh, page_size=16, chunk_steps=16, **kw)
    compiled = re.findall(r"Finished XLA compilation of jit\((\w+)\) in", caplog.text)
    programs = ("decode_chunk", "prefill_prompts", "admit_rows", "store_prompts", "cow_copy")
    counts = {p: compiled.count(p) for p in programs}
    assert counts == dict.fromkeys(programs, 1), counts
    assert int(np.asarray(out.lengths).sum()) > len(PROMPTS) * 2  # it decoded


@needs_8
@pytest.mark.parametrize(
    "axes",
    # tensor alone, and replicas with tensor (replicas alone: the tests below)
    [dict(data=1, tensor=2), dict(data=4, tensor=2)],
    ids=str,
)
def test_same_tokens_as_one_device_on_every_layout(params, axes):
    kw = dict(sampling=SAMPLED, num_samples=4, seed=3, max_new_tokens=12, num_slots=8)
    kw |= dict(page_size=4, chunk_steps=3)  # refills and growing attention widths
    one = generate_paged(params, CONFIG, PROMPTS, **kw)
    placed, mesh = _on(params, **axes)
    eng_replicas = max(1, int(np.prod([mesh.shape[a] for a in replica_axes(mesh)])))
    assert eng_replicas == axes["data"]
    out = generate_paged(placed, CONFIG, PROMPTS, mesh=mesh, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(one.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)
    # and the static engine's tokens, as the paged engine promises
    static = generate(
        placed, CONFIG, PROMPTS, sampling=SAMPLED, num_samples=4, seed=3, max_new_tokens=12
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(static.tokens))


@needs_8
def test_replicas_without_work_leave_the_others_as_they_are(params):
    """Two prompts on four replicas: two replicas never get a row, and the rows are one
    device's."""
    kw = dict(sampling=SAMPLED, num_samples=2, seed=5, max_new_tokens=10, num_slots=4)
    kw |= dict(page_size=4, chunk_steps=3)
    one = generate_paged(params, CONFIG, PROMPTS[:2], **kw)
    placed, mesh = _on(params, data=4)
    out = generate_paged(placed, CONFIG, PROMPTS[:2], mesh=mesh, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)


@needs_8
def test_engine_state_is_split_over_replicas_and_weights_over_tensor(params):
    placed, mesh = _on(params, data=4, tensor=2)
    eng = PagedEngine(placed, CONFIG, num_slots=2, page_size=4, max_len=32, gen_len=8, mesh=mesh)
    assert eng.num_replicas == 4 and len(eng.replicas) == 4
    k = eng.state.cache.k  # [R, L, P, Z, K, E]
    assert k.shape[0] == 4 and {s.data.shape[0] for s in k.addressable_shards} == {1}
    assert {s.data.shape[0] for s in eng.state.tokens.addressable_shards} == {1}
    assert any("tensor" in str(x.sharding.spec) for x in jax.tree.leaves(eng.params))


@needs_8
def test_partial_rollout_swap_on_replicas_equals_one_device():
    config = ModelConfig.tiny(eos_token_ids=(), pad_token_id=0)
    a, b = _scaled(config, 0), _scaled(config, 1)
    sampling = SamplingConfig(temperature=0.7, use_model_eos=False)
    kw = dict(sampling=sampling, num_samples=2, seed=3, max_new_tokens=14, num_slots=8)
    kw |= dict(page_size=4, chunk_steps=4, return_versions=True)

    def refresh_after(first, second, calls=2):
        n = [0]

        def refresh():
            n[0] += 1
            return first if n[0] <= calls else second

        return refresh

    prompts = PROMPTS[:4]
    one, v_one = generate_paged(a, config, prompts, refresh=refresh_after((a, 0), (b, 1)), **kw)
    (pa, mesh), (pb, _) = _on(a, config, data=4), _on(b, config, data=4)
    out, v = generate_paged(
        pa, config, prompts, mesh=mesh, refresh=refresh_after((pa, 0), (pb, 1)), **kw
    )
    assert set(np.unique(v[np.asarray(out.mask) > 0])) == {0, 1}  # the swap came mid-rollout
    np.testing.assert_array_equal(v, v_one)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)


@needs_8
def test_moe_routing_records_on_replicas_equal_one_device():
    config = ModelConfig.tiny("qwen3_moe", eos_token_ids=(96,), pad_token_id=0)
    p = _scaled(config)
    kw = dict(sampling=SAMPLED, num_samples=2, seed=1, max_new_tokens=8, num_slots=4)
    kw |= dict(page_size=4, chunk_steps=3, record_routing=True)
    one = generate_paged(p, config, PROMPTS[:4], **kw)
    placed, mesh = _on(p, config, data=2, tensor=2)
    out = generate_paged(placed, config, PROMPTS[:4], mesh=mesh, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    assert out.routing is not None and one.routing is not None
    np.testing.assert_array_equal(np.asarray(out.routing), np.asarray(one.routing))


@needs_8
@pytest.mark.parametrize("family", ["llama", pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_multi_turn_rows_on_two_replicas_equal_one_device(params, hybrid_params, family):
    """Kept rows on different replicas, extended and decoded on: one device's rows (a hybrid
    stack's kept rows carry their recurrent state from their replica's slot to the extension
    and back into a slot)."""
    config, params = (CONFIG, params) if family == "llama" else (HYBRID, hybrid_params)
    greedy = SamplingConfig(greedy=True, temperature=0.7)
    placed, mesh = _on(params, config, data=2)
    kw = dict(sampling=greedy, seed=3, num_slots=2, page_size=4, max_len=48, gen_len=16)
    results = []
    for eng in (PagedEngine(params, config, **kw), PagedEngine(placed, config, mesh=mesh, **kw)):
        a, b = (eng.submit(PROMPTS[i], prompt_id=i, max_new_tokens=5, keep=True)[0] for i in (1, 3))
        eng.run()
        logits = eng.extend(b, [7, 8, 9], max_new_tokens=6)
        eng.extend(a, [10, 11], max_new_tokens=4)
        rows = eng.run()
        results.append((np.asarray(logits), rows[a], rows[b], eng))
    (l1, a1, b1, _), (l2, a2, b2, eng) = results
    assert eng.replica_of(0) != eng.replica_of(1)
    np.testing.assert_allclose(l2, l1, atol=2e-5)
    for x, y in ((a1, a2), (b1, b2)):
        assert x.tokens == y.tokens and x.mask == y.mask
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=2e-5)
    for r in (0, 1):
        eng.release(r)
    assert all(rep.book.alloc.num_free == rep.book.alloc.num_pages - 1 for rep in eng.replicas)


@needs_8
@pytest.mark.slow
@pytest.mark.parametrize("axes", [dict(data=2, tensor=2)], ids=str)  # replicas and tensor
def test_hybrid_model_on_replicas_equals_one_device(hybrid_params, axes):
    """Qwen3.5 (Gated DeltaNet + attention): each replica's slots keep their rows' recurrent
    states (conv windows, delta-rule states; stacked and split over the replicas like the
    page pool), refilled as rows finish: the same tokens and log-probs as one device."""
    kw = dict(sampling=SAMPLED, num_samples=2, seed=3, max_new_tokens=8, num_slots=4)
    kw |= dict(page_size=4, chunk_steps=3)  # refills into slots a row left its state in
    one = generate_paged(hybrid_params, HYBRID, PROMPTS, **kw)
    placed, mesh = _on(hybrid_params, HYBRID, **axes)
    eng = PagedEngine(placed, HYBRID, num_slots=4, page_size=4, max_len=32, gen_len=8, mesh=mesh)
    assert eng.num_replicas == axes["data"] and eng.state.conv is not None
    assert eng.state.conv.shape[0] == axes["data"]  # [R, L', S, W-1, C]
    assert {s.data.shape[0] for s in eng.state.state.addressable_shards} == {1}
    out = generate_paged(placed, HYBRID, PROMPTS, mesh=mesh, **kw)
    assert len(set(np.asarray(out.tokens)[:, 0].tolist())) > 1  # not one repeated token
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(one.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)


@needs_8
@pytest.mark.parametrize("axes", [dict(data=2, fsdp=2)], ids=str)  # both batch axes at once
def test_fsdp_mesh_runs_one_replica_per_batch_position(params, axes):
    """A sampler mesh with fsdp > 1 (the learner's layout, weights split over fsdp): fsdp is a
    batch axis, so every (data, fsdp) position is a replica; each program takes the weights
    whole (``over_replicas`` passes shared arguments unsplit) and the rows equal one
    device's."""
    kw = dict(sampling=SAMPLED, num_samples=2, seed=3, max_new_tokens=10, num_slots=4)
    kw |= dict(page_size=4, chunk_steps=3)
    one = generate_paged(params, CONFIG, PROMPTS, **kw)
    placed, mesh = _on(params, **axes)
    assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(placed))
    assert replica_axes(mesh) == tuple(a for a in ("data", "fsdp") if axes.get(a, 1) > 1)
    eng = PagedEngine(placed, CONFIG, num_slots=4, page_size=4, max_len=32, gen_len=10, mesh=mesh)
    assert eng.num_replicas == 4
    assert {s.data.shape[0] for s in eng.state.cache.k.addressable_shards} == {1}
    out = generate_paged(placed, CONFIG, PROMPTS, mesh=mesh, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(one.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(one.logprobs), atol=2e-5)


def _computations(hlo: str) -> dict[str, str]:
    """A compiled HLO module's computations by name (ENTRY's as 'ENTRY')."""
    out = {}
    for block in re.split(r"\n(?=%|ENTRY )", hlo):
        head = block.split(" ", 2)
        name = "ENTRY" if head[0] == "ENTRY" else head[0]
        out[name] = block
    return out


@needs_8
def test_fsdp_mesh_gathers_the_weights_once_per_chunk_outside_the_decode_loop(params, monkeypatch):
    """On data=2 x fsdp=2 each replica takes the weights whole: the decode chunk gathers every
    fsdp-split weight at its start, none inside its ``while`` loop (per token)."""
    import jaxrl_llm.sampling.engine as engine_module

    placed, mesh = _on(params, data=2, fsdp=2)
    real, seen = engine_module.decode_chunk, []

    def spy(*args, **kwargs):
        seen.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "decode_chunk", spy)
    eng = PagedEngine(
        placed, CONFIG, sampling=SAMPLED, num_slots=2, page_size=4, max_len=16, gen_len=4, mesh=mesh
    )
    for i in range(4):
        eng.submit(PROMPTS[i], prompt_id=i, max_new_tokens=4)
    eng.step()
    comps = _computations(seen[0])
    gathering = {n for n, text in comps.items() if re.search(r" all-gather\(", text)}
    assert gathering == {"ENTRY"}, gathering
    assert re.search(r" while\(", comps["ENTRY"])  # the decode loop, after the gathers

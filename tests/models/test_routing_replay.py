"""Rollout routing replay (R3; Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by
Aligning Training and Inference Routers", https://arxiv.org/abs/2510.11370) on tiny Qwen3-MoE
and Mixtral configs (2 layers, 8 experts, top-2): both engines record each token's experts,
and a forward given them routes every token to them (0 differing decisions) with the gate
weights recomputed from its own router, in each family's normalisation convention.

On CPU in float32 the sampler and the trainer compute the same router logits, so their
routing agrees with or without replay. To make them differ as a bfloat16 sampler or another
kernel would, the trainer here sees router weights perturbed by a small noise: its own top-k
then differs from the sampler's on some decisions; replay pins the routing to the sampler's
(0 differing decisions) and the sampler/trainer log-prob gap on the completions is not larger
than without replay (the experts are the sampler's, only their weights move).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.data import pack_rl_batch
from jaxrl_llm.losses import sequence_logps
from jaxrl_llm.parallel import DEFAULT_RULES, batch_sharding_tree, logical_to_sharding, make_mesh
from jaxrl_llm.sampling import generate, generate_paged

FAMILIES = ["qwen3_moe", "mixtral"]  # norm_topk_prob False / True
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]
NEW = 7


def _params(config, seed=0):
    return M.init_params(config, jax.random.PRNGKey(seed))


def _perturbed_router(params, scale, seed=1):
    """The params with the router kernel plus ``scale`` × its std of Gaussian noise."""
    kernel = params["layers"]["router"]["kernel"]
    noise = jax.random.normal(jax.random.PRNGKey(seed), kernel.shape, kernel.dtype)
    out = jax.tree.map(lambda x: x, params)
    out["layers"] = {
        **params["layers"],
        "router": {"kernel": kernel + scale * jnp.std(kernel) * noise},
    }
    return out


def _sample(engine, params, config):
    ro = engine(
        params, config, PROMPTS, num_samples=2, max_new_tokens=NEW, seed=3, record_routing=True
    )
    ids = jnp.concatenate([ro.prompt_tokens, ro.tokens], 1)
    attn = jnp.concatenate([ro.prompt_mask, ro.mask], 1)
    return ro, ids, attn


def _completion_logps(params, config, ids, attn, routing=None):
    """``[N, M]`` log π of the completion tokens (the sampler's ``Rollout.logprobs`` layout)."""
    out = M.apply(params, ids, config=config, attention_mask=attn, routing=routing)
    logits = M.logits_from_hidden(params, out.hidden, config)[:, :-1]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], -1)[..., 0]
    return logp[:, -NEW:], out


@pytest.mark.parametrize("family", FAMILIES)
def test_replaying_the_own_top_k_is_the_plain_forward(family):
    """The gate weights of replayed experts follow the family's convention: with its own
    top-k replayed, a forward gives the plain forward's hidden states and router loss
    (Qwen3-MoE: softmax probabilities over all experts, not renormalised; Mixtral:
    renormalised over the k, the softmax of their logits)."""
    config = M.ModelConfig.tiny(family)
    params = _params(config)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 97, (3, 11)), jnp.int32)
    hidden, _, experts = M.trunk_with_routing(params, ids, config=config)
    assert experts.shape == (3, 11, config.num_layers, 2)
    plain = M.apply(params, ids, config=config)
    replayed = M.apply(params, ids, config=config, routing=M.RecordedRouting(experts))
    np.testing.assert_allclose(replayed.hidden, plain.hidden, atol=1e-6, rtol=0)
    np.testing.assert_allclose(replayed.router_aux_loss, plain.router_aux_loss, rtol=1e-6)
    assert float(replayed.routing_mismatch) == 0.0 == float(replayed.routing_own_mismatch)
    assert plain.routing_mismatch is None  # nothing recorded, nothing compared


@pytest.mark.parametrize("norm", [False, True])
def test_route_weights_at_given_experts(norm):
    """``route(experts=e)``: p gathered at e (Qwen3-MoE's default), or p[e] / Σ p[e]
    (``norm_topk_prob``), by hand on one token."""
    config = M.ModelConfig.tiny("qwen3_moe", norm_topk_prob=norm)
    x = jnp.asarray([[1.0, -2.0] + [0.0] * 46], jnp.float32)
    router = jnp.zeros((48, 8)).at[0, 3].set(1.0).at[1, 5].set(-0.5)  # logits 1 at 3, 1 at 5
    probs, weights, experts = M.route(config, x, router, experts=jnp.asarray([[5, 0]]))
    z = np.zeros(8)
    z[3], z[5] = 1.0, 1.0
    p = np.exp(z) / np.exp(z).sum()
    want = np.array([p[5], p[0]])
    if norm:
        want = want / want.sum()
    np.testing.assert_allclose(weights[0], want, rtol=1e-6)
    assert experts.tolist() == [[5, 0]]
    np.testing.assert_allclose(probs[0], p, rtol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("engine", [generate, generate_paged], ids=["static", "paged"])
def test_replay_pins_the_trainers_routing_to_the_samplers(family, engine):
    config = M.ModelConfig.tiny(family)
    params = _params(config)
    ro, ids, attn = _sample(engine, params, config)
    n, t = ids.shape
    assert ro.routing.shape == (n, t, config.num_layers, 2) and ro.routing.dtype == jnp.int16
    real = np.asarray(attn, bool)
    # the sampler's record is the routing of the same weights' full forward on every real token
    _, _, own = M.trunk_with_routing(params, ids, config=config, attention_mask=attn)
    assert not np.asarray(M.differing_decisions(own, ro.routing.astype(jnp.int32)))[real].any()
    # same weights: the trainer's log-probs are the sampler's, replayed or not
    mask = np.asarray(ro.mask, bool)
    lp, out = _completion_logps(params, config, ids, attn, M.RecordedRouting(ro.routing))
    np.testing.assert_allclose(np.asarray(lp)[mask], np.asarray(ro.logprobs)[mask], atol=2e-5)
    assert float(out.routing_own_mismatch) == 0.0

    # a trainer whose router differs slightly from the sampler's
    moved = _perturbed_router(params, 0.3)
    lp_own, own_out = _completion_logps(
        moved, config, ids, attn, M.RecordedRouting(ro.routing, replay=False)
    )
    lp_rep, rep_out = _completion_logps(moved, config, ids, attn, M.RecordedRouting(ro.routing))
    differ = float(own_out.routing_mismatch)
    assert 0.0 < differ < 0.5  # its own top-k differs from the sampler's on some decisions
    assert float(own_out.routing_own_mismatch) == pytest.approx(differ)
    assert float(rep_out.routing_mismatch) == 0.0  # replay: every decision is the sampler's
    # what it would pick (layers past the first see replayed inputs, so not exactly `differ`)
    assert 0.0 < float(rep_out.routing_own_mismatch) < 0.5
    gap_own = np.abs(np.asarray(lp_own) - np.asarray(ro.logprobs))[mask].mean()
    gap_rep = np.abs(np.asarray(lp_rep) - np.asarray(ro.logprobs))[mask].mean()
    assert gap_own > 0 and gap_rep <= gap_own


def test_both_engines_record_the_same_routing():
    config = M.ModelConfig.tiny("qwen3_moe")
    params = _params(config)
    ro_s, _, attn = _sample(generate, params, config)
    ro_p, _, _ = _sample(generate_paged, params, config)
    np.testing.assert_array_equal(ro_p.tokens, ro_s.tokens)
    real = np.asarray(attn, bool)
    np.testing.assert_array_equal(np.asarray(ro_p.routing)[real], np.asarray(ro_s.routing)[real])


def test_replayed_routing_is_differentiable_through_the_router():
    """Under replay the experts are fixed but their weights are the router's probabilities:
    the router kernel gets a finite, nonzero gradient (every layer)."""
    config = M.ModelConfig.tiny("mixtral")
    params = _params(config)
    ro, ids, attn = _sample(generate, params, config)
    rec = M.RecordedRouting(ro.routing)
    moved = _perturbed_router(params, 0.3)

    def loss(p):
        lp, _ = _completion_logps(p, config, ids, attn, rec)
        return -jnp.sum(lp * ro.mask)

    g = jax.grad(loss)(moved)["layers"]["router"]["kernel"]
    assert np.all(np.isfinite(g)) and np.all(np.abs(np.asarray(g)).max(axis=(1, 2)) > 0)


def test_shared_prompt_and_packed_forwards_replay_the_same_routing():
    """The shared-prompt trunk (a group's prompt once) and a packed batch
    (``pack_rl_batch`` packs ``routing`` as the tokens) replay the sampler's routing as the
    padded forward does: 0 differing decisions, the same log-probs."""
    config = M.ModelConfig.tiny("qwen3_moe")
    params = _params(config)
    ro, ids, attn = _sample(generate, params, config)
    moved = _perturbed_router(params, 0.3)
    p = ro.prompt_tokens.shape[1]
    lmask = jnp.concatenate([jnp.zeros_like(ro.prompt_mask), ro.mask], 1)
    batch = {
        "input_ids": np.asarray(ids),
        "attention_mask": np.asarray(attn),
        "loss_mask": np.asarray(lmask),
        "routing": np.asarray(ro.routing, np.int32),
    }
    outs = []

    def apply_fn(prm, tokens, **kw):
        routing = jnp.asarray(kw.pop("routing_batch"))
        out = M.apply(prm, tokens, config=config, routing=M.RecordedRouting(routing), **kw)
        outs.append(out)
        return out

    padded = sequence_logps(
        moved,
        batch,
        apply_fn=lambda prm, t, **kw: apply_fn(prm, t, routing_batch=batch["routing"], **kw),
    )
    shared = sequence_logps(
        moved,
        batch,
        apply_fn=lambda prm, t, **kw: apply_fn(prm, t, routing_batch=batch["routing"], **kw),
        window=NEW,
        prompt_group_size=2,
    )
    packed_batch = pack_rl_batch(batch, window=NEW)
    assert packed_batch["routing"].shape[:2] == packed_batch["input_ids"].shape
    packed = sequence_logps(
        moved,
        packed_batch,
        apply_fn=lambda prm, t, **kw: apply_fn(prm, t, routing_batch=packed_batch["routing"], **kw),
    )
    assert all(float(o.routing_mismatch) == 0.0 for o in outs)
    own = [float(o.routing_own_mismatch) for o in outs]
    assert own[0] > 0 and own[1] == pytest.approx(own[0], abs=1e-6)
    assert own[2] == pytest.approx(own[0], abs=1e-6)
    m = np.asarray(lmask, bool)
    np.testing.assert_allclose(np.asarray(shared)[m], np.asarray(padded)[m], atol=2e-5)
    np.testing.assert_allclose(np.asarray(packed)[m[:, -NEW:]], np.asarray(padded)[m], atol=2e-5)
    assert p + NEW == ids.shape[1]


@pytest.mark.parametrize("mesh_kw", [dict(data=2, expert=4), dict(fsdp=2, expert=4)])
def test_replay_under_expert_parallelism_matches_one_device(mesh_kw):
    """The experts split over ``expert=4`` (8 forced CPU devices, tests/conftest.py): the
    replayed forward (``sparse_moe``'s ``shard_map`` path, the routing split with the tokens)
    routes as the sampler did and gives the single-device replayed forward, its mismatch
    fractions and its router gradient."""
    config = M.ModelConfig.tiny("qwen3_moe")
    params = _params(config)
    ro, ids, attn = _sample(generate, params, config)
    moved = _perturbed_router(params, 0.3)
    rows = ids.shape[0] - ids.shape[0] % 2
    ids, attn, routing = ids[:rows], attn[:rows], ro.routing[:rows]

    def run(prm, batch, mesh=None):
        def loss(p):
            out = M.apply(
                p,
                batch["ids"],
                config=config,
                attention_mask=batch["attn"],
                mesh=mesh,
                routing=M.RecordedRouting(batch["routing"]),
            )
            return jnp.sum(out.hidden**2), out

        (_, out), g = jax.value_and_grad(loss, has_aux=True)(prm)
        return out.hidden, out.routing_mismatch, out.routing_own_mismatch, g

    batch = {"ids": ids, "attn": attn, "routing": routing}
    h0, mis0, own0, g0 = jax.device_get(jax.jit(run)(moved, batch))
    assert float(mis0) == 0.0 and float(own0) > 0
    mesh = make_mesh(**mesh_kw)
    sharded = jax.device_put(
        moved, logical_to_sharding(M.param_logical_axes(config), mesh, shapes=moved)
    )
    sbatch = jax.device_put(batch, batch_sharding_tree(batch, mesh, DEFAULT_RULES))
    with jax.set_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(lambda p, b: run(p, b, mesh))(sharded, sbatch))
        h, mis, own, g = jax.device_get(jax.jit(lambda p, b: run(p, b, mesh))(sharded, sbatch))
    real = np.asarray(attn, bool)
    assert float(mis) == 0.0
    assert float(own) == pytest.approx(float(own0), abs=1e-6)
    np.testing.assert_allclose(h[real], h0[real], atol=1e-5, rtol=0)
    gr, gr0 = g["layers"]["router"]["kernel"], g0["layers"]["router"]["kernel"]
    np.testing.assert_allclose(gr, gr0, atol=1e-3 * float(np.abs(gr0).max()), rtol=0)


def test_dataclass_replay_flag_is_static():
    """``RecordedRouting.replay`` is static pytree metadata: jit retraces for each value and
    never sees it as an array."""
    rec = M.RecordedRouting(jnp.zeros((1, 2, 3, 2), jnp.int16), replay=False)
    leaves, treedef = jax.tree.flatten(rec)
    assert len(leaves) == 1 and jax.tree.unflatten(treedef, leaves).replay is False
    assert dataclasses.replace(rec, replay=True).replay is True


@pytest.mark.parametrize("engine", [generate, generate_paged], ids=["static", "paged"])
@pytest.mark.parametrize("axes", [dict(data=2), dict(data=2, expert=4)], ids=str)
def test_samplers_record_the_same_routing_on_a_mesh(engine, axes):
    """The weights on a mesh (8 forced CPU devices): the static engine splits its rows over
    ``data``, the paged engine runs one replica per ``data`` position, and with ``expert``
    the MoE blocks run expert-parallel inside the samplers; the recorded routing of every
    real token is the one-device record."""
    config = M.ModelConfig.tiny("qwen3_moe")
    params = _params(config)
    ro0, _, attn = _sample(engine, params, config)
    mesh = make_mesh(**axes, devices=jax.devices()[: int(np.prod(list(axes.values())))])
    placed = jax.device_put(
        params, logical_to_sharding(M.param_logical_axes(config), mesh, shapes=params)
    )
    ro, _, _ = _sample(engine, placed, config)
    np.testing.assert_array_equal(ro.tokens, ro0.tokens)
    real = np.asarray(attn, bool)
    np.testing.assert_array_equal(np.asarray(ro.routing)[real], np.asarray(ro0.routing)[real])

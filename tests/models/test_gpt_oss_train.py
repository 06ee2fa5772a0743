"""A tiny random gpt-oss trains: every parameter gets a finite gradient (the sinks, biases and
router included), one online GRPO step with either engine (the sampler's log-probs equal the
learner's in float32), GRPO with routing replay pinning the update to the sampler's experts
(0 differing decisions where its own router differs), and offline DPO steps that lower the DPO
loss."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.trainer import OnlineTrainer
from tests.models import family_steps

TINY = dict(family="gpt_oss")


def test_every_parameter_gets_a_gradient():
    config = models.ModelConfig.tiny(**TINY)
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 19), 3, 97)
    mask = jnp.ones((2, 19), bool).at[1, :4].set(False)

    def loss(p):
        out = models.apply(p, toks, config=config, attention_mask=mask)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    grads = jax.grad(loss)(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, jax.tree_util.keystr(path)


def test_sink_gradient_of_blockwise_attention_equals_the_naive_one():
    """The blockwise path's custom backward gives the sinks the naive path's gradient."""
    config = models.ModelConfig.tiny(**TINY)
    params = models.init_params(config, jax.random.PRNGKey(0))
    layers = dict(params["layers"])
    layers["sinks"] = {"logit": jax.random.normal(jax.random.PRNGKey(4), (4, 3))}
    params = {**params, "layers": layers}
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 19), 3, 97)
    mask = jnp.ones((2, 19), bool).at[1, :4].set(False)

    def grads(impl):
        c = models.ModelConfig.tiny(**TINY, attention=impl)

        def loss(p):
            out = models.apply(p, toks, config=c, attention_mask=mask)
            logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
            return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

        return jax.grad(loss)(params)["layers"]

    naive, blockwise = grads("naive"), grads("blockwise")
    assert float(jnp.abs(naive["sinks"]["logit"]).max()) > 1e-4
    for name in ("sinks", "q_proj", "k_proj"):
        for a, b in zip(jax.tree.leaves(naive[name]), jax.tree.leaves(blockwise[name])):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    family_steps.write_data(d)
    return d


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_grpo_step_and_sampler_logprobs_equal_the_learners(data, tmp_path, engine):
    _, config, before, after = family_steps.grpo_step(data, tmp_path / "grpo", TINY, engine)
    assert config.family == models.Family.GPT_OSS
    for module in ("sinks", "router", "experts_gate", "o_proj"):
        assert family_steps.moved(after, before, module) > 0, module


@pytest.mark.parametrize(
    "engine,mesh",
    [("static", {}), ("paged", {}), ("static", dict(data=2, expert=4))],
    ids=["static", "paged", "expert-mesh"],
)
def test_grpo_with_routing_replay_pins_the_update_to_the_samplers_experts(
    data, tmp_path, engine, mesh
):
    """The sampler routes with a perturbed router (kernel and bias kept); with routing replay
    the update routes every token as the sampler did (0 differing decisions) although its own
    router would differ; also with the experts (and their biases) split over ``expert``."""
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "r3"),
            max_steps=2,
            algorithm="grpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=TINY),
            optim=dict(name="sgd", lr=1e-2),
            data=dict(train=str(data / "prompts.jsonl"), max_length=32),
            rollout=dict(
                prompts_per_step=2,
                group_size=4,
                max_new_tokens=6,
                engine=engine,
                routing_replay=True,
            ),
            rewards=[dict(name="tests.models.family_steps:parity_reward")],
            logging=dict(tensorboard=False, plots=False),
            eval=dict(before=False),
            mesh=mesh,
        ),
    )
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    weights_fn = trainer.rollouts.weights_fn

    def perturbed():
        params, version = weights_fn()
        router = params["layers"]["router"]
        noise = jax.random.normal(jax.random.PRNGKey(7), router["kernel"].shape)
        kernel = router["kernel"] + 0.5 * jnp.std(router["kernel"]) * noise
        layers = {**params["layers"], "router": {**router, "kernel": kernel}}
        return {**params, "layers": layers}, version

    trainer.rollouts.weights_fn = perturbed
    try:
        metrics = [trainer.train_step(s) for s in (1, 2)]
    finally:
        trainer.close()
    for m in metrics:
        assert np.isfinite(m["loss"])
        assert m["routing/mismatch_frac"] == 0.0
        assert m["routing/own_topk_mismatch_frac"] > 0.0


def test_dpo_steps_lower_the_loss(data, tmp_path):
    # no load-balancing term, so that the first step's loss is DPO's log 2 alone
    config = family_steps.dpo_steps(data, tmp_path / "dpo", dict(TINY, router_aux_loss_coef=0.0))
    assert config.family == models.Family.GPT_OSS and config.attention_sinks


@pytest.mark.parametrize("mesh_axes", [dict(expert=4, tensor=2), dict(expert=8)])
@pytest.mark.parametrize("dispatch", ["sorted", "dense"])
def test_expert_parallel_block_with_biases_equals_one_device(mesh_axes, dispatch):
    """The MoE block with the router's and experts' biases, its experts split over ``expert``
    (and each expert's width over ``tensor``: the down bias is added once, not per shard),
    gives the single-device output (8 forced CPU devices, tests/conftest.py)."""
    from jaxrl_llm.models import moe
    from jaxrl_llm.parallel import make_mesh

    config = models.ModelConfig.tiny(**TINY, moe_dispatch=dispatch)
    params = models.init_params(config, jax.random.PRNGKey(0))
    keys = iter(jax.random.split(jax.random.PRNGKey(5), 16))
    lp = {
        name: {
            leaf: jax.random.normal(next(keys), w.shape[1:]) * (0.3 if leaf == "bias" else 0.2)
            for leaf, w in params["layers"][name].items()
        }
        for name in ("router", "experts_gate", "experts_up", "experts_down")
    }
    x = jax.random.normal(jax.random.PRNGKey(6), (4, 6, config.hidden_size))
    want, want_stats = moe.sparse_moe(config, x, None, lp)
    mesh = make_mesh(data=1, **mesh_axes)
    got, stats = jax.jit(lambda x, lp: moe.sparse_moe(config, x, None, lp, mesh=mesh))(x, lp)
    assert float(jnp.abs(lp["experts_down"]["bias"]).max()) > 0.1
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(stats.experts), np.asarray(want_stats.experts))


def test_attached_lora_equals_merged_lora_on_the_attention():
    """LoRA on gpt-oss's attention projections (its experts take none): the attached adapters
    (the output projection's bias beside them) give the merged kernels' logits."""
    from jaxrl_llm.models import lora as lora_lib

    config = models.ModelConfig.tiny(**TINY)
    params = models.init_params(config, jax.random.PRNGKey(0))
    lc = lora_lib.LoRAConfig(rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    adapters = lora_lib.init_lora(config, lc, jax.random.PRNGKey(1))
    adapters = jax.tree.map(lambda x: x + 0.05, adapters)  # B = 0 would change nothing
    layers = dict(params["layers"])
    layers["o_proj"] = {**layers["o_proj"], "bias": jnp.full_like(layers["o_proj"]["bias"], 0.3)}
    params = {**params, "layers": layers}
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 11), 3, 97)
    base, _ = models.forward(params, toks, config=config)
    attached, _ = models.forward(lora_lib.attach_lora(params, adapters, lc), toks, config=config)
    merged, _ = models.forward(lora_lib.merge_lora(params, adapters, lc), toks, config=config)
    np.testing.assert_allclose(np.asarray(attached), np.asarray(merged), atol=1e-4)
    assert float(jnp.abs(attached - base).max()) > 1e-2


def test_shared_prompt_forward_equals_the_plain_forward():
    """A group's prompt run once and its G completions over it (the update's shared-prompt
    forward: the sinks and windows of every store) give the plain forward's values and
    gradients."""
    config = models.ModelConfig.tiny(**TINY, num_labels=1)
    params = models.init_params(config, jax.random.PRNGKey(0))
    layers = dict(params["layers"])
    layers["sinks"] = {"logit": jax.random.normal(jax.random.PRNGKey(4), (4, 3))}
    params = {**params, "layers": layers}
    groups, g, tp, tc = 2, 3, 7, 5
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    prompts = jax.random.randint(k1, (groups, tp), 0, config.vocab_size)
    p_mask = jnp.ones((groups, tp), bool).at[1, :2].set(False)
    comps = jax.random.randint(k2, (groups * g, tc), 0, config.vocab_size)
    c_mask = jnp.ones((groups * g, tc), bool).at[1, 2:].set(False)
    toks = jnp.concatenate([jnp.repeat(prompts, g, 0), comps], 1)
    mask = jnp.concatenate([jnp.repeat(p_mask, g, 0), c_mask], 1)
    w = jax.random.normal(jax.random.PRNGKey(3), (*toks.shape, config.hidden_size))
    real = mask[..., None]

    def objective(p, shared):
        out = models.apply(
            p, toks, config=config, attention_mask=mask, shared_prefix=(tp, g) if shared else None
        )
        return jnp.sum(jnp.where(real, out.hidden * w, 0.0)) + jnp.sum(out.scalar * mask)

    v0, g0 = jax.value_and_grad(objective)(params, False)
    v1, g1 = jax.value_and_grad(objective)(params, True)
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, atol=1e-4 * scale, rtol=1e-4)


def test_bfloat16_compute_is_close_when_it_routes_as_float32():
    """bfloat16 activations give float32's logits to bfloat16 rounding once both route each
    token to the same experts (a near tie in the router may flip in bfloat16: replaying
    float32's routing takes those flips out)."""
    c32 = models.ModelConfig.tiny(**TINY)
    c16 = models.ModelConfig.tiny(**TINY, compute_dtype="bfloat16")
    params = models.init_params(c32, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 13), 0, c32.vocab_size)
    _, _, experts = models.trunk_with_routing(params, toks, config=c32)
    routing = models.RecordedRouting(experts, replay=True)

    def logits(config):
        out = models.apply(params, toks, config=config, routing=routing)
        return np.asarray(models.logits_from_hidden(params, out.hidden, config), np.float32)

    a, b = logits(c32), logits(c16)
    assert np.all(np.isfinite(b))
    np.testing.assert_allclose(a, b, atol=5e-2)

"""A tiny random Gemma 4 trains: the zero padding of its smaller heads gets no gradient (so it
stays zero), an online GRPO step with either engine (the sampler's log-probs equal the
learner's in float32) and offline DPO steps that lower the DPO loss."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.models.transformer import head_padding_masks
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.offline.trainer import train_offline
from jaxrl_llm.train.online.trainer import OnlineTrainer
from jaxrl_llm.train.run.checkpoint import restore_model

TINY = dict(family="gemma4_text")


def _is_spec(s):
    return isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], tuple)


def parity_reward(prompts, completions, **_):
    """1 when the completion starts with an even code point, else 0."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def test_padding_is_zero_and_gets_no_gradient():
    config = models.ModelConfig.tiny(**TINY)
    assert config.has_padded_heads
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 23), 3, 97)
    mask = jnp.ones((2, 23), bool).at[1, :7].set(False)

    def loss(p):
        out = models.apply(p, toks, config=config, attention_mask=mask)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)

    grads = jax.grad(loss)(params)
    for name, sub in head_padding_masks(config).items():
        for leaf, m in sub.items():
            w, g = params["layers"][name][leaf], grads["layers"][name][leaf]
            m = np.broadcast_to(m, w.shape)
            assert np.all(np.asarray(w)[m == 0] == 0), (name, leaf)
            assert np.all(np.asarray(g)[m == 0] == 0), (name, leaf)
            assert np.abs(np.asarray(g)[m == 1]).max() > 0, (name, leaf)
    assert not np.any(np.asarray(grads["layers"]["layer_scalar"]["value"]))


def test_gradients_reach_the_experts_and_the_per_layer_inputs():
    """With the MoE block beside the MLP and per-layer inputs, every parameter but the layer
    scalars gets a gradient."""
    config = models.ModelConfig.tiny(
        **TINY,
        moe_beside_mlp=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=40,
        per_layer_input_size=8,
    )
    params = models.init_params(config, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 19), 3, 97)

    def loss(p):
        out = models.apply(p, toks, config=config)
        logits = jnp.einsum("btd,dv->btv", out.hidden, out.unembed)
        return jnp.mean(jax.nn.logsumexp(logits, -1))

    grads = jax.grad(loss)(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        if "layer_scalar" in jax.tree_util.keystr(path):
            continue
        assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    (d / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in prompts))
    rng = np.random.default_rng(0)
    pairs = [
        {
            "prompt": f"q{i}?",
            "chosen": str(rng.choice(["yes", "sure", "ok"])),
            "rejected": str(rng.choice(["no", "never", "nah"])),
        }
        for i in range(64)
    ]
    (d / "pref.jsonl").write_text("\n".join(json.dumps(r) for r in pairs))
    return d


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_grpo_step_and_sampler_logprobs_equal_the_learners(data, tmp_path, engine):
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "grpo"),
            max_steps=1,
            algorithm="grpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=TINY),
            optim=dict(name="sgd", lr=1e-2),
            data=dict(train=str(data / "prompts.jsonl"), max_length=32),
            loss=dict(kl_coef=0.0),
            rollout=dict(
                prompts_per_step=4,
                group_size=4,
                max_new_tokens=8,
                engine=engine,
                correction=dict(high=2.0),
            ),
            rewards=[dict(name="tests.models.test_gemma4_train:parity_reward")],
            logging=dict(tensorboard=False, plots=False),
            eval=dict(before=False),
        ),
    )
    trainer = OnlineTrainer(cfg, log_stream=open(os.devnull, "w"))
    try:
        before = jax.device_get(trainer.policy.state.params)
        metrics = trainer.train_step(1)
        after = jax.device_get(trainer.policy.state.params)
    finally:
        trainer.close()
    assert trainer.policy.config.family == models.Family.GEMMA4
    assert np.isfinite(metrics["loss"])
    assert metrics["correction/mismatch_kl"] < 1e-10
    assert abs(metrics["correction/weight_mean"] - 1) < 1e-5
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after, before)
    assert max(jax.tree.leaves(moved["layers"]["k_proj"])) > 0


def test_dpo_steps_lower_the_loss(data, tmp_path):
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "dpo"),
            max_steps=12,
            algorithm="dpo",
            seed=0,
            model=dict(source="tiny", tokenizer="char", tiny=TINY),
            optim=dict(lr=3e-3),
            loss=dict(beta=0.1),
            data=dict(train=str(data / "pref.jsonl"), max_length=32),
            train=dict(batch_size=8),
            logging=dict(tensorboard=False, plots=False),
        ),
    )
    train_offline(cfg, log_stream=open(os.devnull, "w"))
    rows = [json.loads(line) for line in open(tmp_path / "dpo" / "metrics.jsonl")]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) >= 2 and all(np.isfinite(losses))
    assert losses[0] == pytest.approx(np.log(2), abs=1e-3)  # policy = reference at step 1
    assert np.mean(losses[-3:]) < losses[0] - 0.05
    config, params, _ = restore_model(os.path.join(cfg.output_dir, "checkpoints"))
    assert config.family == models.Family.GEMMA4 and config.has_padded_heads
    want = models.param_shapes_and_axes(config)
    shapes = jax.tree.map(lambda x: tuple(x.shape), params)
    assert shapes == jax.tree.map(lambda s: s[0], want, is_leaf=_is_spec)

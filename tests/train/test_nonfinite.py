"""NaN/Inf guard: a non-finite loss or gradient skips the update and is counted; after K
consecutive bad steps the run stops with the last good checkpoint intact."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.cli.main import main
from jaxrl_llm.parallel import batch_sharding, logical_to_sharding, make_mesh
from jaxrl_llm.train import make_train_step
from jaxrl_llm.train.programs.state import TrainState, state_sharding_from_params
from jaxrl_llm.train.run.checkpoint import restore_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_nonfinite_loss_skips_the_update():
    mesh = make_mesh(data=-1)
    params = {"w": jnp.ones((4, 3))}
    axes = {"w": ("embed", "mlp")}
    sharding = logical_to_sharding(axes, mesh)
    opt = optax.adam(0.1)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    state_sharding = state_sharding_from_params(opt, abstract, sharding, mesh)
    state = TrainState(
        params=params,
        opt_state=opt.init(params),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.PRNGKey(0),
    )

    def loss_fn(p, batch):
        return jnp.mean((batch["x"] @ p["w"]) ** 2) * batch["scale"][0], {}

    step = make_train_step(
        loss_fn,
        opt,
        mesh=mesh,
        state_sharding=state_sharding,
        batch_sharding=batch_sharding(mesh),
        donate=False,
    )
    x = np.ones((8, 4), np.float32)
    good = {"x": x, "scale": np.ones((8,), np.float32)}
    bad = {"x": x, "scale": np.full((8,), np.nan, np.float32)}
    s1, m1 = step(state, good)
    assert float(m1["nonfinite"]) == 0.0
    s2, m2 = step(s1, bad)
    assert float(m2["nonfinite"]) == 1.0 and int(s2.step) == 2
    np.testing.assert_array_equal(np.asarray(s2.params["w"]), np.asarray(s1.params["w"]))
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        s2.opt_state,
        s1.opt_state,
    )


def _blow_up_run(out, capsys, *overrides) -> tuple[int, str, list[dict]]:
    """A tiny SFT run at lr 1e30 (checkpoint every step, stop after 2 bad steps): exit status,
    the last stderr line, the metrics rows."""
    rc = main(
        [
            "train",
            os.path.join(ROOT, "configs", "sft.yaml"),
            f"output_dir={out}",
            "model.source=tiny",
            "model.tokenizer=char",
            "max_steps=10",
            "optim.lr=1e30",
            "optim.schedule=constant",
            "optim.grad_clip=null",
            "max_nonfinite_steps=2",
            "checkpoint.save_every=1",
            "data.eval=null",
            "logging.tensorboard=false",
            "logging.plots=false",
            *overrides,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    return rc, err, [json.loads(l) for l in open(out / "metrics.jsonl")]


def test_run_stops_after_consecutive_nonfinite_steps(tmp_path, capsys):
    out = tmp_path / "run"
    # A learning rate of 1e30 makes the first update blow the weights up: from step 2 on every
    # loss is non-finite, so the run stops after max_nonfinite_steps = 2 bad steps.
    rc, err, rows = _blow_up_run(out, capsys, "optim.warmup_steps=0")
    assert rc == 2
    assert "consecutive steps with a non-finite loss" in err, err
    # step 1's checkpoint holds the weights the 1e30 update blew up: not named as good
    assert "no good checkpoint is kept: step(s) [1]" in err and "at step 2" in err, err
    assert [r["nonfinite"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[-1]["nonfinite_steps_total"] == 2
    config, params, _ = restore_model(str(out / "checkpoints"))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_guard_names_the_checkpoint_before_the_poisoning_update(tmp_path, capsys):
    """Warm-up from 0 to 1e30 over 2 steps: update 1 (lr 0) is harmless, update 2 blows the
    weights up, steps 3 and 4 are non-finite. The checkpoint of step 2 holds the blown-up
    weights; the guard names step 1."""
    rc, err, rows = _blow_up_run(
        tmp_path / "run", capsys, "optim.warmup_steps=2", "checkpoint.keep=5"
    )
    assert rc == 2
    assert "the last good checkpoint is step 1" in err, err
    assert "step 2 holds the weights that gave the non-finite loss" in err, err
    assert [r["nonfinite"] for r in rows] == [0.0, 0.0, 1.0, 1.0]

import dataclasses
import functools
import json
import os

import jax
import numpy as np
import optax
import pytest

from jaxrl_llm.errors import CheckpointError
from jaxrl_llm.models import Family, ModelConfig
from jaxrl_llm.models.config_groups import GROUPS
from jaxrl_llm.parallel import batch_sharding, make_mesh
from jaxrl_llm.train import abstract_train_state, create_train_state, make_train_step
from jaxrl_llm.train.run.checkpoint import (
    CheckpointManager,
    model_config_from_dict,
    model_config_to_dict,
    restore_model,
)
from tests.train.common import axes, init_fn, nll_denominator, nll_loss, ragged_batch, tiny_config

CFG = tiny_config()
OPT = optax.adamw(1e-2)
BATCH = ragged_batch(3, 8, 10, CFG.vocab_size)


def _step_fn(mesh, sharding):
    return make_train_step(
        functools.partial(nll_loss, config=CFG),
        OPT,
        mesh=mesh,
        state_sharding=sharding,
        batch_sharding=batch_sharding(mesh),
        denominator_fn=nll_denominator,
    )


def _close(a, b, tol=1e-6):
    return all(
        jax.tree.leaves(
            jax.tree.map(
                lambda x, y: bool(np.allclose(np.asarray(x), np.asarray(y), atol=tol, rtol=0)), a, b
            )
        )
    )


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """Train 1 step on an 8-device mesh, save (async), train 1 more step (the reference)."""
    d = str(tmp_path_factory.mktemp("ckpt"))
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    state, sharding = create_train_state(
        init_fn(CFG), OPT, mesh, param_axes=axes(CFG), rng=jax.random.PRNGKey(1)
    )
    step = _step_fn(mesh, sharding)
    state, _ = step(state, BATCH)
    mgr = CheckpointManager(d, save_every=1, keep=2, model_config=CFG)
    assert mgr.save(1, state, extra={"data_position": 17, "note": "x"})
    saved = jax.device_get(state)  # host copy before the state buffers are donated
    state, _ = step(state, BATCH)
    mgr.wait_until_finished()
    return d, mgr, saved, jax.device_get(state)


@pytest.mark.parametrize("n_devices,mesh_kw", [(1, dict(data=1)), (4, dict(data=1, fsdp=4))])
def test_restore_on_other_mesh_and_continue(saved_run, n_devices, mesh_kw):
    d, _, saved, after = saved_run
    mesh = make_mesh(**mesh_kw, devices=jax.devices()[:n_devices])
    abstract, sharding = abstract_train_state(init_fn(CFG), OPT, mesh, param_axes=axes(CFG))
    state, extra = CheckpointManager(d).restore(abstract)
    assert extra == {"data_position": 17, "note": "x"}
    assert int(state.step) == 1
    np.testing.assert_array_equal(np.asarray(state.rng), np.asarray(saved.rng))
    assert _close(state.params, saved.params, 0) and _close(state.opt_state, saved.opt_state, 0)
    leaf = state.opt_state[0].mu["embed"]["embedding"]
    assert leaf.sharding == sharding.opt_state[0].mu["embed"]["embedding"]
    assert {s.device for s in leaf.addressable_shards} == set(jax.devices()[:n_devices])
    state, _ = _step_fn(mesh, sharding)(state, BATCH)
    assert int(state.step) == 2
    assert _close(jax.device_get(state.params), after.params, 1e-6)


def test_partly_written_checkpoint_is_skipped(saved_run):
    d, mgr, saved, _ = saved_run
    # what a crash mid-save leaves behind: orbax's temporary directory for step 5
    tmp = os.path.join(d, "5.orbax-checkpoint-tmp-1234567")
    os.makedirs(os.path.join(tmp, "params"))
    with open(os.path.join(tmp, "params", "partial"), "w") as f:
        f.write("half")
    assert CheckpointManager(d).latest_step() == 1
    cfg, params, tok = restore_model(d)
    assert _close(params, saved.params, 0)


def test_save_every_and_keep_last(tmp_path):
    mesh = make_mesh(data=-1, devices=jax.devices()[:2])
    state, _ = create_train_state(
        lambda r: {"w": jax.random.normal(r, (4, 2))},
        optax.sgd(0.1),
        mesh,
        param_axes={"w": ("embed", "mlp")},
        rng=jax.random.PRNGKey(0),
    )
    with CheckpointManager(tmp_path, save_every=2, keep=2, async_save=False) as mgr:
        started = [mgr.save(s, state) for s in range(1, 8)]
        assert started == [False, True, False, True, False, True, False]
        assert mgr.save(7, state, force=True)
        assert mgr.all_steps() == [6, 7]
        with pytest.raises(CheckpointError, match="not JSON-serialisable"):
            mgr.save(8, state, extra={"arr": np.zeros(2)}, force=True)
        with pytest.raises(CheckpointError, match="step 3 not found"):
            mgr.restore(state, step=3)
    with pytest.raises(CheckpointError, match="no finalised checkpoint"):
        CheckpointManager(tmp_path / "empty").restore(state)


def test_restore_model_returns_config_params_and_step_dir(saved_run):
    d, _, saved, _ = saved_run
    cfg, params, tok = restore_model(os.path.join(d, "1"))
    assert cfg == CFG and tok is None
    assert params["embed"]["embedding"].dtype == np.float32
    assert _close(params, saved.params, 0)
    with open(os.path.join(d, "1", "model_config", "metadata")) as f:
        stored = json.load(f)
    assert stored["family"] == "llama" and stored["rope_scaling"] == "default"
    with pytest.raises(CheckpointError, match="does not exist"):
        restore_model(os.path.join(d, "nope"))


def test_model_config_json_round_trip():
    cfg = tiny_config(family="qwen2", eos_token_ids=(5, 6), rope_scaling="linear", rope_factor=2.0)
    d = model_config_to_dict(cfg)
    assert json.loads(json.dumps(d)) == d and d["eos_token_ids"] == [5, 6]
    assert model_config_from_dict(d) == cfg
    with pytest.raises(CheckpointError, match=r"unknown keys \['quantization_config'\]"):
        model_config_from_dict({**d, "quantization_config": {}})


# A tiny Gemma 3 config's model_config item as checkpoints saved it before ModelConfig had
# groups (written by that version's model_config_to_dict).
_FLAT_GEMMA3 = {
    "family": "gemma3_text",
    "vocab_size": 97,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_layers": 3,
    "num_heads": 3,
    "num_kv_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_theta": 1000000.0,
    "rope_scaling": "default",
    "rope_factor": 1.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_position": 8192,
    "rope_beta_fast": 32.0,
    "rope_beta_slow": 1.0,
    "rope_truncate": True,
    "rope_attention_factor": None,
    "rms_norm_eps": 1e-06,
    "tie_embeddings": True,
    "attention_bias": False,
    "qk_norm": True,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_local_theta": 10000.0,
    "rms_norm_unit_offset": True,
    "post_norms": True,
    "mlp_activation": "gelu_pytorch_tanh",
    "scale_embeddings": True,
    "query_pre_attn_scalar": 24.0,
    "attn_logit_softcap": None,
    "final_logit_softcap": None,
    "num_experts": 0,
    "num_experts_per_tok": 0,
    "moe_intermediate_size": 80,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001,
    "moe_dispatch": "sorted",
    "moe_beside_mlp": False,
    "shared_expert_size": 0,
    "linear_num_key_heads": 0,
    "linear_num_value_heads": 0,
    "linear_key_head_dim": 0,
    "linear_value_head_dim": 0,
    "linear_conv_kernel": 0,
    "delta_chunk_size": 64,
    "partial_rotary_factor": 1.0,
    "attn_output_gate": False,
    "global_head_dim": None,
    "global_kv_heads": None,
    "global_k_eq_v": False,
    "global_rope_proportion": 1.0,
    "value_norm": False,
    "layer_scalars": False,
    "per_layer_input_size": 0,
    "per_layer_vocab_size": None,
    "kv_shared_layers": 0,
    "double_wide_mlp": False,
    "attention_sinks": False,
    "attention_out_bias": False,
    "expert_bias": False,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "num_labels": 0,
    "param_dtype": "float32",
    "compute_dtype": "float32",
    "attention": "auto",
    "bos_token_id": None,
    "eos_token_ids": [],
    "pad_token_id": None,
}


def test_model_config_from_old_flat_dict_and_nested_groups():
    want = ModelConfig.tiny(Family.GEMMA3)
    assert model_config_from_dict(_FLAT_GEMMA3) == want
    assert model_config_to_dict(want) == _FLAT_GEMMA3  # still the flat format, key for key
    # Groups as nested dicts (what json makes of dataclasses.asdict) load too.
    nested = {f.name: getattr(want, f.name) for f in dataclasses.fields(want)}
    nested = {k: dataclasses.asdict(v) if k in GROUPS else v for k, v in nested.items()}
    assert model_config_from_dict(json.loads(json.dumps(nested))) == want
    with pytest.raises(CheckpointError, match=r"invalid model_config: .*did you mean 'num_heads'"):
        model_config_from_dict({**_FLAT_GEMMA3, "attn": {"num_head": 3}})


class _Tokenizer:
    """Writes two files; with ``crash`` it dies between them (a run killed mid-write)."""

    def __init__(self, crash=False):
        self.crash = crash

    def save_pretrained(self, path):
        os.makedirs(path)
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            f.write("{}")
        if self.crash:
            raise KeyboardInterrupt("killed")
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            f.write("{}")


def test_tokenizer_is_written_atomically(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        CheckpointManager(tmp_path, tokenizer=_Tokenizer(crash=True))
    # no half-written tokenizer/ that a later run would take as saved
    assert not os.path.exists(tmp_path / "tokenizer")
    CheckpointManager(tmp_path, tokenizer=_Tokenizer()).close()
    assert sorted(os.listdir(tmp_path / "tokenizer")) == ["tokenizer.json", "tokenizer_config.json"]
    assert not [e for e in os.listdir(tmp_path) if e.startswith("tokenizer.tmp")]


def test_saves_past_keep_delete_each_old_step_once(tmp_path, caplog):
    # A save used to reload the manager's listing every time; orbax then deleted each step
    # past keep twice and warned "Unable to find the step ... for deletion" on nearly every
    # step of a run (23 times in a 500-step run).
    import logging

    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    state, _ = create_train_state(
        init_fn(CFG), OPT, mesh, param_axes=axes(CFG), rng=jax.random.PRNGKey(1)
    )
    mgr = CheckpointManager(str(tmp_path), save_every=1, keep=2, model_config=CFG)
    with caplog.at_level(logging.WARNING, logger="absl"):
        for step in range(1, 9):  # as a run saves: the next save does not wait for the last
            assert mgr.save(step, state)
        mgr.wait_until_finished()
        mgr.close()
    assert not [r for r in caplog.records if "for deletion" in r.getMessage()]
    assert sorted(int(e) for e in os.listdir(tmp_path) if e.isdigit()) == [7, 8]

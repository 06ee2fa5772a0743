"""``jaxrl-llm memory``: the device follows --topology or the backend, and a setup that does
not fit gets the changes that would make it fit, each with the estimator's total."""

import json

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.cli.memory import parse_mesh, resolve_device
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.chips import chip_kind as device_kind
from jaxrl_llm.train.compile.memory import DEVICE_MEMORY, MODEL_PRESETS, estimate_memory
from jaxrl_llm.train.compile.memory_advice import fit_advice

# 14 pairs of 1024 tokens with no remat: 98 GiB a chip, just over a v5p's 95 (each of the four
# kinds of change fits it)
DPO_8B = dict(batch_size=14, seq_len=1024, group_size=8, fsdp=4, device="tpu-v5p")


def test_each_advice_is_the_estimators_total_and_fits():
    c = MODEL_PRESETS["8b"]
    assert not estimate_memory(c, "dpo", **DPO_8B).fits
    advice = {a.change: a for a in fit_advice(c, "dpo", max_devices=64, **DPO_8B)}
    assert list(advice) == [
        "--remat dots",
        "--lora-rank 16",
        "fsdp=8",
        "reference in host memory",
    ]
    changes = {
        "--remat dots": dict(remat="dots"),
        "--lora-rank 16": dict(lora_rank=16),
        "fsdp=8": dict(fsdp=8),
        "reference in host memory": dict(reference_offloaded=True),
    }
    for name, change in changes.items():
        e = estimate_memory(c, "dpo", **{**DPO_8B, **change})
        assert advice[name].total_bytes_per_device == e.total_bytes_per_device
        assert e.fits and advice[name].device_bytes == DEVICE_MEMORY["tpu-v5p"]
    # the smallest: fsdp=8 fits, the mesh as given (fsdp=4) does not
    assert not estimate_memory(c, "dpo", **DPO_8B).fits


def test_bigger_device_combination_and_nothing():
    c = MODEL_PRESETS["8b"]
    setup = dict(batch_size=1, seq_len=256, device="h100", remat="full", lora_rank=16)
    assert fit_advice(c, "sft", **setup) == []  # it fits: no advice
    full = dict(batch_size=1, seq_len=128, device="h100", remat="full")
    total = estimate_memory(c, "sft", **full).total_bytes_per_device
    assert DEVICE_MEMORY["h100"] < total <= DEVICE_MEMORY["h200"]  # 16 bytes/param: ~121 GiB
    advice = fit_advice(c, "sft", max_devices=2, **full)
    assert [a.change for a in advice] == ["--lora-rank 16", "fsdp=2", "--device h200"]
    assert advice[-1].total_bytes_per_device == total and advice[-1].device == "h200"
    grpo = dict(batch_size=4, seq_len=1024, group_size=8, device="h100")
    combo = [a for a in fit_advice(c, "grpo", max_devices=1, **grpo)]
    assert [a.change for a in combo] == ["--remat full --lora-rank 16"]
    e = estimate_memory(c, "grpo", **grpo, remat="full", lora_rank=16)
    assert combo[0].total_bytes_per_device == e.total_bytes_per_device
    # a 70B PPO on one 16 GiB chip: nothing tried fits, and the advice says so
    ppo = dict(batch_size=8, seq_len=1024, group_size=8, device="tpu-v5e")
    assert fit_advice(MODEL_PRESETS["70b"], "ppo", max_devices=4, **ppo) == []


def test_device_follows_topology_then_backend():
    assert resolve_device(None, "v5e:2x2") == ("tpu-v5e", "--topology v5e:2x2", 4)
    assert resolve_device("h200", "v5p:2x2x2") == ("h200", "--device", 8)
    assert resolve_device(None, None)[0] == "cpu"  # the tests run on the CPU backend
    assert device_kind("TPU v5 lite") == "tpu-v5e" and device_kind("TPU v4") == "tpu-v4"
    assert device_kind("NVIDIA H100 80GB HBM3") == "h100" and device_kind("Tesla T4") is None


def test_cli_topology_sets_the_device_and_lists_advice(capsys):
    argv = ["memory", "--model", "8b", "--algorithm", "dpo", "--topology", "v5p:4x4x4"]
    argv += ["--batch", "14"]
    assert main([*argv, "--mesh", "fsdp=4"]) == 0
    out = capsys.readouterr().out
    assert "device: tpu-v5p (from --topology v5p:4x4x4)" in out and "does NOT fit" in out
    assert "changes that fit (tpu-v5p: 95.0 GiB/device; fastest modeled step first):" in out
    assert "fsdp=8" in out and "modeled step" in out
    assert main([*argv, "--mesh", "fsdp=4", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["device"] == "tpu-v5p" and not js["fits"]
    e = estimate_memory(MODEL_PRESETS["8b"], "dpo", **{**DPO_8B, "fsdp": 8})
    fsdp = next(a for a in js["advice"] if a["change"] == "fsdp=8")
    assert fsdp["total_bytes_per_device"] == e.total_bytes_per_device
    assert f"{e.total_bytes_per_device / 1024**3:.3f} GiB/device" in out


def test_cli_refuses_a_mesh_larger_than_the_slice(capsys):
    rc = main(["memory", "--algorithm", "sft", "--topology", "v5e:2x2", "--mesh", "fsdp=8"])
    assert rc == 2
    assert "8 devices, more than the 4 chips of --topology v5e:2x2" in capsys.readouterr().err


@pytest.mark.parametrize("mesh", ["data=0", "model=2", "fsdp"])
def test_memory_and_compile_share_one_mesh_parser(capsys, mesh):
    """One ``--mesh`` parser (issue 51): the same bad mesh, a one-line ``--mesh`` error from
    both commands (``compile`` used to accept ``data=0``); only ``compile`` takes -1 (the rest
    of its slice)."""
    for cmd in (["memory"], ["compile", "--topology", "v5e:2x2"]):
        assert main([*cmd, "--algorithm", "sft", "--mesh", mesh]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1].split(": error: ")[-1]
        assert err.startswith("--mesh")
    assert parse_mesh("fsdp=-1", rest=True)["fsdp"] == -1
    with pytest.raises(ConfigError, match="'fsdp' must be >= 1, got -1"):
        parse_mesh("fsdp=-1")


@pytest.mark.parametrize("bad", ["v9:2x2", "v5e"])
def test_cli_bad_topology_is_one_line(capsys, bad):
    assert main(["memory", "--algorithm", "sft", "--topology", bad]) == 2
    err = capsys.readouterr().err
    assert "--topology" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("preset, linear", [("qwen3.5-9b", 24), ("qwen3.5-35b-a3b", 30)])
def test_cli_memory_takes_the_qwen3_5_presets(preset, linear, capsys):
    # remat dots: without it the 35B-A3B's activations and update leave 95.7 GiB, past v5p's 95
    argv = ["memory", "--model", preset, "--algorithm", "grpo", "--topology", "v5p:2x2x4"]
    argv += ["--remat", "dots"]
    assert main([*argv, "--mesh", "fsdp=16", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["model"] == preset and js["fits"]
    # the rollout holds the linear layers' recurrent state beside the attention layers' cache
    assert f"recurrent state ({linear} linear layers)" in {r["component"] for r in js["rows"]}
    assert main([*argv, "--mesh", "fsdp=16"]) == 0
    assert f"grpo on {preset}" in capsys.readouterr().out


def test_online_plan_counts_the_sampler_copy_and_ranks_changes_by_modeled_step(capsys):
    """8B GRPO on v6e:2x4 at fsdp=8 (the planner case of issue 39). With 4 updates a step it
    fits, and the sampler's copy is tensor parallel over the host's 8 chips with its KV cache
    split by KV heads; the modeled step is its programs' sum. With 16 prompts it does not fit,
    fewer rows per update (--minibatches) is among the changes, each with its modeled step,
    fastest first."""
    argv = ["memory", "--model", "8b", "--algorithm", "grpo", "--topology", "v6e:2x4"]
    argv += ["--mesh", "fsdp=8", "--seq-len", "2048", "--remat", "full", "--json"]
    assert main([*argv, "--minibatches", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["component"]: r for r in out["rows"]}
    assert out["fits"] and out["sampler_tensor"] == 8
    n = MODEL_PRESETS["8b"].num_params()
    assert rows["sampler copy (tensor=8)"]["bytes"] == pytest.approx(2 * n / 8, rel=1e-6)
    assert "KV cache (64 rows x 2048 slots)" in rows
    step = out["step_model"]
    assert step["decode_s"] > 0 and step["train_s"] > 0 and step["reshard_s"] > 0
    assert step["step_s"] == pytest.approx(
        step["train_s"] + step["reference_s"] + step["reshard_s"] + step["decode_s"]
    )
    assert main([*argv, "--batch", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["fits"]
    changes = [a["change"] for a in out["advice"]]
    assert any(c.startswith("--minibatches") for c in changes), changes
    times = [a["step_model"]["step_s"] for a in out["advice"]]
    assert times == sorted(times) and all(t > 0 for t in times)


def test_the_plain_fsdp_setup_gets_the_tensor_parallel_copy_and_is_3x_faster(capsys):
    """8B GRPO on v6e:2x4, 8 prompts × G 8 of 1024 + 1024 tokens at fsdp=8 (issue 39's
    planner case) fits with the sampler's copy tensor parallel over the host's 8 chips, and
    models a step at least 3× faster than the same setup decoding on the learner's layout
    (what the run did before the copy: 18.2 s compiled, issue 39). The setups it lists as
    faster are faster still, and fit."""
    from jaxrl_llm.parallel.decode_model import kind_chip
    from jaxrl_llm.train.compile.step_model import model_step, peak_flops

    argv = ["memory", "--model", "8b", "--algorithm", "grpo", "--topology", "v6e:2x4"]
    argv += ["--mesh", "fsdp=8", "--seq-len", "2048", "--remat", "full", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["sampler_tensor"] == 8
    chip, peak = kind_chip("tpu-v6e"), peak_flops("tpu-v6e")
    setup = dict(batch_size=8, group_size=8, seq_len=2048, prompt_len=1024, fsdp=8)
    on_learner = model_step(MODEL_PRESETS["8b"], "grpo", chip, peak, remat="full", **setup)
    assert on_learner.step_s >= 3 * out["step_model"]["step_s"], out["step_model"]
    times = [f["step_model"]["step_s"] for f in out["faster"]]
    assert times == sorted(times) and all(t < out["step_model"]["step_s"] for t in times)
    assert all(f["total_bytes_per_device"] <= out["device_bytes"] for f in out["faster"])


def test_cli_counts_a_quantised_lora_base(capsys):
    """--lora-base-dtype nf4 (QLoRA): the base's projections at their stored bytes."""
    argv = ["memory", "--model", "8b", "--algorithm", "grpo", "--topology", "v5e:2x4"]
    argv += ["--mesh", "fsdp=8", "--lora-rank", "16"]
    assert main([*argv, "--lora-base-dtype", "nf4"]) in (0, 1)
    out = capsys.readouterr().out
    assert "on a nf4 base" in out and "base projections (nf4, frozen)" in out
    assert main(["memory", "--model", "8b", "--algorithm", "grpo", "--lora-base-dtype", "nf4"]) == 2
    assert "give --lora-rank too" in capsys.readouterr().err


def test_decode_on_gpu_counts_the_separate_layer_arrays():
    """On a GPU the decode reads the layers as separate arrays (one more copy of the layer
    weights while the rollout runs, sampling.static_generate.decode_params); a TPU's does
    not, and an offline run has no decode."""
    c = MODEL_PRESETS["8b"]
    setup = dict(batch_size=4, seq_len=1024, group_size=8, fsdp=8, remat="full")
    name = "separate layer arrays (decode on GPU)"

    def split(device, algorithm="grpo", **kw):
        e = estimate_memory(c, algorithm, device=device, **setup, **kw)
        return [r.bytes for r in e.rows if r.component == name]

    layers = c.num_params() - 2 * c.vocab_size * c.hidden_size - c.hidden_size  # less
    # the untied embeddings and the final norm: the weights under params["layers"]
    assert split("h200") == [layers * 2 // 8]  # in the rollout dtype (bf16), fsdp=8 shards
    assert split("h200", sampler_tensor=2, sampler_dtype="fp32") == [layers * 4 // 2]
    assert split("tpu-v5p") == [] and split("h200", "dpo") == []


def test_a_model_alias_and_tiny_are_models_for_memory_and_compile(capsys):
    # every shipped config's model.source is an alias: `compile --config configs/grpo.yaml`
    # resolved it as a path and stopped on "not a preset"
    from jaxrl_llm.cli.memory import resolve_model_config
    from jaxrl_llm.errors import ConfigError

    assert resolve_model_config("smollm2-135m-instruct") == MODEL_PRESETS["135m"]
    assert resolve_model_config("gemma3-270m") == MODEL_PRESETS["gemma3-270m"]
    tiny = resolve_model_config("tiny", {"num_layers": 3, "max_position_embeddings": 1024})
    assert (tiny.num_layers, tiny.max_position_embeddings, tiny.vocab_size) == (3, 1024, 259)
    with pytest.raises(ConfigError, match="did you mean 'smollm2-135m-instruct'"):
        resolve_model_config("smollm2-135m")
    argv = ["memory", "--model", "smollm2-135m-instruct", "--algorithm", "grpo", "--json"]
    assert main(argv) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["model"] == "smollm2-135m-instruct"
    assert main(["memory", "--model", "135m", "--algorithm", "grpo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == js["rows"]

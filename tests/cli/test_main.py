"""The top-level ``jaxrl-llm`` dispatcher: argument order and unknown arguments."""

import pytest

from jaxrl_llm.cli.main import build_parser, main


def test_overrides_may_follow_options():
    """``train CFG --resume a=1 b=2`` keeps every override (argparse alone would reject a=1)."""
    from jaxrl_llm.cli.train import _split_resume

    parser = build_parser()
    args, extra = parser.parse_known_args(["train", "c.yaml", "x=1", "--resume", "a.b=2", "c=3"])
    _split_resume(args)  # --resume takes auto / true; a dotted override after it stays one
    assert args.overrides + extra == ["x=1", "a.b=2", "c=3"] and args.resume == "true"


def test_unknown_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "configs/sft.yaml", "--no-such-flag"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_dry_run_accepts_overrides_after_options(capsys):
    assert main(["train", "configs/sft.yaml", "--dry-run", "max_steps=2", "seed=7"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 2" in out and "seed: 7" in out


def test_no_tpu_discovery_noise_on_a_cpu_machine():
    """The development install carries libtpu (``jaxrl-llm compile``); on a machine without a
    TPU or GPU plugin the CLI asks JAX for the CPU only, so no ``E0000 ... unexpected worker
    hostname`` lines are printed (issue 31 §8)."""
    import os
    import subprocess
    import sys

    from jaxrl_llm.cli.main import quiet_tpu_discovery

    env = {"JAX_PLATFORMS": "tpu", "TPU_WORKER_HOSTNAMES": "10.0.0.2"}
    quiet_tpu_discovery(env)
    # a choice made by the user is kept
    assert env["JAX_PLATFORMS"] == "tpu" and env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2"
    code = (
        "import os; from jaxrl_llm.cli.main import quiet_tpu_discovery; quiet_tpu_discovery(); "
        "import jax; print(os.environ.get('JAX_PLATFORMS'), jax.devices()[0].platform)"
    )
    child = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    p = subprocess.run(
        [sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    if os.path.exists("/dev/vfio") or any(n.startswith("accel") for n in os.listdir("/dev")):
        pytest.skip("a TPU machine: JAX may use it")
    assert p.stdout.split()[-1] == "cpu"
    assert "E0000" not in p.stderr and "worker hostname" not in p.stderr, p.stderr


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["trian", "c.yaml"], "did you mean 'train'?"),
        (["generate", "--engine", "paeged", "--prompt", "x"], "did you mean 'paged'?"),
        (["memory", "--algorithm", "gpro"], "did you mean 'grpo'?"),
    ],
)
def test_an_invalid_choice_names_the_closest(argv, hint, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and hint in err


def test_an_invalid_choice_far_from_every_choice_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--engine", "xyzzy", "--prompt", "x"])
    err = capsys.readouterr().err
    assert "invalid choice: 'xyzzy'" in err and "did you mean" not in err


def test_the_top_level_help_speaks_to_a_user(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "Post-train language models" in out and "dispatched" not in out
    assert out.index("    train ") < out.index("    generate ")  # the main command first
    assert "jaxrl-llm train configs/" in out and "jaxrl-llm eval " in out


@pytest.mark.parametrize(
    "config, shown, left_out",
    [
        ("configs/sft.yaml", ["train", "data", "optim"], ["rollout", "rewards", "ppo", "env"]),
        ("configs/grpo.yaml", ["rollout", "rewards", "eval"], ["train", "ppo", "teacher"]),
        ("configs/ppo.yaml", ["rollout", "ppo"], ["train", "distill"]),
    ],
)
def test_dry_run_prints_only_the_sections_the_algorithm_reads(config, shown, left_out, capsys):
    import yaml

    assert main(["train", config, "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert all(k in printed for k in shown) and not any(k in printed for k in left_out)


def test_a_resumed_runs_training_time_counts_its_own_steps():
    from jaxrl_llm.cli.train import training_time

    fresh = {"train_time_s": 120.0, "steps": 10, "start_step": 0}
    assert training_time(fresh) == "training time: 2.0 min over 10 steps"
    resumed = {"train_time_s": 60.0, "steps": 10, "start_step": 6}
    assert training_time(resumed) == (
        "training time: 1.0 min over 4 steps (7-10, resumed from step 6)"
    )
    done = {"train_time_s": 0.0, "steps": 10, "start_step": 10}
    assert training_time(done) == "training time: 0.0 min over 0 steps (resumed from step 10)"


def test_a_resumed_run_still_prints_its_held_out_metric():
    # a resumed run does not evaluate before its first step: it printed no held-out line
    from jaxrl_llm.cli.train import held_out_lines

    after = {"eval/loss": 1.779, "eval/num_tokens": 29.0}
    fresh = {"eval_before": {"eval/loss": 2.796, "eval/num_tokens": 29.0}, "eval_after": after}
    assert held_out_lines(fresh) == ["held-out loss: 2.796 -> 1.779"]
    assert held_out_lines({"eval_after": after}) == [
        "held-out loss: 1.779 (before training: metrics.jsonl, step 0)"
    ]
    online = {"eval/math_answer": 0.47, "eval/num_examples": 200, "eval/maj@4": 0.5}
    assert held_out_lines({"eval_before": {"eval/math_answer": 0.25}, "eval_after": online}) == [
        "held-out math_answer: 0.250 -> 0.470 (200 examples, greedy)"
    ]
    assert held_out_lines({}) == []


def test_a_shipped_config_runs_from_another_directory(tmp_path, monkeypatch, capsys):
    """configs/*.yaml name data/... from the repository's root: from elsewhere, a relative
    path that is not found is read from beside the config file, and said."""
    import os

    import yaml

    config = os.path.abspath("configs/sft.yaml")
    root = os.path.dirname(os.path.dirname(config))
    monkeypatch.chdir(tmp_path)
    assert main(["train", config, "--dry-run", f"output_dir={tmp_path / 'run'}"]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert printed["data"]["train"] == os.path.join(root, "data/arith_sft/train.jsonl")
    assert "data.train: " in captured.err and "relative to the config file" in captured.err
    # a path that exists from the current directory is kept as written
    (tmp_path / "data" / "arith_sft").mkdir(parents=True)
    (tmp_path / "data" / "arith_sft" / "train.jsonl").write_text(
        open(os.path.join(root, "data/arith_sft/train.jsonl")).read()
    )
    assert main(["train", config, "--dry-run", f"output_dir={tmp_path / 'run'}"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["train"] == "data/arith_sft/train.jsonl"


_NOISE = ("JAX_PLATFORMS", "TPU_SKIP_MDS_QUERY", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE")


def _child(code: str):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in _NOISE}
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    if os.path.exists("/dev/vfio") or any(n.startswith("accel") for n in os.listdir("/dev")):
        pytest.skip("a TPU machine: JAX may use it")
    return p


def test_the_python_api_is_as_quiet_as_the_cli_when_asked():
    """``import jaxrl_llm`` changes no environment variable (issue 51: no magic at import), so
    a program that uses the Python API on a CPU host where the development install put libtpu
    asks for the CLI's quiet start itself: ``quiet_tpu_discovery()`` before JAX, then no
    libtpu lines."""
    code = "from jaxrl_llm.cli.main import quiet_tpu_discovery; quiet_tpu_discovery()\n"
    p = _child(code + "import jaxrl_llm, jax; print(jax.devices()[0].platform)")
    assert p.stdout.split()[-1] == "cpu"
    assert "E0000" not in p.stderr and "worker hostname" not in p.stderr, p.stderr


@pytest.mark.slow
def test_compile_prints_no_libtpu_errors(tmp_path):
    import json

    model = tmp_path / "config.json"
    model.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 512,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 32,
            }
        )
    )
    argv = ["compile", "--model", str(model), "--algorithm", "sft", "--topology", "v5e:2x2"]
    argv += ["--mesh", "data=4", "--batch", "4", "--seq-len", "64", "--no-decode", "--json"]
    p = _child(f"import sys; from jaxrl_llm.cli.main import main; sys.exit(main({argv!r}))")
    assert json.loads(p.stdout)["topology"] == "v5e:2x2"
    assert "E0000" not in p.stderr and "worker hostname" not in p.stderr, p.stderr
    assert "host bounds" not in p.stderr, p.stderr  # compile names the slice to libtpu


def test_a_resumed_run_prints_its_held_out_metric_before_and_after(tmp_path, capsys):
    """The value before training comes back from the first run's step-0 row of
    ``metrics.jsonl``: a resumed SFT run prints ``held-out loss: before -> after``."""
    import json
    import os

    from tests.train.harness import SFT

    out = tmp_path / "run"
    args = [
        "train",
        SFT,
        f"output_dir={out}",
        "model.source=tiny",
        "model.tokenizer=char",
        "model.tiny.num_layers=1",
        "logging.tensorboard=false",
        "logging.plots=false",
        "checkpoint.export_hf=false",
        "train.eval_batches=1",
    ]
    assert main([*args, "max_steps=1"]) == 0
    capsys.readouterr()
    assert main([*args, "max_steps=2", "--resume"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    before = next(r["eval/loss"] for r in rows if r["step"] == 0)
    after = next(r["eval/loss"] for r in rows if r["step"] == 2 and r.get("eval/loss"))
    assert f"held-out loss: {before:.3f} -> {after:.3f}" in printed, printed

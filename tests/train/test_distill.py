"""On-policy distillation end to end on tiny models (``algorithm: distill``): both loss kinds
through ``jaxrl-llm train``, a teacher equal to the student leaves the policy untouched,
context distillation, the tokenizer refusal, and resume."""

import json
import os

import jax
import numpy as np
import pytest

from jaxrl_llm import models
from jaxrl_llm.cli.main import main
from jaxrl_llm.data import CharTokenizer
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import from_dict
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.online.teacher import teacher_batch, with_system_prompt
from jaxrl_llm.train.online.trainer import train_online
from jaxrl_llm.train.run.checkpoint import restore_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(num_layers=1)


def cli_args(out, *extra):
    """``jaxrl-llm train configs/distill.yaml`` for 2 steps of a tiny student and teacher."""
    return [
        "train",
        os.path.join(ROOT, "configs", "distill.yaml"),
        "max_steps=2",
        f"output_dir={out}",
        f"data.train={ROOT}/data/addition/train.jsonl",
        f"data.eval={ROOT}/data/addition/heldout.jsonl",
        "eval.num_examples=4",
        "eval.batch_size=4",
        "rollout.prompts_per_step=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "model.source=tiny",
        "model.tokenizer=char",
        "model.tiny={num_layers: 1}",
        "teacher.source=tiny",
        "teacher.tokenizer=char",
        "logging.tensorboard=false",
        "logging.plots=false",
        *extra,
    ]


def rows(out):
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if r.get("loss") is not None]


def test_reverse_kl_distillation_runs_two_steps(tmp_path, capsys):
    """A 2-layer teacher, the 1-layer student: per-token advantages from their log-probs."""
    out = tmp_path / "rkl"
    rc = main(cli_args(out, "teacher.tiny={num_layers: 2}", "loss.kind=reverse_kl"))
    assert rc == 0, capsys.readouterr().err
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["advantage/std"] > 0 and np.isfinite(r["distill/reverse_kl"])
        assert r["grad_norm"] > 0
    said = capsys.readouterr()
    assert "teacher: tiny" in said.out + said.err


def test_gkd_distillation_runs_two_steps_with_rewards_mixed_in(tmp_path, capsys):
    out = tmp_path / "gkd"
    rc = main(
        cli_args(
            out,
            "teacher.tiny={num_layers: 2}",
            "loss.kind=gkd",
            "loss.beta=0.5",
            "distill.reward_weight=0.5",
        )
    )
    assert rc == 0, capsys.readouterr().err
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["jsd"] > 0 and r["grad_norm"] > 0
        assert 0.0 <= r["teacher_student_top1_agree"] <= 1.0


def test_teacher_equal_to_the_student_gives_zero_advantages_and_an_unchanged_policy(tmp_path):
    """A tiny teacher with the student's settings is the student's initial weights (same seed):
    reverse-KL advantages are exactly 0, so are the gradients, and Adam leaves the weights
    as they were."""
    out = tmp_path / "same"
    rc = main(cli_args(out, "teacher.tiny={num_layers: 1}", "checkpoint.save_every=2"))
    assert rc == 0
    for r in rows(out):
        assert r["advantage/max"] == r["advantage/min"] == 0.0
        assert r["distill/reverse_kl"] == 0.0 and r["grad_norm"] == 0.0
    config, params, _ = restore_model(str(out / "checkpoints"))
    init = models.init_params(config, jax.random.PRNGKey(0))
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, init
    )


@pytest.mark.parametrize(
    "extra",
    [["loss.kind=reverse_kl"], ["loss.kind=gkd", "model.lora={rank: 4}"]],
    ids=["rkl", "gkd_lora"],
)
def test_context_distillation_gives_the_teacher_its_own_prompt(tmp_path, extra):
    """The student's own weights as teacher, but the teacher reads a system prompt first: it
    scores the same completion tokens after another context, so the signal is not 0 (GKD: on
    a LoRA student, whose base is the teacher's weights)."""
    out = tmp_path / "ctx"
    args = ["teacher.tiny={num_layers: 1}", "teacher.system_prompt=Add carefully.", *extra]
    rc = main(cli_args(out, *args))
    assert rc == 0
    for r in rows(out):
        assert r["grad_norm"] > 0
        assert r["advantage/std"] > 0 if "loss.kind=reverse_kl" in extra else r["jsd"] > 0


def test_teacher_batch_puts_the_same_completion_after_the_teachers_prompt():
    tok = CharTokenizer()
    msgs = ({"role": "user", "content": "1+1?"},)
    assert with_system_prompt(msgs, "S")[0] == {"role": "system", "content": "S"}
    assert with_system_prompt("1+1?", "S") == "S\n\n1+1?"
    sys_first = ({"role": "system", "content": "be brief"}, *msgs)
    assert with_system_prompt(sys_first, "S")[0]["content"] == "S\n\nbe brief"
    batch = {
        "input_ids": np.array([[0, 5, 6, 7, 8, 0], [5, 5, 6, 7, 9, 9]], np.int32),
        "attention_mask": np.array([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], np.int32),
        "loss_mask": np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]], np.int32),
    }
    same = teacher_batch(batch, sources=None, completion_len=3, tokenizer=tok, system_prompt=None)
    assert all(same[k] is batch[k] for k in same)
    got = teacher_batch(
        batch, sources=[msgs, "ab"], completion_len=3, tokenizer=tok, system_prompt="S"
    )
    for k in ("input_ids", "attention_mask", "loss_mask"):
        np.testing.assert_array_equal(got[k][:, -3:], batch[k][:, -3:])
    assert got["loss_mask"][:, :-3].sum() == 0
    width = got["input_ids"].shape[1] - 3
    for i, src in enumerate([msgs, "ab"]):
        from jaxrl_llm.data import encode_prompt

        ids = encode_prompt(tok, with_system_prompt(src, "S"))
        assert tuple(got["input_ids"][i, width - len(ids) : width]) == ids
        assert got["attention_mask"][i, : width - len(ids)].sum() == 0


def _hf_teacher_with_its_own_tokenizer(d):
    """A tiny Llama HF directory with a word-level tokenizer (not the char one)."""
    import transformers
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    from jaxrl_llm.interop.hf_config import hf_config_dict
    from jaxrl_llm.interop.state_dict import params_to_hf_state_dict

    config = models.ModelConfig.tiny(vocab_size=97, eos_token_ids=(2,), pad_token_id=2)
    params = models.init_params(config, jax.random.PRNGKey(0))
    d.mkdir()
    save_file(params_to_hf_state_dict(params, config), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(hf_config_dict(config)))
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(94)]
    tok = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(d)


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path, capsys):
    teacher = tmp_path / "teacher_hf"
    _hf_teacher_with_its_own_tokenizer(teacher)
    rc = main(cli_args(tmp_path / "run", f"teacher.source={teacher}", "teacher.tokenizer=auto"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], lines  # one line, and the last
    err = errors[0]
    assert f"teacher.source='{teacher}'" in err and "model.source='tiny'" in err
    assert "with 97 tokens" in err and "CharTokenizer with" in err


def test_teacher_section_is_checked_against_the_algorithm(tmp_path):
    base = dict(
        output_dir=str(tmp_path),
        max_steps=1,
        data=dict(train="x.jsonl"),
        rewards=[dict(name="math_answer")],
        model=dict(source="tiny", tokenizer="char"),
    )
    with pytest.raises(ConfigError, match="needs a teacher model"):
        from_dict(RunConfig, dict(base, algorithm="distill"))
    with pytest.raises(ConfigError, match="uses no teacher"):
        from_dict(
            RunConfig, dict(base, algorithm="grpo", teacher=dict(source="tiny", tokenizer="char"))
        )
    teacher = dict(source="tiny", tokenizer="char")
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        from_dict(
            RunConfig,
            dict(
                base,
                algorithm="distill",
                teacher=teacher,
                distill=dict(reward_weight=1.0),
                rollout=dict(group_size=1),
            ),
        )
    with pytest.raises(ConfigError, match="teacher.tokenizer=char"):
        from_dict(RunConfig, dict(base, algorithm="distill", teacher=dict(source="tiny")))


def _cfg(out, **over):
    base = dict(
        output_dir=str(out),
        max_steps=4,
        algorithm="distill",
        seed=0,
        model=dict(source="tiny", tokenizer="char", tiny=TINY),
        teacher=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=2)),
        optim=dict(lr=1e-2),
        data=dict(train=f"{ROOT}/data/addition/train.jsonl", max_length=128),
        rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=3),
        rewards=[dict(name="math_answer")],
        logging=dict(tensorboard=False, plots=False),
        checkpoint=dict(save_every=2, keep=2),
        eval=dict(before=False),
    )
    base.update(over)
    return from_dict(RunConfig, base)


def test_resume_with_a_teacher_continues_exactly(tmp_path):
    """4 straight steps == 2 steps, stop, resume to 4: the teacher is loaded again (never
    checkpointed) and the run continues with the same samples, advantages and weights."""
    devnull = open(os.devnull, "w")
    train_online(_cfg(tmp_path / "a"), log_stream=devnull)
    train_online(_cfg(tmp_path / "b", max_steps=2), log_stream=devnull)
    train_online(_cfg(tmp_path / "b", resume=True), log_stream=devnull)
    a = {r["step"]: r for r in rows(tmp_path / "a")}
    b = {r["step"]: r for r in rows(tmp_path / "b")}
    assert sorted(b) == [1, 2, 3, 4]
    for s in (3, 4):
        for k in ("loss", "advantage/mean", "advantage/std", "distill/reverse_kl"):
            assert a[s][k] == b[s][k], (s, k)
    _, pa, _ = restore_model(str(tmp_path / "a" / "checkpoints"))
    _, pb, _ = restore_model(str(tmp_path / "b" / "checkpoints"))
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), pa, pb)


def test_gkd_lambda_zero_trains_on_the_data_rows_completions(tmp_path, capsys):
    """GKD's λ = 0: every step distils on the data set's own completions, not the samples;
    a data set without completions is refused in one line."""
    rows_in = [
        {"prompt": f"{a}+{b}=", "completion": str(a + b), "answer": str(a + b)}
        for a in range(4)
        for b in range(4)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows_in))
    common = ["teacher.tiny={num_layers: 2}", "loss.kind=gkd", "loss.lmbda=0.0"]
    out = tmp_path / "data_steps"
    rc = main(cli_args(out, *common, f"data.train={data}", f"data.eval={data}"))
    assert rc == 0, capsys.readouterr().err
    for r in rows(out):
        assert r["distill/on_policy"] == 0.0
        assert r["jsd"] > 0 and r["grad_norm"] > 0
        # the completions are the data's ("N" + EOS: 2 or 3 tokens), not the 4 sampled ones
        assert r["loss_tokens"] <= 3 * 8
    capsys.readouterr()
    rc = main(cli_args(tmp_path / "no_completions", *common))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "has none" in err[-1] and "loss.lmbda: 1" in err[-1]


def test_a_run_directory_as_teacher_loads_its_newest_checkpoint(tmp_path):
    """teacher.source = a jaxrl_llm run directory (no hf/ export): its newest checkpoint, run
    a's trained student, teaches the student's initial weights."""
    devnull = open(os.devnull, "w")
    train_online(_cfg(tmp_path / "a", max_steps=1), log_stream=devnull)
    teacher = dict(source=str(tmp_path / "a"), tokenizer="char")
    train_online(_cfg(tmp_path / "c", max_steps=1, teacher=teacher), log_stream=devnull)
    (c,) = rows(tmp_path / "c")
    assert c["advantage/std"] > 0 and np.isfinite(c["distill/reverse_kl"])


def test_gkd_refuses_a_teacher_with_another_vocabulary_width(tmp_path, capsys):
    """Same tokenizer, a padded vocabulary: reverse KL reads sampled tokens only, GKD compares
    whole distributions and refuses, in one line, before anything compiles."""
    args = ["teacher.tiny={num_layers: 1, vocab_size: 300}", "loss.kind=gkd"]
    rc = main(cli_args(tmp_path / "run", *args))
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "vocabulary of 300 logits" in last and "must be as wide" in last


STOP_IDS = "[2, " + ", ".join(str(3 + b) for b in b"abcdefghijklmnopqrstuvwxyz0123456789") + "]"


@pytest.mark.parametrize(
    "extra",
    [
        # a multi-turn environment: the teacher scores the policy's turns, not the env's
        [
            "env={name: tests.envs.scripted:Scripted, kwargs: {replies: [ok]}, max_turns: 3}",
            f"model.tiny={{num_layers: 1, eos_token_ids: {STOP_IDS}}}",
            "rollout.max_new_tokens=24",
            "rewards=[]",
        ],
        ["rollout.max_staleness=1"],  # asynchronous rollouts, one step behind
        ["logprobs.pack=true"],  # the update's rows packed
        ["rollout.max_staleness=1", "loss.kind=gkd"],
    ],
    ids=["env", "async", "packed", "async_gkd"],
)
def test_distillation_runs_with_environments_async_and_packing(tmp_path, capsys, extra):
    """The issue's "everything else works with it": each variant trains 2 steps with a
    2-layer teacher, and the teacher's signal reaches the update (non-zero advantages or
    JSD, a gradient)."""
    out = tmp_path / "run"
    rc = main(cli_args(out, "teacher.tiny={num_layers: 2}", *extra))
    assert rc == 0, capsys.readouterr().err
    got = rows(out)
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["grad_norm"] > 0
        assert r["jsd"] > 0 if "loss.kind=gkd" in extra else r["advantage/std"] > 0
    if extra[0].startswith("env="):
        assert all(r["env/turns_mean"] > 1 and r["env/failed"] == 0 for r in got)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["logprobs.pack=true", "loss.kind=gkd"], "logprobs.pack with loss.kind: gkd"),
        (
            ["env={name: single_turn}", "teacher.system_prompt=Add carefully."],
            "env with teacher.system_prompt",
        ),
    ],
    ids=["packed_gkd", "env_system_prompt"],
)
def test_what_distillation_cannot_combine_is_refused_in_one_line(tmp_path, capsys, extra, said):
    rc = main(cli_args(tmp_path / "run", *extra))
    err = capsys.readouterr().err
    assert rc == 2 and said in err and "Traceback" not in err


def test_a_teacher_larger_than_the_free_memory_is_refused_with_its_sizes(
    tmp_path, capsys, monkeypatch
):
    """The device has 1 KiB left (as an accelerator's memory_stats would say): the tiny
    2-layer teacher's float32 weights do not fit, and the run ends in one line with the sizes."""
    from jaxrl_llm.train.online import teacher as teacher_mod

    monkeypatch.setattr(teacher_mod, "free_memory", lambda device=None: 1024)
    rc = main(cli_args(tmp_path / "big", "teacher.tiny={num_layers: 2}"))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "parameters in float32 need" in err and "GiB per device" in err
    assert "0.00 GiB free there" in err

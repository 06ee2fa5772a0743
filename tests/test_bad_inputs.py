"""Bad-input corpus: every bad input given to the ``jaxrl-llm`` commands ends in exit status 2
(or its documented handling) and ONE line on stderr, without a traceback, that names the input
(file + line + field for data, the key for configs, the path for models, the flag for the
command line) and says what is allowed or what to do.

Each case goes through the user-facing entry point, ``jaxrl_llm.cli.main.main([...])``.
Config errors use ``--dry-run``; data and model errors start a real run on the tiny random
model (``model.source=tiny model.tokenizer=char``) and must stop before anything compiles.
The only cases that compile are the documented non-error handling: the ``drop`` / ``truncate``
length policies report their counts, and a reward function that raises, returns NaN or None
is scored invalid and counted while one that keeps returning the wrong count stops the run.
Runs on the 8 forced CPU devices of ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.errors import ConfigError
from tests.train.harness import TINY_MODEL as TINY
from tests.train.harness import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT, DPO, KTO, RANK, GRPO = (
    os.path.join(ROOT, "configs", f"{n}.yaml")
    for n in ("sft", "dpo", "kto", "pairwise_rank", "grpo")
)
DEVICES = 8  # tests/conftest.py: --xla_force_host_platform_device_count=8


# ----- fixtures: bad files ----------------------------------------------------------------------


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _tiny_hf_dir(path) -> None:
    """A Llama-family HF directory (config.json + model.safetensors, vocabulary 97)."""
    import jax
    from safetensors.numpy import save_file

    from jaxrl_llm import models
    from jaxrl_llm.interop.state_dict import params_to_hf_state_dict

    config = models.ModelConfig.tiny(
        vocab_size=97, eos_token_ids=(2,), pad_token_id=0, bos_token_id=1
    )
    params = models.init_params(config, jax.random.PRNGKey(0))
    path.mkdir()
    save_file(params_to_hf_state_dict(params, config), str(path / "model.safetensors"))
    hf = dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    (path / "config.json").write_text(json.dumps(hf))


def _copy_with(src, dst, *, config=None, weights=None, extra=None) -> None:
    """Copy an HF directory, replacing config.json keys / the weights bytes / adding files."""
    import shutil

    shutil.copytree(src, dst)
    if config is not None:
        hf = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**hf, **config}))
    if weights is not None:
        if weights == b"":
            (dst / "model.safetensors").unlink()
        else:
            (dst / "model.safetensors").write_bytes(weights)
    for name, content in (extra or {}).items():
        (dst / name).write_bytes(content if isinstance(content, bytes) else content.encode())


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """A directory of bad inputs: data files, configs and model directories."""
    d = tmp_path_factory.mktemp("bad")
    ok = {"prompt": "2+2=", "completion": "4"}
    # data: the problem is on line 2 (line 1 is good) so that the line number is checked.
    (d / "malformed.jsonl").write_text(json.dumps(ok) + '\n{"prompt": "a", "completion": \n')
    _jsonl(d / "missing.jsonl", [ok, {"prompt": "a"}])
    _jsonl(d / "wrongtype.jsonl", [ok, {"prompt": "a", "completion": 3}])
    _jsonl(d / "emptycomp.jsonl", [ok, {"prompt": "a", "completion": "   "}])
    (d / "nonutf8.jsonl").write_bytes(
        json.dumps(ok).encode() + b'\n{"prompt": "a\xff\xfe", "completion": "b"}\n'
    )
    (d / "notobject.jsonl").write_text('["prompt", "completion"]\n')
    _jsonl(
        d / "badrole.jsonl",
        [
            {
                "messages": [
                    {"role": "human", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            }
        ],
    )
    _jsonl(d / "long.jsonl", [ok, {"prompt": "x" * 300, "completion": "y"}])
    _jsonl(d / "few.jsonl", [ok, ok])
    _jsonl(
        d / "mixedlen.jsonl",
        [{"prompt": f"q{i}", "completion": "a"} for i in range(10)]
        + [{"prompt": "x" * 200, "completion": "y"}] * 3,
    )
    (d / "empty.jsonl").write_text("\n\n")
    (d / "data.csv").write_text("prompt,completion\n2+2=,4\n")
    (d / "corrupt.parquet").write_bytes(b"this is not parquet")
    _jsonl(d / "badlabel.jsonl", [{"prompt": "a", "completion": "b", "label": "yes"}])
    _jsonl(d / "badrank.jsonl", [{"prompt": "a", "responses": ["b", "c"], "scores": [1.0]}])
    _jsonl(d / "noprompt.jsonl", [{"question": "1+1", "answer": "2"}] * 8)
    modes = ["raise", "nan", "none", "ok"]
    _jsonl(d / "prompts.jsonl", [{"prompt": f"{i % 10}>", "mode": modes[i % 4]} for i in range(40)])
    # configs
    (d / "badyaml.yaml").write_text(
        "seed: 0\noutput_dir: x\nmax_steps: 3\nalgorithm: sft\n"
        "data:\n  train: a.jsonl\n   eval: b.jsonl\n"
    )
    (d / "list.yaml").write_text("- algorithm: sft\n- max_steps: 3\n")
    (d / "adir").mkdir()
    (d / "oldrun" / "checkpoints" / "3").mkdir(parents=True)
    # models
    _tiny_hf_dir(d / "hf")
    weights = (d / "hf" / "model.safetensors").read_bytes()
    _copy_with(
        d / "hf", d / "gpt2", config=dict(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    )
    _copy_with(
        d / "hf", d / "bert", config=dict(model_type="bert", architectures=["BertForMaskedLM"])
    )
    _copy_with(d / "hf", d / "truncated", weights=weights[: len(weights) // 2])
    _copy_with(d / "hf", d / "garbage", weights=b"not a safetensors file" * 8)
    _copy_with(d / "hf", d / "pickle", weights=b"", extra={"pytorch_model.bin": b"\x80\x04"})
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {f"w{i}": i for i in range(120)} | {"[UNK]": 120}  # 121 tokens > 97
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    _copy_with(
        d / "hf",
        d / "bigtok",
        extra={
            "tokenizer.json": tok.to_str(),
            "tokenizer_config.json": json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "unk_token": "[UNK]",
                    "eos_token": "w2",
                    "pad_token": "w0",
                }
            ),
        },
    )
    # issue 21 §4: a lone surrogate escape, nesting deeper than Python's recursion limit,
    # duplicate YAML keys, a YAML alias bomb, a config.json that is a list, a non-empty OUT
    (d / "surrogate.jsonl").write_text(
        json.dumps(ok) + '\n{"prompt": "\\ud800", "completion": "4"}\n', encoding="utf-8"
    )
    (d / "deep.jsonl").write_text(
        json.dumps(ok) + '\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    )
    (d / "dupkey.yaml").write_text(
        "seed: 0\noutput_dir: x\nmax_steps: 3\nalgorithm: sft\nmax_steps: 4\n"
    )
    # 9 levels of 9 aliases each: 9**9 (387 million) values once expanded
    (d / "bomb.yaml").write_text(
        "seed: 0\noutput_dir: x\nmax_steps: 3\nalgorithm: sft\ndata:\n  train: a.jsonl\n"
        "model:\n  tiny: {bomb: &a [x, x, x, x, x, x, x, x, x]}\n"
        + "".join(
            f"{b}: &{b} [" + ", ".join([f"*{a}"] * 9) + "]\n"
            for a, b in zip("abcdefgh", "bcdefghi")
        )
    )
    _copy_with(d / "hf", d / "cfglist", config=None, extra={"config.json": "[1, 2]"})
    (d / "afile").write_text("a file, not a directory")
    (d / "nonempty").mkdir()
    (d / "nonempty" / "config.json").write_text("{}")
    (d / "notgguf.gguf").write_bytes(b"hello, world" * 8)
    (d / "corrupt.gguf").write_bytes(b"GGUF" + b"\x00" * 60)
    # issue 43
    (d / "truncated.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")  # 8 bytes: the header ends
    (d / "bigint.jsonl").write_text(
        json.dumps(ok) + '\n{"prompt": "a", "completion": "b", "n": ' + "9" * 5000 + "}\n"
    )
    (d / "deep.yaml").write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    os.symlink(d / "loop2", d / "loop1")
    os.symlink(d / "loop1", d / "loop2")
    return d


@pytest.fixture(autouse=True)
def _private_model_cache(tmp_path, monkeypatch):
    """A GGUF conversion attempt must not touch the user's model cache."""
    monkeypatch.setenv("JAXRL_LLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("JAXRL_LLM_TRACEBACK", raising=False)


#: a long phase's start or end line (train.run.progress.phase), printed before a later error
PHASE_LINE = re.compile(r".+: (started|done in \d+\.\d s)")


def error_line(err: str, command: str, *, before: tuple[str, ...] = ()) -> str:
    """The one error line of ``err``; fails on a traceback or on any other line, except lines
    starting with one of ``before`` (progress a run prints before it stops)."""
    assert "Traceback" not in err, err
    # a run says what it starts before its model loads (train.api.start_line)
    # and each long phase's start and end (train.run.progress.phase: PHASE_LINE)
    lines = [
        ln
        for ln in err.strip().splitlines()
        if not ln.startswith("start: ") and not PHASE_LINE.fullmatch(ln)
    ]
    assert lines, "nothing on stderr"
    *rest, last = lines
    assert last.startswith(f"jaxrl-llm {command}: error: "), err
    assert all(line.startswith(before) for line in rest) if before else not rest, err
    return last


# ----- the corpus -----------------------------------------------------------------------------
# (argv, substrings the error line must contain). "{d}" is the bad-input directory, "{out}" a
# fresh output directory. Each error line names the input and says what is allowed / to do.


def _train(config, *overrides, dry=False):
    return ["train", config, "output_dir={out}", *TINY, *overrides] + (["--dry-run"] if dry else [])


DATA = {
    # issue 43
    "huge-integer": (
        _train(SFT, "data.train={d}/bigint.jsonl"),
        ["bigint.jsonl line 2", "a value cannot be read", "value has 5000 digits"],
    ),
    "hub-path-traversal": (
        _train(SFT, "data.train=hf:../../etc"),
        ["hf:../../etc: not a hub dataset name", "expected hf:org/name"],
    ),
    "symlink-loop": (
        _train(SFT, "data.train={d}/loop1"),
        ["loop1: cannot be resolved", "a symlink loop"],
    ),
    "malformed-json": (
        _train(SFT, "data.train={d}/malformed.jsonl"),
        ["malformed.jsonl line 2", "malformed JSON at column"],
    ),
    "missing-field": (
        _train(SFT, "data.train={d}/missing.jsonl"),
        ["missing.jsonl line 2", "missing field 'completion'", "fields present"],
    ),
    "wrong-type": (
        _train(SFT, "data.train={d}/wrongtype.jsonl"),
        ["wrongtype.jsonl line 2", "field 'completion'", "expected a string", "int"],
    ),
    "empty-completion": (
        _train(SFT, "data.train={d}/emptycomp.jsonl"),
        ["emptycomp.jsonl line 2", "field 'completion'", "empty text"],
    ),
    "non-utf8": (
        _train(SFT, "data.train={d}/nonutf8.jsonl"),
        ["nonutf8.jsonl line 2", "not valid UTF-8", "re-encode the file as UTF-8"],
    ),
    "line-not-an-object": (
        _train(SFT, "data.train={d}/notobject.jsonl"),
        ["notobject.jsonl line 1", "expected a JSON object per line"],
    ),
    "bad-message-role": (
        _train(SFT, "data.train={d}/badrole.jsonl"),
        ["badrole.jsonl line 1", "'messages[0].role'", "expected one of", "'human'"],
    ),
    "too-long-error-policy": (
        _train(SFT, "data.train={d}/long.jsonl", "data.max_length=64", "data.length_policy=error"),
        ["long.jsonl line 2", "tokens exceed max_len=64", "use length_policy 'truncate' or 'drop'"],
    ),
    "all-dropped": (
        _train(SFT, "data.train={d}/long.jsonl", "data.max_length=4", "data.length_policy=drop"),
        ["long.jsonl", "every example was dropped by max_len=4", "raise max_len"],
    ),
    "too-few-for-a-batch": (
        _train(SFT, "data.train={d}/few.jsonl"),
        ["few.jsonl", "2 examples", "train.batch_size=8", "lower train.batch_size"],
    ),
    "empty-data-set": (
        _train(SFT, "data.train={d}/empty.jsonl"),
        ["empty.jsonl", "empty data set"],
    ),
    "lone-surrogate": (
        _train(SFT, "data.train={d}/surrogate.jsonl"),
        ["surrogate.jsonl line 2", "lone surrogate", "U+D800"],
    ),
    "nesting-too-deep": (
        _train(SFT, "data.train={d}/deep.jsonl"),
        ["deep.jsonl line 2", "nested too deeply"],
    ),
    "nonexistent-file": (
        _train(SFT, "data.train={d}/nope.jsonl"),
        ["nope.jsonl", "no such data file"],
    ),
    "unsupported-extension": (
        _train(SFT, "data.train={d}/data.csv"),
        ["data.csv", "unsupported data source", "a .jsonl file", "a .parquet file"],
    ),
    "corrupt-parquet": (
        _train(SFT, "data.train={d}/corrupt.parquet"),
        ["corrupt.parquet", "not a readable Parquet file"],
    ),
    "bad-eval-file": (
        _train(
            SFT, "data.train=" + ROOT + "/data/arith_sft/train.jsonl", "data.eval={d}/missing.jsonl"
        ),
        ["missing.jsonl line 2", "missing field 'completion'"],
    ),
    "kto-on-pairs-only-data": (
        _train(KTO, "data.train=" + ROOT + "/data/arith_prefs/train.jsonl"),
        [
            "arith_prefs/train.jsonl line 1",
            "missing field 'label'",
            "look like preference data",
            "not kto data",
        ],
    ),
    "dpo-on-kto-data": (
        _train(DPO, "data.train=" + ROOT + "/data/arith_kto/train.jsonl"),
        ["arith_kto/train.jsonl line 1", "missing field 'chosen'", "look like kto data"],
    ),
    "kto-label-not-bool": (
        _train(KTO, "data.train={d}/badlabel.jsonl"),
        ["badlabel.jsonl line 1", "field 'label'", "expected true or false"],
    ),
    "rank-scores-mismatch": (
        _train(RANK, "data.train={d}/badrank.jsonl"),
        ["badrank.jsonl line 1", "field 'scores'", "must match"],
    ),
    "online-prompt-missing": (
        _train(GRPO, "data.train={d}/noprompt.jsonl"),
        ["noprompt.jsonl line 1", "missing field 'prompt'", "['answer', 'question']"],
    ),
}

DISTILL = os.path.join(ROOT, "configs", "distill.yaml")
TINY_TEACHER = ["teacher.source=tiny", "teacher.tokenizer=char"]
CONFIG = {
    # issue 43: one line per fault
    "yaml-nested-20000-deep": (
        ["train", "{d}/deep.yaml", "--dry-run"],
        ["deep.yaml", "nested more than 100 levels deep"],
    ),
    "output-dir-symlink-loop": (
        ["train", SFT, "output_dir={d}/loop1", *TINY, "--dry-run"],
        ["output_dir", "loop1", "is a symbolic link that leads nowhere"],
    ),
    "routing-replay-on-a-dense-model": (
        _train(GRPO, "rollout.routing_replay=true", dry=True),
        [
            "rollout.routing_replay",
            "is a dense model (no experts)",
            "leave rollout.routing_replay out",
        ],
    ),
    # issue 43: bounded inputs, refused by --dry-run before anything loads
    "group-size-beyond-memory": (
        _train(GRPO, "rollout.group_size=1000000", dry=True),
        [
            "rollout.prompts_per_step x group_size = 4 x 1000000 rows",
            "GiB per device by the memory estimate (jaxrl-llm memory --algorithm grpo)",
            "GiB a cpu device has free",
            "lower rollout.group_size",
        ],
    ),
    "temperature-below-the-floor": (
        _train(GRPO, "rollout.temperature=1e-30", dry=True),
        ["rollout.temperature=1e-30 is below 0.01", "use at least 0.01"],
    ),
    "prompt-and-budget-beyond-the-context": (
        _train(GRPO, "data.max_length=200", "rollout.max_new_tokens=100", dry=True),
        [
            "rollout.max_new_tokens=100 with data.max_length=200",
            "exceed the model's context of 256 tokens",
            "use at most 56",
        ],
    ),
    "teacher-prompt-beyond-the-teachers-context": (
        _train(DISTILL, *TINY_TEACHER, "teacher.system_prompt=" + "x" * 1000, dry=True),
        [
            "teacher.system_prompt (1000 tokens)",
            "exceed the teacher's context of 256 tokens",
            "shorten teacher.system_prompt to at most 112 tokens",
        ],
    ),
    "seed-negative": (_train(SFT, "seed=-1", dry=True), ["seed", "[0, 4294967295]", "-1"]),
    "seed-not-an-integer": (_train(SFT, "seed=1e23", dry=True), ["seed", "expected an integer"]),
    "output-dir-under-a-file": (
        _train(SFT, "output_dir={d}/afile/run", dry=True),
        ["output_dir", "afile", "is a file, not a directory"],
    ),
    "output-dir-under-proc": (
        _train(SFT, "output_dir=/proc/jaxrl_llm_run", dry=True),
        ["output_dir", "'/proc'", "not writable"],
    ),
    "output-dir-not-utf8": (
        _train(SFT, "output_dir={out}\udcff", dry=True),
        ["output_dir", "not valid UTF-8"],
    ),
    "duplicate-yaml-key": (
        ["train", "{d}/dupkey.yaml", "--dry-run"],
        ["dupkey.yaml", "line 5", "duplicate key 'max_steps'", "first on line 3"],
    ),
    "yaml-alias-bomb": (
        ["train", "{d}/bomb.yaml", "--dry-run"],
        ["bomb.yaml", "expands to more than 100,000 values", "aliases"],
    ),
    "beta-infinite": (_train(DPO, "loss.beta=.inf", dry=True), ["loss.beta", "finite number"]),
    "weight-decay-infinite": (
        _train(SFT, "optim.weight_decay=.inf", dry=True),
        ["optim.weight_decay", "finite number"],
    ),
    "lr-nan": (_train(SFT, "optim.lr=.nan", dry=True), ["optim.lr", "finite number"]),
    "dry-run-missing-data": (
        _train(SFT, "data.train={d}/nope.jsonl", dry=True),
        ["data.train", "no such data file", "nope.jsonl"],
    ),
    "unknown-top-level-key": (
        _train(SFT, "max_step=3", dry=True),
        ["unknown config key 'max_step'", "did you mean 'max_steps'", "allowed keys"],
    ),
    "unknown-nested-key": (
        _train(SFT, "optim.lrr=1e-4", dry=True),
        ["unknown config key 'optim.lrr'", "did you mean 'lr'", "allowed keys under 'optim'"],
    ),
    "unknown-loss-key": (
        _train(DPO, "loss.betta=0.1", dry=True),
        ["unknown config key 'loss.betta'", "did you mean 'beta'"],
    ),
    "unknown-dotted-override": (
        _train(SFT, "optim.adam.b1=0.9", dry=True),
        ["unknown config key 'optim.adam'", "allowed keys under 'optim'"],
    ),
    "override-into-a-value": (
        _train(SFT, "max_steps.x=1", dry=True),
        ["'max_steps.x=1'", "'max_steps' is a value, not a section"],
    ),
    "override-into-a-list": (
        _train(GRPO, "rewards.0.name=x", dry=True),
        ["'rewards.0.name=x'", "'rewards' is a list", "override it whole"],
    ),
    "override-without-equals": (
        ["train", SFT, "max_steps", "--dry-run"],
        ["override 'max_steps'", "must look like dotted.key=value"],
    ),
    "override-without-equals-after-option": (
        ["train", SFT, "--dry-run", "max_steps"],
        ["override 'max_steps'", "dotted.key=value"],
    ),
    "wrong-type-number": (
        _train(SFT, "optim.lr=fast", dry=True),
        ["optim.lr", "expected a number", "'fast'"],
    ),
    "wrong-type-integer": (
        _train(SFT, "max_steps=2.5", dry=True),
        ["max_steps", "expected an integer", "2.5"],
    ),
    "wrong-type-bool": (
        _train(SFT, "data.packing=maybe", dry=True),
        ["data.packing", "expected true or false"],
    ),
    "wrong-type-section": (
        _train(SFT, "optim=3", dry=True),
        ["optim", "expected a mapping of", "'lr'"],
    ),
    "bad-enum": (
        _train(SFT, "model.remat=sometimes", dry=True),
        ["model.remat", "one of 'none', 'dots', 'full'", "'sometimes'"],
    ),
    "bad-algorithm": (
        _train(SFT, "algorithm=dpo2", dry=True),
        ["algorithm", "unknown 'dpo2'", "allowed", "simpo"],
    ),
    "zero-max-steps": (_train(SFT, "max_steps=0", dry=True), ["max_steps must be >= 1, got 0"]),
    "negative-max-steps": (
        _train(SFT, "max_steps=-3", dry=True),
        ["max_steps must be >= 1, got -3"],
    ),
    "zero-lr": (_train(SFT, "optim.lr=0", dry=True), ["optim.lr must be", "> 0, got 0.0"]),
    "negative-lr": (_train(SFT, "optim.lr=-1e-5", dry=True), ["optim.lr must be", "-1e-05"]),
    "bad-adam-beta": (_train(SFT, "optim.b2=1.5", dry=True), ["optim.b2 must be in [0, 1)"]),
    "zero-max-length": (
        _train(SFT, "data.max_length=0", dry=True),
        ["data.max_length must be >= 2", "got 0"],
    ),
    "zero-log-every": (
        _train(SFT, "logging.log_every=0", dry=True),
        ["logging.log_every must be >= 1"],
    ),
    "zero-keep": (_train(SFT, "checkpoint.keep=0", dry=True), ["checkpoint.keep must be >= 1"]),
    "lora-rank-zero": (
        _train(SFT, "model.lora.rank=0", dry=True),
        ["model.lora.rank must be >= 1", "model.lora=null"],
    ),
    "lora-unknown-target": (
        _train(SFT, "model.lora.targets=[qkv]", dry=True),
        ["model.lora.targets", "['qkv']", "allowed", "q_proj"],
    ),
    "empty-output-dir": (_train(SFT, "output_dir=", dry=True), ["output_dir", "is required"]),
    "loss-value": (_train(DPO, "loss.beta=-0.1", dry=True), ["loss: ", "beta=-0.1", "> 0"]),
    "rollout-top-p": (
        _train(GRPO, "rollout.top_p=1.5", dry=True),
        ["rollout.top_p must be in (0, 1]", "1.5"],
    ),
    "rollout-temperature": (
        _train(GRPO, "rollout.temperature=0", dry=True),
        ["rollout.temperature must be", "> 0"],
    ),
    "grpo-group-size-1": (
        _train(GRPO, "rollout.group_size=1", dry=True),
        ["rollout.group_size=1", "grpo needs groups of at least 2"],
    ),
    "online-without-rewards": (
        _train(GRPO, "rewards=[]", dry=True),
        ["rewards", "needs at least one reward", "math_answer"],
    ),
    "offline-with-rewards": (
        _train(SFT, "rewards=[{name: math_answer}]", dry=True),
        ["rewards", "sft is an offline algorithm", "remove the rewards"],
    ),
    "tiny-without-char-tokenizer": (
        _train(SFT, "model.tokenizer=auto", dry=True),
        ["model.source=tiny needs model.tokenizer=char"],
    ),
    "batch-not-divisible-by-mesh": (
        _train(SFT, "train.batch_size=12", dry=True),
        [
            "train.batch_size",
            "=12 rows",
            f"data x fsdp = {DEVICES} devices",
            f"multiple of {DEVICES}",
        ],
    ),
    "rollout-not-divisible-by-mesh": (
        _train(GRPO, "rollout.prompts_per_step=3", "rollout.group_size=3", dry=True),
        ["rollout.prompts_per_step x group_size", "9 rows", f"multiple of {DEVICES}"],
    ),
    "mesh-not-device-count": (
        _train(SFT, "mesh.data=3", dry=True),
        ["mesh sizes", "multiply to 3", f"{DEVICES} devices"],
    ),
    "mesh-zero-axis": (
        _train(SFT, "mesh.fsdp=0", dry=True),
        ["mesh.fsdp=0 is invalid", "positive size or -1"],
    ),
    "missing-config-file": (
        ["train", "{d}/nope.yaml", "--dry-run"],
        ["nope.yaml", "does not exist"],
    ),
    "yaml-syntax-error": (
        ["train", "{d}/badyaml.yaml", "--dry-run"],
        ["badyaml.yaml", "line 7", "invalid YAML"],
    ),
    "yaml-not-a-mapping": (
        ["train", "{d}/list.yaml", "--dry-run"],
        ["list.yaml", "top level must be a mapping"],
    ),
    "config-is-a-directory": (
        ["train", "{d}/adir", "--dry-run"],
        ["adir", "is a directory", "pass a YAML file"],
    ),
    "fresh-run-over-checkpoints": (
        _train(SFT, "output_dir={d}/oldrun", dry=True),
        ["oldrun", "already holds checkpoints", "latest step 3", "--resume"],
    ),
    "unknown-option": (
        ["train", SFT, "--no-such-flag"],
        ["unrecognized arguments: --no-such-flag", "--help"],
    ),
}

MODELS = {
    "alias-typo": (  # issue 42: the closest alias named
        _train(SFT, "model.source=smollm2-135m"),
        ["'smollm2-135m': not a model alias", "(did you mean 'smollm2-135m-instruct'?)"],
    ),
    "wrong-path": (
        _train(SFT, "model.source={d}/no_model"),
        ["no_model", "no such file or directory", "known aliases"],
    ),
    "unsupported-architecture-gpt2": (
        _train(SFT, "model.source={d}/gpt2"),
        ["gpt2/config.json", "unsupported architecture", "model_type='gpt2'", "supported", "llama"],
    ),
    "unsupported-architecture-bert": (
        ["convert", "{d}/bert", "{out}"],
        ["bert/config.json", "model_type='bert'", "supported"],
    ),
    "truncated-safetensors": (
        _train(SFT, "model.source={d}/truncated"),
        ["truncated/model.safetensors", "not a readable safetensors file"],
    ),
    "garbage-safetensors": (
        ["convert", "{d}/garbage", "{out}"],
        ["garbage/model.safetensors", "truncated or corrupt"],
    ),
    "pickle-weights-only": (
        _train(SFT, "model.source={d}/pickle"),
        ["pickle", "no *.safetensors weights", "pytorch_model.bin", "never loaded"],
    ),
    "not-a-gguf-file": (
        _train(SFT, "model.source={d}/notgguf.gguf"),
        ["notgguf.gguf", "not a GGUF file", "expected b'GGUF'"],
    ),
    "truncated-gguf": (
        _train(SFT, "model.source={d}/truncated.gguf"),
        ["truncated.gguf", "a truncated or corrupt GGUF file (8 bytes", "download it again"],
    ),
    "corrupt-gguf": (
        _train(SFT, "model.source={d}/corrupt.gguf"),
        ["corrupt.gguf", "cannot read this GGUF file"],
    ),
    "char-tokenizer-vs-model-vocab": (
        _train(SFT, "model.source={d}/hf"),
        ["model.source='{d}/hf'", "model.tokenizer=char has 259 tokens", "vocabulary has 97"],
    ),
    "tiny-vocab-below-tokenizer": (
        _train(SFT, "model.tiny.vocab_size=50"),
        ["model.tiny.vocab_size", "has 259 tokens", "vocabulary has 50"],
    ),
    "tiny-unknown-key": (
        _train(SFT, "model.tiny.layers=1"),
        ["model.tiny", "unknown key(s) ['layers']", "num_layers"],
    ),
    "hf-tokenizer-vs-model-vocab": (
        ["generate", "--model", "{d}/bigtok", "--prompt", "w1"],
        ["bigtok", "tokenizer has 121 tokens", "vocab_size is 97"],
    ),
    "generate-without-tokenizer": (
        ["generate", "--model", "{d}/hf", "--prompt", "hi"],
        ["{d}/hf", "no tokenizer files", "needs a tokenizer"],
    ),
    "convert-wrong-path": (
        ["convert", "{d}/no_model", "{out}"],
        ["no_model", "no such file or directory"],
    ),
    "convert-out-is-a-file": (
        ["convert", "{d}/hf", "{d}/data.csv"],
        ["data.csv", "exists and is not a directory"],
    ),
    "memory-wrong-path": (
        ["memory", "--algorithm", "grpo", "--model", "{d}/no_model"],
        ["--model", "no_model", "not a preset", "no config.json"],
    ),
    "memory-unsupported-architecture": (
        ["memory", "--algorithm", "grpo", "--model", "{d}/bert/config.json"],
        ["--model", "bert/config.json", "model_type='bert'"],
    ),
}

REWARD_SETUP = [
    "data.train={d}/prompts.jsonl",
    "rollout.prompts_per_step=4",
    "rollout.group_size=2",
    "rollout.max_new_tokens=1",
    "eval.before=false",
]
REWARDS = {
    "unknown-reward-name": (
        _train(GRPO, *REWARD_SETUP, "rewards=[{name: nope}]"),
        ["rewards[0].name", "unknown reward 'nope'", "available", "math_answer"],
    ),
    "reward-module-not-importable": (
        _train(GRPO, *REWARD_SETUP, "rewards=[{name: nopkg.mod:fn}]"),
        ["rewards[0].name", "cannot import reward 'nopkg.mod:fn'", "No module named 'nopkg'"],
    ),
    "reward-function-missing": (
        _train(GRPO, *REWARD_SETUP, "rewards=[{name: tests.test_bad_inputs:no_such_fn}]"),
        ["rewards[0].name", "tests.test_bad_inputs:no_such_fn", "has no attribute 'no_such_fn'"],
    ),
    "unknown-reward-kwarg": (
        _train(GRPO, *REWARD_SETUP, "rewards=[{name: math_answer, kwargs: {toleranse: 0.1}}]"),
        ["rewards[0].kwargs", "math_answer_reward", "unexpected keyword argument 'toleranse'"],
    ),
    "unknown-kwarg-of-own-reward": (
        _train(
            GRPO,
            *REWARD_SETUP,
            "rewards=[{name: 'tests.test_bad_inputs:reward_plain', kwargs: {nope: 1}}]",
        ),
        ["rewards[0].kwargs", "reward_plain", "'nope'"],
    ),
    "too-few-prompts-for-a-step": (
        _train(
            GRPO,
            "data.train={d}/prompts.jsonl",
            "rollout.prompts_per_step=64",
            "rollout.group_size=2",
        ),
        [
            "prompts.jsonl",
            "40 prompts",
            "rollout.prompts_per_step=64",
            "lower rollout.prompts_per_step",
        ],
    ),
}

GENERATE = {
    # issue 43: jaxrl-llm memory / convert
    "memory-tensor-not-dividing-the-heads": (
        ["memory", "--algorithm", "grpo", "--mesh", "tensor=7"],
        ["--mesh tensor=7 does not divide 135m's 9 attention heads", "use a divisor of 9"],
    ),
    "memory-unknown-axis": (
        ["memory", "--algorithm", "grpo", "--mesh", "model=2"],
        ["--mesh: unknown axis 'model'", "allowed: data, fsdp, tensor, expert, context"],
    ),
    "memory-experts-of-a-dense-model": (
        ["memory", "--algorithm", "grpo", "--mesh", "expert=2"],
        ["--mesh expert=2", "is a dense model, with no experts to split"],
    ),
    "memory-teacher-without-distillation": (
        ["memory", "--algorithm", "grpo", "--teacher-model", "135m"],
        ["--teacher-model: grpo holds no teacher", "--algorithm distill"],
    ),
    "convert-truncated-gguf": (
        ["convert", "{d}/truncated.gguf", "{out}"],
        ["truncated.gguf", "a truncated or corrupt GGUF file"],
    ),
    "convert-symlink-loop": (
        ["convert", "{d}/loop1", "{out}"],
        ["SRC", "loop1: cannot be resolved", "a symlink loop?"],
    ),
    "seed-negative": (
        ["generate", "--prompt", "hi", "--seed", "-1"],
        ["--seed", "[0, 4294967295]", "-1"],
    ),
    "seed-not-an-integer": (
        ["generate", "--prompt", "hi", "--seed", "1e23"],
        ["argument --seed", "invalid int value: '1e23'"],
    ),
    "max-new-tokens-beyond-context": (
        ["generate", "--prompt", "hi", "--max-new-tokens", "100000000"],
        ["--max-new-tokens 100000000", "context of 8192 tokens", "use at most"],
    ),
    "num-samples-beyond-memory": (
        ["generate", "--prompt", "hi", "--num-samples", "10000000"],
        ["--num-samples 10000000", "GiB", "more than this machine has free", "rows fit"],
    ),
    "convert-config-not-an-object": (
        ["convert", "{d}/cfglist", "{out}"],
        ["cfglist/config.json", "expected a JSON object", "list"],
    ),
    "convert-into-non-empty-dir": (
        ["convert", "{d}/hf", "{d}/nonempty"],
        ["nonempty", "not empty", "--force"],
    ),
    "negative-max-new-tokens": (
        ["generate", "--prompt", "hi", "--max-new-tokens", "-3"],
        ["--max-new-tokens must be >= 1", "-3"],
    ),
    "top-p-above-one": (
        ["generate", "--prompt", "hi", "--top-p", "1.5"],
        ["--top-p must be in (0, 1]", "1.5"],
    ),
    "top-p-zero": (["generate", "--prompt", "hi", "--top-p", "0"], ["--top-p must be in (0, 1]"]),
    "top-p-not-a-number": (
        ["generate", "--prompt", "hi", "--top-p", "most"],
        ["argument --top-p", "invalid float value: 'most'", "--help"],
    ),
    "negative-temperature": (
        ["generate", "--prompt", "hi", "--temperature", "-1"],
        ["--temperature must be > 0", "--greedy"],
    ),
    "greedy-with-top-k": (
        ["generate", "--prompt", "hi", "--greedy", "--top-k", "5"],
        ["--greedy cannot be combined", "--top-k"],
    ),
    "empty-prompt": (["generate", "--prompt", ""], ["--prompt must not be empty"]),
    "alias-typo": (
        ["generate", "--model", "smollm2-135m", "--prompt", "hi"],
        ["(did you mean 'smollm2-135m-instruct'?)"],
    ),
    "unknown-model": (
        ["generate", "--model", "no-such-model", "--prompt", "hi"],
        ["no-such-model", "not a model alias", "smollm2-135m-instruct"],
    ),
    "memory-bad-mesh": (
        ["memory", "--algorithm", "grpo", "--mesh", "data=0"],
        ["--mesh", "'data' must be >= 1"],
    ),
    "memory-unknown-algorithm": (
        ["memory", "--algorithm", "grpo2"],
        ["--algorithm", "invalid choice: 'grpo2'", "--help"],
    ),
}

# Issue 31: environments and sizes, refused before anything compiles (``--dry-run`` runs the
# environment probe a real run makes). The environment classes are at the end of this file.
ENV_SETUP = ["data.train={d}/prompts.jsonl", "rollout.prompts_per_step=4", "rollout.group_size=2"]
ISSUE31 = {
    "env-init-raises": (
        _train(GRPO, *ENV_SETUP, "env={name: 'tests.test_bad_inputs:InitRaises'}", dry=True),
        ["env.kwargs", "InitRaises", "failed: OSError: no such service"],
    ),
    "env-init-exits": (
        _train(GRPO, *ENV_SETUP, "env={name: 'tests.test_bad_inputs:InitExits'}", dry=True),
        ["env.kwargs", "InitExits", "failed: SystemExit: 3"],
    ),
    "env-reset-empty": (
        _train(GRPO, *ENV_SETUP, "env={name: 'tests.test_bad_inputs:EmptyOpening'}", dry=True),
        ["env.name", "reset returned no messages (an empty opening)"],
    ),
    "env-step-raises-dry-run": (
        _train(GRPO, *ENV_SETUP, "env={name: 'tests.test_bad_inputs:StepRaises'}", dry=True),
        ["env.name", "failed its start-up check", "KeyError: 'x'", "env.check=false"],
    ),
    "env-step-hangs-dry-run": (
        _train(
            GRPO,
            *ENV_SETUP,
            "env={name: 'tests.test_bad_inputs:StepHangs', step_timeout_s: 0.5}",
            dry=True,
        ),
        ["env.name", "failed its start-up check", "timeout: no answer after 0.5 s"],
    ),
    "env-unknown-tool-in-a-string": (
        _train(GRPO, *ENV_SETUP, "env={name: tools, kwargs: {tools: calculater}}", dry=True),
        ["env.kwargs", "unknown tool 'calculater'", "calculator"],
    ),
    "char-tokenizer-tiny-vocab-above-259": (
        _train(GRPO, "model.tiny.vocab_size=300", dry=True),
        [
            "model.tiny.vocab_size=300",
            "char tokenizer has 259 tokens",
            "leave model.tiny.vocab_size",
        ],
    ),
    "rollout-max-new-tokens-past-context": (
        _train(
            GRPO,
            "model.tiny.max_position_embeddings=8192",
            "rollout.max_new_tokens=9000",
            dry=True,
        ),
        [
            "rollout.max_new_tokens=9000",
            "context of 8192 tokens",
            "use at most 8191",
            "data.max_length",
            "longer context",
        ],
    ),
    "rollout-max-new-tokens-1e8": (
        _train(GRPO, "rollout.max_new_tokens=100000000"),
        ["rollout.max_new_tokens=100000000", "context of 256 tokens"],
    ),
    "env-step-timeout-zero": (
        _train(GRPO, "env={name: single_turn, step_timeout_s: 0}", dry=True),
        ["env.step_timeout_s", "seconds > 0"],
    ),
    "reward-timeout-negative": (
        _train(GRPO, "rewards=[{name: math_answer, timeout_s: -1}]", dry=True),
        ["rewards[].timeout_s", "seconds > 0"],
    ),
}

CASES = {
    **{f"issue31/{k}": v for k, v in ISSUE31.items()},
    **{f"data/{k}": v for k, v in DATA.items()},
    **{f"config/{k}": v for k, v in CONFIG.items()},
    **{f"model/{k}": v for k, v in MODELS.items()},
    **{f"reward/{k}": v for k, v in REWARDS.items()},
    **{f"cli/{k}": v for k, v in GENERATE.items()},
}
# Lines a run prints before the error: the data counts that explain it, and the data line an
# online run prints before it resolves its reward functions (jaxrl_llm/train/online/trainer.py).
BEFORE = {
    "data/too-few-for-a-batch": ("data: ",),
    **{f"reward/{k}": ("data: ",) for k in REWARDS},
    # checked against the loaded model's context and size, after its "loaded ..." line
    "cli/max-new-tokens-beyond-context": ("loaded ",),
    "cli/num-samples-beyond-memory": ("loaded ",),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_error(case, d, tmp_path, capsys):
    argv, needles = CASES[case]
    argv = [a.replace("{d}", str(d)).replace("{out}", str(tmp_path / "out")) for a in argv]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2, (case, rc, err)
    line = error_line(err, argv[0], before=BEFORE.get(case, ()))
    for needle in needles:
        assert needle.replace("{d}", str(d)) in line, (needle, line)
    if case.startswith(("data/", "model/")) and argv[0] == "train":
        # stopped before anything was trained or checkpointed
        assert not (tmp_path / "out" / "checkpoints").exists()


# ----- documented handling that is not an error -------------------------------------------------


@pytest.mark.parametrize(
    "policy,counts",
    [
        ("drop", "10 training examples (3 of 13 dropped: longer than data.max_length)"),
        ("truncate", "13 training examples (3 of 13 truncated to data.max_length)"),
    ],
    ids=["drop", "truncate"],
)
def test_length_policy_reports_counts(policy, counts, d, tmp_path, capsys):
    """Examples over data.max_length are dropped / truncated, and the run says how many."""
    rc, _, err = run_cli(
        _train(
            SFT,
            f"output_dir={tmp_path / 'out'}",
            f"data.train={d}/mixedlen.jsonl",
            "data.max_length=32",
            f"data.length_policy={policy}",
            "max_steps=1",
            "train.batch_size=8",
        ),
        capsys,
    )
    assert rc == 0 and "Traceback" not in err, err
    assert f"data: {counts}\n" in err, err  # issue 42: words, not a raw dict


def test_online_run_says_how_many_prompts_it_dropped(d, tmp_path, capsys):
    """An online run's data line names the prompts kept and dropped per split, and why
    (issue 42); mixedlen.jsonl: 10 short prompts and 3 of 201 characters."""
    rc, _, err = run_cli(
        _train(
            GRPO,
            f"output_dir={tmp_path / 'out'}",
            f"data.train={d}/mixedlen.jsonl",
            f"data.eval={d}/mixedlen.jsonl",
            "data.max_length=32",
            "data.length_policy=drop",
            *REWARD_SETUP[1:],
            "eval.num_examples=2",
            "max_steps=1",
            "rewards=[{name: 'tests.test_bad_inputs:reward_plain'}]",
        ),
        capsys,
    )
    assert rc == 0 and "Traceback" not in err, err
    assert (
        "data: 10 training prompts, 10 held-out; dropped 3 of 13 training and 3 of 13 held-out "
        "prompts: longer than data.max_length=32 tokens (data.length_policy: drop)\n"
    ) in err, err


# Reward functions for the run below (imported by name, like a user's ``pkg.mod:fn``); the
# data's ``mode`` column says which sample each one cannot score.
def reward_raises(prompts, completions, *, mode, **_):
    """Raises for a batch holding a ``raise`` sample (and for that sample alone)."""
    if "raise" in mode:
        raise ValueError("cannot score this sample")
    return [1.0] * len(completions)


def reward_nan(prompts, completions, *, mode, **_):
    """NaN for ``nan`` samples."""
    return [math.nan if m == "nan" else 1.0 for m in mode]


def reward_plain(prompts, completions):
    """A reward function that takes no keywords (for the unknown-kwarg case)."""
    return [1.0] * len(completions)


def reward_none(prompts, completions, *, mode, **_):
    """None for ``none`` samples."""
    return [None if m == "none" else 1.0 for m in mode]


def reward_wrong_count(prompts, completions, **_):
    """One value too many, every time."""
    return [1.0] * (len(completions) + 1)


@pytest.fixture(scope="module")
def reward_run(d, tmp_path_factory):
    """One GRPO run with all four bad reward functions: (exit status, stderr, metric rows)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("reward_run") / "out"
    names = ["reward_raises", "reward_nan", "reward_none", "reward_wrong_count"]
    rewards = ", ".join(f"{{name: 'tests.test_bad_inputs:{n}'}}" for n in names)
    argv = _train(
        GRPO,
        f"output_dir={out}",
        *REWARD_SETUP,
        "data.shuffle=false",
        "loss.kl_coef=0",
        "max_steps=3",
        f"rewards=[{rewards}]",
    )
    argv = [a.replace("{d}", str(d)) for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return rc, err.getvalue(), rows


@pytest.mark.parametrize("fn", ["reward_raises", "reward_nan", "reward_none"])
def test_failing_reward_is_scored_invalid_and_counted(fn, reward_run):
    """A sample a reward function raises on, or scores NaN / None, is invalid (zero advantage)
    and counted under rewards/<name>/failures; the run goes on. Each step holds 4 prompts x 2
    samples, one prompt of each mode, so each function fails on exactly 2 of 8 samples."""
    _, _, rows = reward_run
    steps = [r for r in rows if r.get("reward/failed") is not None]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r[f"rewards/tests.test_bad_inputs:{fn}/failures"] == 2
        assert r["advantage/max"] == r["advantage/min"] == 0.0  # every sample is invalid
        assert math.isfinite(r["loss"])


def test_reward_with_wrong_count_stops_after_repeated_batches(reward_run):
    """The wrong count is tolerated twice (counted, run goes on), then exit 2 naming the
    function and what it must return."""
    rc, err, rows = reward_run
    assert rc == 2
    line = error_line(err, "train", before=("data: ", "sampler: ", "step "))
    assert (
        "'tests.test_bad_inputs:reward_wrong_count' returned 9 values for 8 completions" in line
        and "3 consecutive batches" in line
        and "one value per completion" in line
    )
    assert [
        r["rewards/tests.test_bad_inputs:reward_wrong_count/failures"]
        for r in rows
        if r.get("reward/failed") is not None
    ] == [8, 8]


def test_convert_force_replaces_only_the_files_it_owns(d, tmp_path, capsys):
    """``convert --force`` into a non-empty OUT removes the stale model/tokenizer files an
    export owns (a stale tokenizer would load beside the new weights) and keeps the rest."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("stale")
    (out / "model-00001-of-00002.safetensors").write_text("stale shard")
    (out / "notes.txt").write_text("mine")
    rc, stdout, err = run_cli(["convert", str(d / "hf"), str(out), "--force"], capsys)
    assert rc == 0, err
    assert "converted" in stdout
    assert not (out / "tokenizer.json").exists()  # the source has no tokenizer: none written
    assert not (out / "model-00001-of-00002.safetensors").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 97


# ----- issue 31: environments for the start-up cases above ---------------------------------


class InitRaises:
    """An environment whose constructor raises something other than TypeError."""

    def __init__(self):
        raise OSError("no such service")

    def reset(self, item):
        return [{"role": "user", "content": "x"}]

    def step(self, text):
        return None


class InitExits(InitRaises):
    """An environment whose constructor calls ``sys.exit(3)``."""

    def __init__(self):
        import sys

        sys.exit(3)


class EmptyOpening(InitRaises):
    """``reset`` returns no messages."""

    def __init__(self):
        pass

    def reset(self, item):
        return []


class StepRaises(EmptyOpening):
    """``step`` raises a KeyError (a real run's probe refuses it; ``--dry-run`` now too)."""

    def reset(self, item):
        return [{"role": "user", "content": "x"}]

    def step(self, text):
        return {}["x"]


class StepHangs(StepRaises):
    """``step`` sleeps for a minute."""

    def step(self, text):
        import time

        time.sleep(60)


def test_dry_run_accepts_tools_given_as_a_string(d, tmp_path, capsys):
    """``tools: calculator`` is a one-element list (it was read as the tools 'c', 'a', ...)."""
    argv = _train(GRPO, *ENV_SETUP, "env={name: tools, kwargs: {tools: calculator}}", dry=True)
    argv = [a.replace("{d}", str(d)).replace("{out}", str(tmp_path / "out")) for a in argv]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0 and "Traceback" not in err, err
    assert "tools: calculator" in out


def test_rollouts_refuse_a_budget_past_a_loaded_models_context():
    """A loaded model's context is known only once it is loaded: the rollout refuses the budget
    when it is built, before anything compiles (the static and the paged engine alike)."""
    from jaxrl_llm.errors import ConfigError
    from jaxrl_llm.models import ModelConfig
    from jaxrl_llm.train.config.sections import RolloutSection
    from jaxrl_llm.train.online.rollout import Rollouts

    config = ModelConfig.tiny(max_position_embeddings=8192)
    for engine in ("static", "paged"):
        with pytest.raises(ConfigError, match=r"rollout.max_new_tokens=8000: prompt \(300 tokens"):
            Rollouts(
                RolloutSection(max_new_tokens=8000, engine=engine),
                None,
                tokenizer=None,
                model_config=config,
                weights_fn=lambda: (None, 0),
                seed=0,
                max_prompt_len=300,
            )


@pytest.mark.parametrize("key", ["page_size", "num_slots", "chunk_steps"])
def test_paged_engine_sizes_below_one_are_one_line(key):
    # (generate_paged raises num_slots to G; the engine itself refuses 0)
    import jax

    from jaxrl_llm.models import ModelConfig, init_params
    from jaxrl_llm.sampling import PagedEngine, generate_paged

    config = ModelConfig.tiny(num_layers=1)
    params = init_params(config, jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match=f"paged engine: {key} must be >= 1, got 0"):
        PagedEngine(params, config, **{key: 0})
    if key != "num_slots":
        with pytest.raises(ConfigError, match=f"{key} must be >= 1"):
            generate_paged(params, config, [[1, 2, 3]], max_new_tokens=4, **{key: 0})


def test_char_tokenizer_on_a_model_with_a_larger_vocabulary_is_refused(tmp_path):
    import jax

    from jaxrl_llm.interop import export_hf
    from jaxrl_llm.models import ModelConfig, init_params
    from jaxrl_llm.train.config.config_io import from_dict
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.programs.policy import load_policy_model

    config = ModelConfig.tiny(vocab_size=300, num_layers=1)
    export_hf(
        str(tmp_path / "hf"), config=config, params=init_params(config, jax.random.PRNGKey(0))
    )
    cfg = from_dict(
        RunConfig,
        dict(
            output_dir=str(tmp_path / "run"),
            max_steps=1,
            algorithm="sft",
            model=dict(source=str(tmp_path / "hf"), tokenizer="char"),
            data=dict(train="unused.jsonl"),
        ),
    )
    with pytest.raises(
        ConfigError, match="char tokenizer decodes 259 ids, the model samples from 300"
    ):
        load_policy_model(cfg)

"""``compile_preset(..., correction=...)`` (``jaxrl-llm compile``'s API, train/compile/aot.py) compiles the
train step on the batch that ``rollout.correction`` builds: ``is_weights`` (TIS / MIS) or
``proximal_logp`` (decoupled PPO) are arguments the compiled step reads, and the learner's
recompute forward is one more program. Compiled for an abstract TPU v5e 2x2 slice (needs
``libtpu``, as tests/cli/test_compile.py)."""

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.parallel import topology
from jaxrl_llm.train.compile.aot import compile_preset as compile_run
from jaxrl_llm.train.config.sections import CorrectionSection

needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_available(), reason="the TPU compiler (libtpu) is not installed"
)

# Odd, distinct sizes; the batch is 8 prompts x G = 4 = 32 rows of 256 tokens, data-parallel
# over 4 chips: 8 rows per chip, so a [rows, 256] float32 array is 8 KiB per chip with no
# TPU tile padding (8 x 128).
CONFIG = ModelConfig.tiny(vocab_size=97, hidden_size=48, num_layers=1)
RUN = dict(data=4, batch_size=8, group_size=4, seq_len=256, remat="none", decode=False)
ROW_ARRAY_BYTES = 8 * 256 * 4


@pytest.fixture(scope="module")
def v5e():
    return topology.tpu_topology("v5e:2x2")


def _programs(report):
    return {p.name: p for p in report.programs}


@needs_libtpu
@pytest.mark.parametrize("decoupled", [False, True], ids=["is_weights", "proximal_logp"])
def test_the_compiled_step_reads_the_correction_entries(v5e, decoupled):
    # jit drops arguments a program does not read (keep_unused=False), so the train program's
    # argument bytes grow by exactly one [rows, T] float32 array per chip only if the loss
    # reads it.
    plain = _programs(compile_run(CONFIG, "dapo", v5e, **RUN))
    section = CorrectionSection(decoupled=decoupled, mode="mask", low=0.5, high=2.0)
    corrected = _programs(compile_run(CONFIG, "dapo", v5e, correction=section, **RUN))
    assert set(plain) == {"train"} and set(corrected) == {"train", "recompute"}
    grown = corrected["train"].argument_bytes - plain["train"].argument_bytes
    assert grown == ROW_ARRAY_BYTES
    # the recompute forward: the trained params and the rollout rows' [32, 256] ids, attention
    # mask and loss mask in, [32, 256] float32 log-probs out (per chip: a quarter of the rows)
    rec = corrected["recompute"]
    assert rec.output_bytes == ROW_ARRAY_BYTES and rec.flops > 0
    assert rec.argument_bytes > 3 * ROW_ARRAY_BYTES


@needs_libtpu
def test_cispo_takes_the_weights_and_gmpo_and_offline_algorithms_refuse(v5e):
    plain = _programs(compile_run(CONFIG, "cispo", v5e, **RUN))
    corrected = _programs(compile_run(CONFIG, "cispo", v5e, correction=CorrectionSection(), **RUN))
    assert corrected["train"].argument_bytes - plain["train"].argument_bytes == ROW_ARRAY_BYTES
    with pytest.raises(ConfigError, match="takes no is_weights"):
        compile_run(CONFIG, "gmpo", v5e, correction=CorrectionSection(), **RUN)
    with pytest.raises(ConfigError, match="takes no proximal_logp"):
        compile_run(CONFIG, "sapo", v5e, correction=CorrectionSection(decoupled=True), **RUN)
    with pytest.raises(ConfigError, match="trained offline"):
        compile_run(CONFIG, "dpo", v5e, correction=CorrectionSection(), **RUN)


@needs_libtpu
def test_an_entry_the_loss_does_not_read_costs_no_argument_bytes(v5e, monkeypatch):
    # what the byte count above rests on: a batch entry no loss reads is pruned from the
    # compiled step (here an extra field in the plan's layout of the step's batch)
    import dataclasses

    import jaxrl_llm.train.compile.aot as aot
    from jaxrl_llm.train.config.batch_layout import BatchField

    plain = _programs(compile_run(CONFIG, "dapo", v5e, **RUN))
    planned = aot.plan_run

    def with_unread(cfg, mesh, **kw):
        plan = planned(cfg, mesh, **kw)
        extra = BatchField("unread", ("rows", "tokens"), "float32")
        return dataclasses.replace(plan, layout=plan.layout.with_fields(extra))

    monkeypatch.setattr(aot, "plan_run", with_unread)
    unread = _programs(compile_run(CONFIG, "dapo", v5e, **RUN))
    assert unread["train"].argument_bytes == plain["train"].argument_bytes


@needs_libtpu
def test_jaxrl_llm_compile_takes_the_correction(tmp_path, capsys):
    import json

    from jaxrl_llm.cli.main import main

    hf = dict(
        model_type="llama",
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    (tmp_path / "config.json").write_text(json.dumps(hf))
    args = ["compile", "--model", str(tmp_path / "config.json"), "--algorithm", "dapo"]
    args += ["--topology", "v5e:2x2", "--mesh", "data=4", "--batch", "8", "--group-size", "4"]
    args += ["--seq-len", "256", "--remat", "none", "--no-decode", "--json"]
    assert main([*args, "--correction", "decoupled"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in out["programs"]} == {"train", "recompute"}

"""``jaxrl-llm compile`` of on-policy distillation (train/compile/aot.py): the teacher is one
more model on the mesh. Reverse KL compiles its forward beside the train step; GKD passes its
weights to the step, which reads them. Compiled for an abstract TPU v5e 2x2 slice (needs
``libtpu``, as tests/cli/test_compile.py)."""

import dataclasses

import pytest

from jaxrl_llm.models import ModelConfig
from jaxrl_llm.parallel import topology
from jaxrl_llm.train.compile.aot import compile_run
from jaxrl_llm.train.compile.aot_inputs import run_config_for

needs_libtpu = pytest.mark.skipif(
    not topology.libtpu_available(), reason="the TPU compiler (libtpu) is not installed"
)

CONFIG = ModelConfig.tiny(vocab_size=97, hidden_size=48, num_layers=1)
RUN = dict(data=4, batch_size=8, group_size=4, seq_len=256, remat="none")


@needs_libtpu
def test_distill_compiles_the_teacher_forward_or_passes_its_weights_to_the_step():
    v5e = topology.tpu_topology("v5e:2x2")
    cfg, seq_len, prompt_len = run_config_for("distill", **RUN)
    kw = dict(seq_len=seq_len, prompt_len=prompt_len, decode=False)
    rkl = compile_run(cfg, CONFIG, v5e, **kw)
    programs = {p.name: p for p in rkl.programs}
    assert set(programs) == {"train", "teacher"}
    # the teacher's weights live through the step (data-parallel: a whole copy per chip)
    teacher_bytes = rkl.resident["teacher weights"]
    assert teacher_bytes == CONFIG.num_params() * 4
    # its forward: [32, 256] float32 log-probs out, a quarter of the rows per chip
    assert programs["teacher"].output_bytes == 8 * 256 * 4
    gkd = compile_run(dataclasses.replace(cfg, loss={"kind": "gkd"}), CONFIG, v5e, **kw)
    g_programs = {p.name: p for p in gkd.programs}
    assert set(g_programs) == {"train"}
    # the GKD step reads the teacher's weights (TPU tiles pad the small ones, so at least
    # their bytes) and its [8 rows, 256] int32 ids and mask per chip
    grown = g_programs["train"].argument_bytes - programs["train"].argument_bytes
    assert grown >= teacher_bytes + 2 * 8 * 256 * 4
    assert gkd.resident["teacher weights"] == teacher_bytes

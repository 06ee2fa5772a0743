"""``describe`` (cli/sources.py): the "found" line says whether the adapters were merged."""

from pathlib import Path

from jaxrl_llm.cli.sources import RestoredModel, Source, SourceKind, describe
from jaxrl_llm.models.lora import LoRAConfig


def _restored(lora):
    return RestoredModel(None, None, None, 40, lora=lora, base_source="smollm2-135m-instruct")


def test_found_line_says_merged_only_when_the_adapters_are_merged():
    run = Source(SourceKind.RUN, "runs/x/checkpoints", run_dir=Path("runs/x"))
    lora = LoRAConfig(rank=8, alpha=32.0)
    assert describe(run, _restored(lora)) == (
        "run directory runs/x: checkpoint step 40 "
        "(LoRA r=8 adapters merged into smollm2-135m-instruct)"
    )
    # convert --adapter-only writes the adapters as they are: nothing was merged
    assert describe(run, _restored(lora), merged=False) == (
        "run directory runs/x: checkpoint step 40 (LoRA r=8 adapters on smollm2-135m-instruct)"
    )
    # full weights: no LoRA clause either way
    assert describe(run, _restored(None), merged=False) == (
        "run directory runs/x: checkpoint step 40"
    )

"""The top-level ``jaxrl-llm`` dispatcher: argument order and unknown arguments."""

import pytest

from jaxrl_llm.cli.main import build_parser, main


def test_overrides_may_follow_options():
    """``train CFG --resume a=1 b=2`` keeps every override (argparse alone would reject a=1)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(["train", "c.yaml", "x=1", "--resume", "a.b=2", "c=3"])
    assert extra == ["a.b=2", "c=3"] and args.overrides == ["x=1"] and args.resume


def test_unknown_option_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "configs/sft.yaml", "--no-such-flag"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_dry_run_accepts_overrides_after_options(capsys):
    assert main(["train", "configs/sft.yaml", "--dry-run", "max_steps=2", "seed=7"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 2" in out and "seed: 7" in out

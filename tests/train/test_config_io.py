import dataclasses
import enum

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.config_io import apply_overrides, from_dict, load_config, to_dict


class Sched(str, enum.Enum):
    CONSTANT = "constant"
    COSINE = "cosine"


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-5
    schedule: Sched = Sched.CONSTANT
    betas: tuple[float, ...] = (0.9, 0.999)


@dataclasses.dataclass(frozen=True)
class Run:
    seed: int
    output_dir: str
    max_steps: int = 10
    packing: bool = False
    optim: Optim = Optim()
    note: str | None = None

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")


def test_roundtrip_and_coercion(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 1\noutput_dir: out\noptim:\n  lr: 1e-4\n  schedule: cosine\n")
    cfg = load_config(Run, str(p), ["optim.betas=[0.9, 0.95]", "packing=true", "note=null"])
    assert cfg.optim.lr == 1e-4 and cfg.optim.schedule is Sched.COSINE
    assert cfg.optim.betas == (0.9, 0.95) and cfg.packing is True and cfg.note is None
    assert to_dict(cfg)["optim"]["schedule"] == "cosine"
    assert from_dict(Run, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "data,match",
    [
        (
            {"seed": 1, "output_dir": "o", "optim": {"lrr": 1}},
            r"unknown config key 'optim.lrr' \(did you mean 'lr'\?\)",
        ),
        ({"seed": "x", "output_dir": "o"}, r"seed: expected an integer, got 'x'"),
        (
            {"seed": 1, "output_dir": "o", "optim": {"schedule": "linear"}},
            r"optim.schedule: expected one of 'constant', 'cosine'",
        ),
        ({"seed": 1, "output_dir": "o", "packing": "yes"}, r"packing: expected true or false"),
        ({"output_dir": "o"}, r"missing required config key\(s\) \['seed'\]"),
        ({"seed": 1, "output_dir": "o", "max_steps": 0}, r"max_steps must be >= 1"),
    ],
)
def test_errors_name_the_key(data, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(Run, data)


def test_override_errors_and_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="dotted.key=value"):
        apply_overrides({}, ["novalue"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Run, str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(Run, str(bad))
    orig = {"a": {"b": 1}}
    assert apply_overrides(orig, ["a.b=2"]) == {"a": {"b": 2}} and orig == {"a": {"b": 1}}


def test_an_error_about_a_key_of_the_file_names_the_file_and_line(tmp_path):
    from jaxrl_llm.train.config.run_config import RunConfig

    p = tmp_path / "typo.yaml"
    p.write_text(
        "algorithm: grpo\noutput_dir: /tmp/x\nmax_steps: 1\nrollout:\n  group_sise: 4\n"
        "rewards:\n  - name: math_answer\n    weight: .inf\n"
    )
    with pytest.raises(
        ConfigError, match=r"typo\.yaml line 5: unknown config key 'rollout\.group_sise'"
    ):
        load_config(RunConfig, str(p))
    p.write_text(p.read_text().replace("group_sise", "group_size"))
    with pytest.raises(ConfigError, match=r"typo\.yaml line 8: rewards\[0\]\.weight"):
        load_config(RunConfig, str(p))
    # a key an override set is not the file's: no line
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, str(p), ["rewards=[{name: math_answer, weight: .inf}]", "seed=-1"])
    assert "line" not in str(e.value)


def test_yaml_merge_keys_and_anchors_under_x_keys(tmp_path):
    """``<<: *anchor`` merges the anchored mapping (the mapping's own keys win); an anchor
    lives under a top-level ``x-`` key, which is dropped; a mapping's own duplicate keys and a
    merge of a non-mapping stay one-line errors with the line."""
    p = tmp_path / "c.yaml"
    p.write_text(
        "x-optim: &adam\n"
        "  lr: 1.0e-4\n"
        "  schedule: cosine\n"
        "seed: 1\n"
        "output_dir: out\n"
        "optim:\n"
        "  <<: *adam\n"
        "  lr: 3.0e-4\n"
    )
    cfg = load_config(Run, str(p))
    assert cfg.optim.lr == 3e-4 and cfg.optim.schedule is Sched.COSINE
    p.write_text("seed: 1\noutput_dir: out\noptim:\n  lr: 1\n  lr: 2\n")
    with pytest.raises(ConfigError, match="line 5: duplicate key 'lr'"):
        load_config(Run, str(p))
    p.write_text("seed: 1\noutput_dir: out\noptim:\n  <<: 3\n")
    with pytest.raises(ConfigError, match=r"line 4: invalid YAML \(expected a mapping") as e:
        load_config(Run, str(p))
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_big_plain_yaml_is_not_called_an_alias_bomb(tmp_path):
    """50,001 plain keys (100,003 values as written, no alias): one line saying the file is
    too big, not an alias bomb (PyYAML takes ~20 s to compose them on a loaded host)."""
    from jaxrl_llm.train.config.config_io import load_yaml

    big = tmp_path / "big.yaml"
    big.write_text("".join(f"k{i}: {i}\n" for i in range(50_001)))
    with pytest.raises(ConfigError) as e:
        load_yaml(str(big))
    assert "holds more than 100,000 values" in str(e.value) and "alias" not in str(e.value)
    bomb = tmp_path / "bomb.yaml"
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdef", "bcdefg")]
    bomb.write_text("\n".join(levels) + "\n")
    with pytest.raises(ConfigError, match="an alias bomb"):
        load_yaml(str(bomb))

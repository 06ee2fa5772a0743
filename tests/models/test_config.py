"""ModelConfig's groups (jaxrl_llm/models/config.py, config_groups.py): the top level stays
small, the old flat spellings keep working, and models/ and interop/ read grouped names."""

import dataclasses
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm import models
from jaxrl_llm.models import (
    FLAT_NAMES,
    AttentionConfig,
    AttentionImpl,
    Family,
    LayerType,
    MlpConfig,
    ModelConfig,
    MoeConfig,
)
from jaxrl_llm.models.config_groups import GROUPS

PACKAGE = pathlib.Path(models.__file__).parent.parent


def test_top_level_has_at_most_15_fields():
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    assert len(names) <= 15, names
    assert set(GROUPS) <= set(names)


def test_flat_names_cover_every_group_field_once():
    targets = sorted(FLAT_NAMES.values())
    assert len(targets) == len(set(targets))
    fields = sorted((g, f.name) for g, cls in GROUPS.items() for f in dataclasses.fields(cls))
    assert targets == fields
    top = {f.name for f in dataclasses.fields(ModelConfig)}
    assert not top & set(FLAT_NAMES)  # no flat name shadows a field


def test_flat_keywords_build_the_grouped_config():
    flat = ModelConfig(
        vocab_size=97,
        hidden_size=48,
        num_layers=2,
        num_heads=3,
        num_kv_heads=1,
        intermediate_size=80,
        rope_theta=5e5,
        attention_bias=True,
        num_experts=4,
        num_experts_per_tok=2,
        moe_dispatch="dense",
        attention="blockwise",
        eos_token_ids=[7, 8],
    )
    grouped = ModelConfig(
        vocab_size=97,
        hidden_size=48,
        num_layers=2,
        attn=AttentionConfig(num_heads=3, num_kv_heads=1, bias=True, impl=AttentionImpl.BLOCKWISE),
        rope={"theta": 5e5},
        mlp=MlpConfig(intermediate_size=80),
        moe=MoeConfig(num_experts=4, num_experts_per_tok=2, dispatch=models.MoeDispatch.DENSE),
        tokens={"eos_ids": (7, 8)},
    )
    assert flat == grouped and hash(flat) == hash(grouped)
    assert flat.attn.head_dim == 16 and flat.moe.intermediate_size == 80  # filled in
    assert flat.tokens.eos_ids == (7, 8) and flat.attn.impl == AttentionImpl.BLOCKWISE


def test_replace_takes_flat_and_grouped_names():
    c = ModelConfig.tiny(Family.GEMMA3)
    wider = dataclasses.replace(c, num_heads=6, num_kv_heads=2)
    assert (wider.attn.num_heads, wider.attn.num_kv_heads) == (6, 2)
    assert wider.attn.layer_types == c.attn.layer_types and wider.rope == c.rope
    impl = dataclasses.replace(c, attention=AttentionImpl.SPLASH)
    assert impl.attn.impl == AttentionImpl.SPLASH and impl.attention == AttentionImpl.SPLASH
    assert dataclasses.replace(impl.attn, impl=c.attn.impl) == c.attn
    assert c.replace(attention="splash") == impl
    assert c.replace(rope=dataclasses.replace(c.rope, theta=1.0)).rope_theta == 1.0
    assert c.rope_theta != 1.0  # the caller's config is untouched


@pytest.mark.parametrize("family", list(Family))
def test_flat_view_round_trips_and_reads(family):
    c = ModelConfig.tiny(family)
    flat = c.flat()
    assert ModelConfig(**flat) == c
    for old, (group, name) in FLAT_NAMES.items():
        assert getattr(c, old) == flat[old] == getattr(getattr(c, group), name)


def test_unknown_key_names_the_closest():
    with pytest.raises(TypeError, match=r"unknown field 'num_head' \(did you mean 'num_heads'\?\)"):
        ModelConfig.tiny(num_head=4)
    with pytest.raises(TypeError, match=r"ModelConfig.rope has no field 'thetta'.*'theta'"):
        ModelConfig.tiny(rope={"thetta": 1.0})
    with pytest.raises(AttributeError, match=r"did you mean 'rope_theta'"):
        _ = ModelConfig.tiny().rope_theat
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig.tiny().attn = None  # type: ignore[misc]
    # A flat name is read-only too (Python 3.11's frozen slots dataclasses raise TypeError for
    # a name that is not a field).
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
        ModelConfig.tiny().num_heads = 4


def test_validation_stays_per_group_and_across_groups():
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        AttentionConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_experts_per_tok=3"):
        MoeConfig(num_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match="layer_types has 1 entries for num_layers=2"):
        ModelConfig.tiny(layer_types=(LayerType.GLOBAL,))
    with pytest.raises(ValueError, match="needs num_experts > 0"):
        ModelConfig.tiny(Family.MIXTRAL, num_experts=0)


def test_equal_configs_share_one_jit_trace():
    traces = []

    def scale(x, config):
        traces.append(config)
        return x * config.attn.num_heads

    f = jax.jit(scale, static_argnums=1)
    a = ModelConfig.tiny()
    b = dataclasses.replace(ModelConfig.tiny(), attention="auto")
    assert a == b and a is not b and hash(a) == hash(b)
    assert float(f(jnp.ones(()), a)) == float(f(jnp.ones(()), b)) == 3.0
    assert len(traces) == 1
    f(jnp.ones(()), a.replace(num_heads=1, num_kv_heads=1))
    assert len(traces) == 2


# A flat read through ModelConfig's alias, on a receiver that names a config.
_FLAT_READ = re.compile(r"\b(?:c|config|cfg|model_config)\.(" + "|".join(FLAT_NAMES) + r")\b")


@pytest.mark.parametrize("folder", ["models", "interop"])
def test_package_reads_grouped_names(folder):
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        if path.name == "paged_store.py":  # another helper's file; reads through the alias
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if code.lstrip().startswith(("'", '"')) or "``" in code:
                continue  # prose
            if _FLAT_READ.search(code):
                found.append(f"{path.name}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def _preset_fields():
    from jaxrl_llm.models.families.gemma.presets import gemma3_270m_fields
    from jaxrl_llm.models.families.gemma4.presets import gemma4_31b_fields
    from jaxrl_llm.models.families.gemma4.presets import tiny_fields as gemma4_tiny_fields
    from jaxrl_llm.models.families.gpt_oss.presets import gpt_oss_20b_fields
    from jaxrl_llm.models.families.qwen3_5.presets import qwen3_5_tiny_fields

    return [
        gemma3_270m_fields(),
        gemma4_31b_fields(),
        gemma4_tiny_fields(),
        gpt_oss_20b_fields(),
        qwen3_5_tiny_fields(Family.QWEN3_5_MOE),
    ]


@pytest.mark.parametrize("fields", _preset_fields(), ids=lambda f: str(f["family"]))
def test_preset_fields_land_where_flat_reads_find_them(fields):
    c = ModelConfig(**fields)
    flat = c.flat()
    for key, value in fields.items():
        if key in ("layer_types", "eos_token_ids"):
            value = tuple(value)
        if value is not None or key not in ("head_dim", "moe_intermediate_size"):
            assert flat[key] == value, key
    assert ModelConfig(**flat) == c

"""``rollout.engine: paged`` and ``rollout.dtype`` in the online trainer's rollouts
(jaxrl_llm/train/online/rollout.py): the paged engine samples the static engine's experience."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.data.tokenize import CharTokenizer, TokenizedPrompt
from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.train.config.sections import RolloutSection
from jaxrl_llm.train.online.rollout import Rollouts

CONFIG = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2,), pad_token_id=0)


def _length_reward(prompts, completions, **_):
    return [float(len(c)) for c in completions]


def test_paged_engine_samples_the_static_engines_experience():
    params = init_params(CONFIG, jax.random.PRNGKey(0))
    tok = CharTokenizer()
    items = [
        TokenizedPrompt(prompt_ids=tuple(tok.encode(t)), extras={})
        for t in ("ab", "hello there", "x")
    ]
    static = RolloutSection(group_size=2, max_new_tokens=8, temperature=0.9)
    outs = {}
    for name, settings in {
        "static": static,
        "paged": dataclasses.replace(static, engine="paged"),
        "paged_bf16": dataclasses.replace(static, engine="paged", dtype="bfloat16"),
    }.items():
        ro = Rollouts(
            settings,
            RewardSet([_length_reward]),
            tokenizer=tok,
            model_config=CONFIG,
            weights_fn=lambda: (params, 0),
            seed=0,
        )
        outs[name] = ro.sample(items, seed=5)
    a, b = outs["static"].rollout, outs["paged"].rollout
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert outs["static"].texts == outs["paged"].texts
    c = outs["paged_bf16"].rollout
    assert c.logprobs.dtype == np.float32 and c.tokens.shape == a.tokens.shape


def test_rollout_engine_and_dtype_are_config_keys():
    from jaxrl_llm.errors import ConfigError
    from jaxrl_llm.train.config.config_io import from_dict

    cfg = from_dict(RolloutSection, {"engine": "paged", "dtype": "bfloat16"})
    assert cfg.engine == "paged" and cfg.dtype == "bfloat16"
    assert RolloutSection().engine == "static" and RolloutSection().dtype is None
    with pytest.raises(ConfigError, match="engine"):
        from_dict(RolloutSection, {"engine": "vllm"})

"""The tools environment's descriptions rendered by the chat template (``tools=``, as TRL does)
when the template writes them, else the environment's own text (envs/chat.py, tools.py,
episodes.py)."""

from __future__ import annotations

import jax
import pytest

from jaxrl_llm.data.tokenize import CharTokenizer
from jaxrl_llm.envs import ChatCodec, EnvError, Episode, ToolEnv, run_episodes
from jaxrl_llm.envs.episodes import template_tools
from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.sampling import SamplingConfig, stop_token_ids
from tests.envs.scripted import STOP

SAMPLING = SamplingConfig(temperature=1.0, stop_token_ids=STOP)


class ToolsTemplate(CharTokenizer):
    """The char tokenizer with a template that writes ``tools=`` as one line."""

    def apply_chat_template(
        self, messages, add_generation_prompt=False, tokenize=False, tools=None, **kw
    ):
        head = ""
        if tools:
            head = "tools: " + ",".join(t["function"]["name"] for t in tools) + "\n"
        return head + super().apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize, **kw
        )


def _codec(tok, config):
    return ChatCodec(tok, stop_token_ids(config, SAMPLING))


def test_the_template_renders_the_tools_when_it_can():
    config = ModelConfig.tiny(vocab_size=259)
    plain, templ = _codec(CharTokenizer(), config), _codec(ToolsTemplate(), config)
    assert not plain.renders_tools and templ.renders_tools
    env = ToolEnv(tools=["calculator"])
    opening = env.reset({"prompt": "2*3?"})
    assert opening[0] == {"role": "system", "content": env.system}
    tools, msgs = template_tools(env, opening, templ)
    assert tools == env.schemas and msgs == [{"role": "user", "content": "2*3?"}]
    assert template_tools(env, opening, plain) == (None, opening)  # the env's text stays
    # a row with its own system message keeps it, without the tool text
    own = env.reset(
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]}
    )
    assert template_tools(env, own, templ)[1][0] == {"role": "system", "content": "Be brief."}
    assert template_tools(ToolEnv(tools_prompt="env"), opening, templ) == (None, opening)
    with pytest.raises(EnvError, match="does not render tools="):
        template_tools(ToolEnv(tools_prompt="template"), opening, plain)


def test_an_episode_opens_and_continues_with_the_templates_tools():
    config = ModelConfig.tiny(vocab_size=259, max_position_embeddings=512)
    params = init_params(config, jax.random.PRNGKey(0))
    tok = ToolsTemplate()
    codec = _codec(tok, config)
    eps = [
        Episode(item={"prompt": "2*3?"}, prompt_id=0, sample_id=s, env=ToolEnv(), fallback_ids=[1])
        for s in range(2)
    ]
    run_episodes(
        params,
        config,
        eps,
        codec=codec,
        sampling=SAMPLING,
        seed=0,
        group_size=2,
        max_turns=2,
        turn_tokens=8,
        budget=64,
        workers=2,
    )
    for ep in eps:
        text = tok.decode(ep.opening_ids)
        assert ep.error is None and ep.tools == ToolEnv().schemas
        assert text.startswith("tools: calculate\n") and "Tools:" not in text

r"""Gemma's chat turn format (https://ai.google.dev/gemma/docs/core/prompt-structure): turns
``<start_of_turn>{user|model}\n...<end_of_turn>\n``, a system message folded into the first
user turn. Given to a Gemma tokenizer that arrives without a template (the GGUF files of
llama.cpp carry none for Gemma 3 270M).

Pure strings: it imports nothing."""

from __future__ import annotations

#: The template, as a Jinja string for ``tokenizer.chat_template``.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (system if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
#: The token a chat reply ends with (a stop token once the template is given).
END_OF_TURN = "<end_of_turn>"

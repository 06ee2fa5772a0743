"""Tests of jaxrl_llm/cli/generate.py (kept in tests/sampling/, the sampling owner's folder):
one-line errors for bad arguments, and a smoke run on a tiny model saved to disk."""

import jax
import numpy as np
import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.models import ModelConfig, init_params


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--max-new-tokens", "-3"], "--max-new-tokens must be >= 1"),
        (["--num-samples", "0"], "--num-samples must be >= 1"),
        (["--temperature", "0"], "--temperature must be > 0"),
        (["--top-k", "-2"], "--top-k must be an integer >= 0"),
        (["--min-p", "1"], "--min-p must be in [0, 1)"),
        (["--greedy", "--top-k", "5"], "--greedy cannot be combined"),
        (["--model", "no-such-model-xyz"], "no-such-model-xyz"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, fragment, capsys):
    rc = main(["generate", "--prompt", "hi"] + argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert fragment in err
    assert err.count("\n") == 1 and err.startswith("jaxrl-llm generate: error:")


class CharTokenizer:
    """A minimal tokenizer for the tiny model: one id per character (ids 3..96), EOS = 2."""

    chat_template = "{{ messages }}"
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + (ord(c) % 94) for c in text]}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(33 + (i - 3) % 94) for i in ids if i >= 3 or not skip_special_tokens)


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_smoke_run_on_a_tiny_model_prints_one_text_per_sample(
    engine, tmp_path, monkeypatch, capsys
):
    """Both engines print the static engine's samples (the paged one keys rows alike)."""
    import jaxrl_llm.interop as interop
    from jaxrl_llm.sampling import SamplingConfig, generate

    config = ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(1))
    interop.export_hf(tmp_path / "tiny", config=config, params=params)
    # The saved directory has no tokenizer files; plug in the character tokenizer.
    real_load = interop.load_model

    def load_with_tokenizer(src, **kw):
        loaded = real_load(src, **kw)
        assert loaded.tokenizer is None
        return loaded._replace(tokenizer=CharTokenizer())

    monkeypatch.setattr(interop, "load_model", load_with_tokenizer)
    rc = main(
        [
            "generate",
            "--model",
            str(tmp_path / "tiny"),
            "--chat",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--max-new-tokens",
            "7",
            "--num-samples",
            "2",
            "--seed",
            "3",
            "--prompt",
            "ab",
            "--prompt",
            "hello",
            "--engine",
            engine,
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    texts = captured.out.split("\n\n")
    assert len(texts) == 4
    tok = CharTokenizer()
    prompts = [
        tok(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))[
            "input_ids"
        ]
        for p in ("ab", "hello")
    ]
    out = generate(
        params,
        config,
        prompts,
        sampling=SamplingConfig(temperature=0.8, top_p=0.9),
        num_samples=2,
        seed=3,
        max_new_tokens=7,
    )
    expected = [
        tok.decode(np.asarray(out.tokens[i, : int(out.lengths[i])]).tolist()) for i in range(4)
    ]
    assert [t.rstrip("\n") for t in texts] == expected
    assert "loaded" in captured.err


def test_model_without_tokenizer_is_a_clear_error(tmp_path, capsys):
    import jaxrl_llm.interop as interop

    config = ModelConfig.tiny()
    interop.export_hf(
        tmp_path / "tiny", config=config, params=init_params(config, jax.random.PRNGKey(0))
    )
    rc = main(["generate", "--model", str(tmp_path / "tiny"), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "no tokenizer" in err

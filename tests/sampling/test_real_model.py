"""Greedy parity of jaxrl_llm.sampling with transformers' generate on SmolLM2-135M-Instruct,
and the `jaxrl-llm generate` CLI end to end on it (the README's `make run` command)."""

import numpy as np
import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

CHAT_PROMPTS = [
    "What is 37 + 45? Reply with just the number.",
    "Hi!",
    "Write one sentence about the sea, then list three animals that live in it, one per line.",
    "Name a colour.",
]


@pytest.fixture(scope="module")
def real():
    interop = pytest.importorskip("jaxrl_llm.interop")
    try:
        path = interop.resolve_alias("smollm2-135m-instruct")
    except Exception as e:  # package not installed
        pytest.skip(str(e))
    return interop.load_model("smollm2-135m-instruct"), interop.cached_gguf_dir(path)


def test_greedy_matches_transformers_generate_token_for_token(real):
    import torch
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.sampling import SamplingConfig, generate
    from jaxrl_llm.sampling.text import encode_prompts

    (config, params, tok), hf_dir = real
    prompts = encode_prompts(tok, CHAT_PROMPTS, chat=True)
    assert len({len(p) for p in prompts}) == 4  # four different prompt lengths in one batch
    out = generate(params, config, prompts, sampling=SamplingConfig(greedy=True), max_new_tokens=32)
    hf = AutoModelForCausalLM.from_pretrained(
        str(hf_dir), local_files_only=True, torch_dtype=torch.float32
    ).eval()
    # transformers, one left-padded batch (its generate derives positions from the mask)
    width = max(len(ids) for ids in prompts)
    pad = config.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts])
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    with torch.no_grad():
        ref = hf.generate(
            input_ids,
            attention_mask=attention,
            do_sample=False,
            max_new_tokens=32,
            eos_token_id=list(config.eos_token_ids),
            pad_token_id=pad,
        )[:, width:].tolist()
    finished = 0
    for i in range(len(prompts)):
        eos = [j for j, t in enumerate(ref[i]) if t in config.eos_token_ids]
        ref_i = ref[i][: eos[0] + 1] if eos else ref[i]
        n = int(out.lengths[i])
        assert np.asarray(out.tokens[i, :n]).tolist() == ref_i, (i, tok.decode(ref_i))
        assert bool(out.finished[i]) == bool(eos)
        finished += bool(eos)
    assert finished >= 1  # at least one row ends with EOS inside 32 tokens (a stop is tested)


def test_cli_make_run_command_prints_only_the_answer(real, capsys):
    from jaxrl_llm.cli.main import main
    from jaxrl_llm.sampling import SamplingConfig, generate
    from jaxrl_llm.sampling.text import encode_prompts

    (config, params, tok), _ = real
    rc = main(
        [
            "generate",
            "--model",
            "smollm2-135m-instruct",
            "--chat",
            "--greedy",
            "--max-new-tokens",
            "48",
            "--prompt",
            CHAT_PROMPTS[0],
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    out = generate(
        params,
        config,
        encode_prompts(tok, CHAT_PROMPTS[:1], chat=True),
        sampling=SamplingConfig(greedy=True),
        max_new_tokens=48,
    )
    expected = tok.decode(
        np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist(), skip_special_tokens=True
    )
    assert captured.out == expected + "\n"
    assert "loaded" in captured.err and "generated" in captured.err

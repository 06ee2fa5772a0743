"""``jaxrl-llm eval`` (cli/evaluate.py): a model scored on held-out prompts with rewards and no
training config; the numbers are the training run's own evaluation (greedy mean, pass@k from
Rollouts.evaluate; maj@k and the samples file from train.api.vote_eval, the same seeds)."""

import json

import jax
import pytest

from jaxrl_llm import interop
from jaxrl_llm import models as M
from jaxrl_llm.cli.main import main
from tests.interop._tiny import tiny_tokenizer

PROMPTS = [f"w{i} w{i + 1}" for i in range(7, 12)]


def has_w9(completions, **kwargs):
    """1 when the completion holds the word w9 (a deterministic reward of the text)."""
    return [float("w9" in c.split()) for c in completions]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    config = M.ModelConfig.tiny("llama")
    params = M.init_params(config, jax.random.PRNGKey(3))
    interop.export_hf(root / "hf", config=config, params=params, tokenizer=tiny_tokenizer())
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "9"}) + "\n" for p in PROMPTS))
    return root


def _eval(capsys, *argv):
    rc = main(["eval", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_eval_scores_an_hf_directory_with_no_training_config(hf_dir, tmp_path, capsys):
    out_dir = tmp_path / "out"
    rc, out, err = _eval(
        capsys,
        hf_dir / "hf",
        "--data", hf_dir / "prompts.jsonl",
        "--reward", f"{__name__}:has_w9",
        "--num-samples", 4, "--pass-at", 1, 4, "--maj-at", 4,
        "--max-new-tokens", 6, "--max-length", 16, "--temperature", 2.0,
        "--output", out_dir,
    )  # fmt: skip
    assert rc == 0, err
    # the held-out prompts read, and how many the length policy dropped (issue 42)
    assert (
        "data: 5 held-out prompts; none dropped (every prompt within data.max_length=16 tokens)\n"
        in err
    )
    report = json.loads((out_dir / "eval.json").read_text())
    m = report["metrics"]
    assert m["eval/num_examples"] == len(PROMPTS)
    assert {f"eval/{__name__}:has_w9", "eval/pass@1", "eval/pass@4", "eval/maj@4"} <= set(m)
    for key in m:  # the table names every metric
        assert key in out
    samples = [json.loads(x) for x in open(out_dir / "samples-0.jsonl")]
    assert len(samples) == len(PROMPTS) and all(len(s["completions"]) == 4 for s in samples)
    # the samples file holds the completions pass@k counted (the same seeds): pass@1 is the
    # share of samples scored 1, and each score is the reward of the text written
    flat = [r for s in samples for r in s["rewards"]]
    assert m["eval/pass@1"] == pytest.approx(sum(r == 1.0 for r in flat) / len(flat))
    for s in samples:
        assert s["rewards"] == has_w9(s["completions"])
    assert not (out_dir / "checkpoints").exists()


@pytest.mark.slow
def test_eval_scores_a_peft_adapter(hf_dir, tmp_path, capsys):
    config = M.ModelConfig.tiny("llama")
    lora = M.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    adapters = jax.tree.map(lambda x: x + 0.01, M.init_lora(config, lora, jax.random.PRNGKey(0)))
    adapter = tmp_path / "adapter"
    interop.export_peft_adapter(
        adapter, config=config, adapters=adapters, lora=lora, base_model=str(hf_dir / "hf")
    )
    rc, out, err = _eval(
        capsys,
        adapter,
        "--data", hf_dir / "prompts.jsonl",
        "--reward", f"{__name__}:has_w9",
        "--max-new-tokens", 4, "--max-length", 16,
        "--output", tmp_path / "out",
    )  # fmt: skip
    assert rc == 0, err
    assert "PEFT adapter" in err
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert report["metrics"]["eval/num_examples"] == len(PROMPTS)
    assert "samples" not in report  # no --num-samples: greedy only


def test_eval_without_data_or_reward_is_one_line(hf_dir, tmp_path, capsys):
    rc, _, err = _eval(capsys, hf_dir / "hf", "--reward", "math_answer")
    assert rc == 2 and err.count("\n") == 1 and "--data: no held-out prompts" in err
    rc, _, err = _eval(capsys, hf_dir / "hf", "--data", hf_dir / "prompts.jsonl")
    assert rc == 2 and err.count("\n") == 1 and "--reward: no reward" in err
    rc, _, err = _eval(
        capsys,
        hf_dir / "hf",
        "--data", hf_dir / "prompts.jsonl",
        "--reward", "math_answer",
        "--maj-at", 4,
    )  # fmt: skip
    assert rc == 2 and "--maj-at" in err and "--num-samples" in err
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow
def test_eval_of_an_offline_run_reads_its_held_out_sft_rows(tmp_path, capsys):
    import jaxrl_llm

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{a}+{b}="},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(4)
        for b in range(4)
    ]
    run = tmp_path / "sft"
    jaxrl_llm.train(
        {
            "algorithm": "sft",
            "output_dir": str(run),
            "max_steps": 1,
            "model": {"source": "tiny", "tokenizer": "char", "tiny": {"num_layers": 1}},
            "data": {"max_length": 32},
            "train": {"batch_size": 8},
            "logging": {"tensorboard": False, "plots": False},
        },
        train_dataset=rows,
        eval_dataset=rows[:3],
    )
    rc, _, err = _eval(capsys, run)
    assert rc == 2 and "--reward: no reward" in err and "sft" in err
    rc, out, err = _eval(capsys, run, "--reward", "math_answer", "--max-new-tokens", 3)
    assert rc == 0, err
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert report["step"] == 1 and report["metrics"]["eval/num_examples"] == 3
    assert report["metrics"]["eval/valid"] == 3  # every row had an answer to score against

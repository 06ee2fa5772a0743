import json

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxrl_llm import models as M
from jaxrl_llm import ops
from jaxrl_llm.cli.main import main
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY, MODEL_PRESETS, estimate_memory


def test_models_in_memory_match_the_source_texts():
    # ../shared/seeds: PPO 4, DPO 2, GRPO 2, KTO 2, SimPO/ORPO 1.
    expected = {"ppo": 4, "dpo": 2, "grpo": 2, "kto": 2, "simpo": 1, "orpo": 1}
    for algo, n in expected.items():
        assert estimate_memory(MODEL_PRESETS["135m"], algo).models_in_memory == n


def test_presets_have_published_parameter_counts():
    # Llama 2 7B: 6.74B, Llama 3.1 8B: 8.03B, Llama 3.1 70B: 70.6B, SmolLM2: 134.5M.
    assert MODEL_PRESETS["7b"].num_params() == pytest.approx(6.74e9, rel=0.01)
    assert MODEL_PRESETS["8b"].num_params() == pytest.approx(8.03e9, rel=0.01)
    assert MODEL_PRESETS["70b"].num_params() == pytest.approx(70.6e9, rel=0.01)
    assert MODEL_PRESETS["135m"].num_params() == pytest.approx(134.5e6, rel=0.01)
    # Gemma 4 31B: 30.7B (its card), counting the full-attention layers at their own size.
    assert MODEL_PRESETS["gemma4-31b"].num_params() == pytest.approx(30.7e9, rel=0.01)
    # stored with the sliding layers' heads padded 256 -> 512 and 4 -> 16 full-attention KV heads
    assert MODEL_PRESETS["gemma4-31b"].num_params(stored=True) == pytest.approx(38.07e9, rel=0.01)
    assert MODEL_PRESETS["8b"].num_params(stored=True) == MODEL_PRESETS["8b"].num_params()


def test_sharding_lora_and_remat_reduce_memory():
    c = MODEL_PRESETS["8b"]
    base = estimate_memory(c, "grpo", batch_size=4, seq_len=1024, group_size=8)
    fsdp = estimate_memory(c, "grpo", batch_size=4, seq_len=1024, group_size=8, fsdp=8)
    lora = estimate_memory(c, "grpo", batch_size=4, seq_len=1024, group_size=8, lora_rank=16)
    remat = estimate_memory(c, "grpo", batch_size=4, seq_len=1024, group_size=8, remat="full")
    assert fsdp.total_bytes_per_device < base.total_bytes_per_device / 4
    assert lora.total_bytes_per_device < base.total_bytes_per_device
    assert lora.weight_copies == 1 and base.weight_copies == 2  # reference = base, adapters off
    assert remat.total_bytes_per_device < base.total_bytes_per_device
    # Full fine-tuning: fp32 master + 2 Adam moments = 12 bytes/param through the step, + the
    # reference: a float32 copy of the master weights, as the trainers hold it
    # (frozen_dtype="fp32"); the fp32 gradients (4 bytes/param) only during the update.
    weights = sum(
        r.bytes for r in base.rows if r.model in ("learner", "reference") and not r.transient
    )
    assert weights == pytest.approx(c.num_params() * (12 + 4), rel=1e-6)
    grads = [r for r in base.rows if r.component == "gradients (fp32)"]
    assert [(r.model, r.transient) for r in grads] == [("learner", True)]
    assert grads[0].bytes == pytest.approx(4 * c.num_params(), rel=1e-6)


def test_bad_arguments_raise_config_errors():
    with pytest.raises(ConfigError, match="unknown algorithm 'ppo2'"):
        estimate_memory(MODEL_PRESETS["135m"], "ppo2")
    with pytest.raises(ConfigError, match="remat"):
        estimate_memory(MODEL_PRESETS["135m"], "sft", remat="some")
    with pytest.raises(ConfigError, match="fsdp must be >= 1"):
        estimate_memory(MODEL_PRESETS["135m"], "sft", fsdp=0)


def _xla_peak_bytes(c, B, T, remat):
    opt = optax.adamw(1e-4)

    def loss(p, toks, mask):
        out = M.apply(p, toks, config=c, attention_mask=mask, remat=remat)
        lp = ops.token_logprobs_from_hidden(
            out.hidden[:, :-1], out.unembed, toks[:, 1:], chunk_size=128
        )
        return -ops.masked_mean(lp, mask[:, 1:])

    def step(p, s, toks, mask):
        g = jax.grad(loss)(p, toks, mask)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    p = jax.eval_shape(lambda: M.init_params(c, jax.random.PRNGKey(0)))
    s = jax.eval_shape(opt.init, p)
    args = (p, s, jax.ShapeDtypeStruct((B, T), jnp.int32), jax.ShapeDtypeStruct((B, T), bool))
    ma = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().memory_analysis()
    return (
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        - ma.alias_size_in_bytes
        + ma.temp_size_in_bytes
    )


@pytest.mark.parametrize(
    "remat, B, T",
    [("none", 8, 96), ("dots", 8, 96), ("full", 8, 96), ("none", 2, 1024), ("full", 1, 2048)],
)
def test_estimate_within_20_percent_of_xla_memory_analysis(remat, B, T):
    # T = 1024 and 2048 run attention blockwise: with no remat every layer keeps about one
    # key block's probabilities per query (the estimate was 1.75x at T = 1024 when it counted
    # the naive path's T x T scores)
    c = M.ModelConfig.tiny(
        "llama",
        hidden_size=192,
        num_layers=6,
        vocab_size=8000,
        intermediate_size=512,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        tie_embeddings=False,
    )
    peak = _xla_peak_bytes(c, B, T, remat)
    est = estimate_memory(
        c, "sft", batch_size=B, seq_len=T, dtype="fp32", remat=remat, device="cpu"
    )
    assert est.total_bytes_per_device == pytest.approx(peak, rel=0.2)


def test_cli_json_and_table(capsys):
    assert (
        main(["memory", "--model", "7b", "--algorithm", "ppo", "--mesh", "fsdp=8", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["models_in_memory"] == 4 and isinstance(out["total_bytes_per_device"], int)
    assert out["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    assert main(["memory", "--algorithm", "simpo"]) == 0
    text = capsys.readouterr().out
    assert "models in memory: 1" in text and "verdict" in text
    assert main(["memory", "--algorithm", "dpo", "--mesh", "x=2"]) == 2
    assert "unknown axis 'x'" in capsys.readouterr().err


def test_every_algorithm_estimates():
    for algo in ALGORITHM_MEMORY:
        est = estimate_memory(MODEL_PRESETS["1b"], algo, device="tpu-v5e")
        assert est.total_bytes_per_device > 0 and est.table()


def test_moe_presets_count_total_and_active_parameters_and_split_experts():
    from jaxrl_llm.train.compile.memory import MODEL_PRESETS
    from jaxrl_llm.train.compile.memory_terms import expert_params

    c = MODEL_PRESETS["qwen3-30b-a3b"]
    # Qwen3-30B-A3B's model card: 30.5B parameters, 3.3B activated (ours: 3.35B, counting
    # the embedding and the untied head).
    assert round(c.num_params() / 1e9, 1) == 30.5
    assert abs(c.num_params(active=True) / 1e9 - 3.3) < 0.1
    kw = dict(batch_size=4, seq_len=512, dtype="bf16", remat="full", fsdp=2)
    one = estimate_memory(c, "sft", **kw)
    four = estimate_memory(c, "sft", expert=4, **kw)
    rows = {r.component: r.bytes for r in one.rows if r.model == "learner"}
    rows4 = {r.component: r.bytes for r in four.rows if r.model == "learner"}
    dense = c.num_params() - expert_params(c)
    # the expert axis splits only the experts' weights (and their gradients, moments)
    assert rows["weights (fp32 master)"] == pytest.approx(4 * c.num_params() / 2, rel=1e-6)
    assert rows4["weights (fp32 master)"] == pytest.approx(
        4 * (dense + expert_params(c) / 4) / 2, rel=1e-6
    )
    # tokens are replicated over it: the same activations per device
    assert rows4["activations (remat=full)"] == rows["activations (remat=full)"]


def test_distill_holds_the_teacher_beside_the_policy():
    small, big = MODEL_PRESETS["135m"], MODEL_PRESETS["1b"]
    same = estimate_memory(small, "distill", fsdp=4, device="cpu")
    assert same.models_in_memory == 2
    teacher = {r.component: r.bytes for r in same.rows if r.model == "teacher"}
    # frozen, float32 as the trainer loads it, split over the 4 fsdp shards
    assert teacher == {"weights (fp32, frozen)": pytest.approx(small.num_params() * 4 / 4)}
    larger = estimate_memory(small, "distill", fsdp=4, device="cpu", teacher_config=big)
    grown = larger.total_bytes_per_device - same.total_bytes_per_device
    assert grown == pytest.approx((big.num_params() - small.num_params()) * 4 / 4, rel=1e-6)


def test_gradient_accumulation_holds_a_float32_gradient_sum():
    # train/programs/step.py's scan over micro-batches carries Σ∇ (float32, sharded as the
    # parameters) beside each micro-batch's gradient; separate optimizer updates do not.
    c = MODEL_PRESETS["8b"]
    kw = dict(batch_size=16, seq_len=1024, fsdp=4, remat="full", device="tpu-v5p")
    acc = estimate_memory(c, "dpo", micro_batches=4, **kw)
    updates = estimate_memory(c, "dpo", minibatches=4, **kw)
    summed = {r.component: r.bytes for r in acc.rows if r.model == "learner"}
    gsum = summed["gradient sum (fp32, micro-batches)"]
    assert gsum == pytest.approx(4 * c.num_params() / 4, rel=1e-6)
    assert not any("gradient sum" in r.component for r in updates.rows)
    # the same rows per forward/backward: the totals differ by the sum alone
    assert acc.total_bytes_per_device - updates.total_bytes_per_device == gsum
    lora = estimate_memory(c, "dpo", micro_batches=4, lora_rank=16, **kw)
    lora_sum = [r.bytes for r in lora.rows if r.component.startswith("gradient sum")]
    from jaxrl_llm.train.compile.memory_terms import lora_params

    assert lora_sum == [pytest.approx(4 * lora_params(c, 16) / 4, rel=1e-6)]  # adapters only


def test_hybrid_stack_counts_linear_layers_by_kind():
    from jaxrl_llm.train.compile.memory_terms import activation_bytes_per_token_per_layer

    c = MODEL_PRESETS["qwen3.5-9b"]
    assert (c.num_linear_layers, c.num_attention_layers) == (24, 8)
    # transformers' Qwen3_5TextConfig defaults ("Qwen3.5-9B style"): 8.95B parameters
    assert c.num_params() == pytest.approx(8.954e9, rel=1e-3)
    est = estimate_memory(
        c, "grpo", batch_size=8, group_size=8, seq_len=1024, prompt_len=512, fsdp=4,
        remat="full", minibatches=4, device="tpu-v5p",
    )  # fmt: skip
    rollout = {r.component: r.bytes for r in est.rows if r.model == "rollout"}
    # keys and values only in the 8 attention layers (4 KV heads of 256), 16 rows per device
    assert rollout["KV cache (16 rows x 1024 slots)"] == 2 * 8 * 16 * 1024 * 4 * 256 * 2
    # each linear layer: a [3, 8192] bf16 conv window and a float32 [32, 128, 128] state per row
    state = rollout["recurrent state (24 linear layers)"]
    assert state == 24 * 16 * (3 * 8192 * 2 + 4 * 32 * 128 * 128)

    def per_token(seq_len, linear):
        return activation_bytes_per_token_per_layer(
            c, seq_len, remat="none", dtype_bytes=2, linear=linear
        )

    # a linear layer has no T x T scores: its bytes per token do not grow with T
    assert per_token(256, True) == per_token(8192, True)
    # an attention layer keeps float32 scores and probabilities (2 · H · T per token) on the
    # naive path (T ≤ 512), and only a running maximum and sum per head (2 · H) blockwise
    assert per_token(256, False) - per_token(128, False) == 2 * 4 * 16 * 128
    assert per_token(8192, False) == per_token(1024, False) < per_token(512, False)
    # remat full: the stack scans periods of 4 layers, so it keeps 8 period inputs, and one
    # whole period (3 linear layers, 1 attention layer) is live again in its backward pass
    sft = estimate_memory(c, "sft", batch_size=2, seq_len=256, remat="full", device="cpu")
    act = next(r.bytes for r in sft.rows if r.component == "activations (remat=full)")
    assert act == 2 * 256 * (8 * 4096 * 2 + 3 * per_token(256, True) + per_token(256, False))


def test_qwen3_5_moe_preset_counts_experts_and_the_shared_expert():
    from jaxrl_llm.train.compile.memory_terms import expert_params

    c = MODEL_PRESETS["qwen3.5-35b-a3b"]
    # transformers' Qwen3_5MoeTextConfig defaults ("Qwen3.5-35B-A3B style"): 34.66B in all,
    # 3.45B active (8 of 256 experts, the shared expert, embedding and untied head)
    assert c.num_params() == pytest.approx(34.66e9, rel=1e-3)
    assert c.num_params(active=True) == pytest.approx(3.455e9, rel=1e-3)
    assert expert_params(c) == 40 * 256 * 3 * 2048 * 512
    assert (c.num_linear_layers, c.num_attention_layers, c.shared_expert_size) == (30, 10, 512)


def test_long_sequences_keep_one_key_block_of_scores_per_query():
    # Llama-3.2-1B GRPO on v5e:2x2 (fsdp=4), T = 1024: attention runs blockwise, and the
    # compiled step's second largest buffer is one f32[16,8,4,512,512] (16 rows' 512
    # completion tokens x 32 heads x one 512-key block) for the layer its backward
    # recomputes, not 2 · 4 · H · T bytes a token (the naive path's scores and probabilities)
    from jaxrl_llm.train.compile.memory_terms import kept_scores_bytes_per_token

    assert kept_scores_bytes_per_token(32, 1024) * 16 * 512 == 16 * 8 * 4 * 512 * 512 * 4 + (
        2 * 4 * 32 * 16 * 512  # and the running maximum and sum
    )
    assert kept_scores_bytes_per_token(32, 8192) == kept_scores_bytes_per_token(32, 1024)
    assert kept_scores_bytes_per_token(32, 512) == 2 * 4 * 32 * 512  # naive: T² ≤ 512²


def test_fsdp_step_holds_the_unembedding_gathered_whole():
    # the log-prob chunks take the whole [D, V] unembedding in the compute dtype: XLA
    # all-gathers it once (bf16[4096,128256] in the 8B steps compiled for v5p on fsdp=4)
    c = MODEL_PRESETS["8b"]
    kw = dict(batch_size=8, group_size=8, seq_len=1024, remat="full", device="tpu-v5p")
    rows = {r.component: r.bytes for r in estimate_memory(c, "grpo", fsdp=4, **kw).rows}
    assert rows["unembedding gathered (bf16)"] == 4096 * 128256 * 2
    # ... and its gradient is whole until the all-reduce over fsdp (bf16[8192,128256] all-
    # reduced in the 70B GRPO step on v5p:4x4x4)
    assert rows["unembedding gradient, whole (bf16)"] == 4096 * 128256 * 2
    one = estimate_memory(c, "grpo", **kw)  # one device: the bf16 copy is the whole table
    assert not any(r.component.startswith("unembedding g") for r in one.rows)


def test_kv_shared_layers_hold_no_cache_of_their_own():
    """Gemma 4's KV sharing: the rollout's KV cache holds the layers that compute keys only,
    as init_cache and init_paged_cache allocate it."""
    local, glob = M.LayerType.LOCAL, M.LayerType.GLOBAL
    shared = M.ModelConfig.tiny(
        "gemma4_text",
        layer_types=(local, glob, local, glob),
        kv_shared_layers=2,
        double_wide_mlp=True,
        intermediate_size=160,
    )
    plain = M.ModelConfig.tiny("gemma4_text", layer_types=(local, glob, local, glob))
    kw = dict(batch_size=2, group_size=4, seq_len=64, prompt_len=32)
    kv = {
        c.kv_shared_layers: {r.component: r.bytes for r in estimate_memory(c, "grpo", **kw).rows}[
            "KV cache (8 rows x 64 slots)"
        ]
        for c in (shared, plain)
    }
    assert shared.num_kv_layers == 2 and kv[2] * 2 == kv[0]
    assert M.init_cache(shared, 8, 64).k.shape[0] == 2
    assert M.init_paged_cache(shared, 4, 16).k.shape[0] == 2


# The entry layouts of gpt-oss-20b's GRPO train step compiled for v5p:2x2x2 with fsdp=8
# (XLA_FLAGS=--xla_dump_to, after_optimizations.txt: entry_computation_layout): shard shape ->
# the dimension laid out minor (the first of the minor-to-major list).
GPT_OSS_FSDP8_MINOR = {
    (2, 1024): 1,
    (201088, 360): 0,  # the embedding: 201,088 lanes pad nothing, 360 pads to 384
    (24, 2880): 1,
    (24, 32, 2880, 360): 2,  # experts_down, laid out {2,3,1,0}
    (24, 32, 2880): 2,
    (24, 32, 360, 2880): 3,  # experts_gate / experts_up keep the default
    (24, 32, 360): 2,
    (24, 32): 1,
    (24, 360, 32): 1,
    (24, 360, 64, 64): 1,
    (24, 360, 8, 64): 1,
    (24, 360): 1,
    (24, 64, 64, 360): 3,
    (24, 64, 64): 2,
    (24, 64): 1,
    (24, 8, 64): 2,
    (2880,): 0,
    (360, 201088): 1,
}


def test_tpu_lays_out_minor_the_dimension_padded_least():
    from jaxrl_llm.train.compile.memory_tiles import tpu_minor_dim

    assert {s: tpu_minor_dim(s) for s in GPT_OSS_FSDP8_MINOR} == GPT_OSS_FSDP8_MINOR


def test_tpu_update_of_a_relaid_weight_is_a_phase_of_its_own():
    # gpt-oss-20b on fsdp=8: experts_down's shard f32[24,32,2880,360] is laid out with 2,880
    # minor; its weight and AdamW moments are copied into the gradient's layout and updated
    # there: six f32[24,32,2880,360] (360 padded to 384) live at the compiled step's peak
    from jaxrl_llm.train.compile.memory_tiles import relaid_weights

    c = MODEL_PRESETS["gpt-oss-20b"]
    assert relaid_weights(c, {"fsdp": 8})["layers/experts_down/kernel"] == (24, 32, 2880, 360)
    kw = dict(batch_size=8, group_size=8, seq_len=1024, remat="full", fsdp=8, minibatches=4)
    est = estimate_memory(c, "grpo", device="tpu-v5p", **kw)
    rows = {(r.model, r.component): r for r in est.rows}
    update = rows["optimizer", "update out of place (TPU layout)"]
    assert update.transient and update.bytes == 6 * 4 * 24 * 32 * 2880 * 384
    # a phase after the backward pass: the peak holds it or the policy's transients, not both
    policy = sum(r.bytes for r in est.rows if r.model == "learner" and r.transient)
    resident = sum(r.bytes for r in est.rows if not r.transient)
    rollout = sum(r.bytes for r in est.rows if r.model == "rollout" and r.transient)
    assert est.total_bytes_per_device == resident + max(policy, update.bytes, rollout)
    # not on a GPU, not with LoRA (the adapters train), not where every shard is lane-aligned
    for other in (
        estimate_memory(c, "grpo", device="h100", **kw),
        estimate_memory(c, "grpo", device="tpu-v5p", lora_rank=16, **kw),
        estimate_memory(MODEL_PRESETS["8b"], "grpo", device="tpu-v5p", **{**kw, "fsdp": 4}),
    ):
        assert not any(r.model == "optimizer" for r in other.rows)


def test_auto_sampler_on_cpu_picks_a_degree_that_fits(monkeypatch):
    """Issue 54: ``rollout.tensor: auto`` for 7B at fsdp=8 on 8 CPU devices took tensor=1 (a
    whole float32 copy per device, which did not fit) where tensor=8 fits; on CPU (no chip
    model) it now sizes against the memory the table fits against."""
    from jaxrl_llm.train.compile import memory

    gib = 1024**3
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: int(23.54 * gib))
    c = MODEL_PRESETS["7b"]
    kw = dict(
        device="cpu",
        fsdp=8,
        batch_size=8,
        group_size=8,
        seq_len=1024,
        remat="full",
        lora_rank=16,
    )
    chosen = memory.auto_sampler(c, "grpo", **kw)
    assert chosen["sampler_tensor"] > 1, chosen
    fits = estimate_memory(c, "grpo", **kw, **chosen).total_bytes_per_device
    whole = estimate_memory(
        c, "grpo", **kw, sampler_tensor=1, sampler_replicas=8, sampler_dtype="fp32"
    ).total_bytes_per_device
    assert fits <= 23.54 * gib < whole  # the chosen layout fits; a copy per device does not

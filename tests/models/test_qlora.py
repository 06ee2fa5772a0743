"""QLoRA: the quantised frozen base (jaxrl_llm/models/quant.py) under LoRA."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import models as M
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import quant
from jaxrl_llm.models.lora import LoRAConfig, attach_lora, init_lora, merge_lora
from jaxrl_llm.train.compile.memory import MODEL_PRESETS, estimate_memory
from jaxrl_llm.train.compile.memory_terms import projection_bytes

# QLoRA, Appendix E / bitsandbytes' published NF4 table (facts to check our construction against).
PUBLISHED_NF4 = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
]


def test_nf4_code_book_is_qloras():
    np.testing.assert_allclose(quant.nf4_code_book(), PUBLISHED_NF4, atol=2e-6)


def test_nf4_block_is_64_or_the_largest_even_divisor():
    assert quant.nf4_block(4096) == 64 and quant.nf4_block(14336) == 64
    assert quant.nf4_block(48) == 48 and quant.nf4_block(80) == 40
    with pytest.raises(ValueError, match="even"):
        quant.nf4_block(15)


@pytest.mark.parametrize("shape,n_in", [((3, 96, 5, 7), 1), ((2, 3, 16, 40), 2)])
def test_int8_error_is_at_most_half_a_scale(shape, n_in):
    """Round to nearest of W / s with s = absmax / 127 never clips (|W / s| ≤ 127), so each
    element is off by at most s / 2 (its output channel's scale), up to float32 rounding."""
    w = jax.random.normal(jax.random.PRNGKey(0), shape)
    q = quant.quantize_int8(w, n_in)
    assert q["kernel_int8"].dtype == jnp.int8 and q["kernel_int8"].shape == shape
    assert q["kernel_scale"].shape == (shape[0], *([1] * n_in), *shape[1 + n_in :])
    back = quant.dequantize_kernel(q, n_in, jnp.float32, stacked=True)
    err = np.abs(np.asarray(back - w))
    bound = np.broadcast_to(np.asarray(q["kernel_scale"]) / 2, shape)
    assert (err <= bound * (1 + 1e-5)).all()
    # and the bound is tight enough to mean something: ~uniform rounding error, mean s/4
    assert 0.15 < float(err.mean() / bound.mean()) < 0.65


@pytest.mark.parametrize("shape,n_in,block", [((2, 128, 6), 1, 64), ((2, 3, 16, 40), 2, 16)])
def test_nf4_error_is_at_most_half_the_widest_code_gap(shape, n_in, block):
    """Each scaled value x = w / absmax ∈ [−1, 1] is rounded to the nearest of the 16 codes, so
    |w − absmax · code| ≤ absmax · max_gap / 2, max_gap the widest gap between neighbouring
    codes (1 − 0.6962 = 0.3038, at the bottom end)."""
    w = jax.random.normal(jax.random.PRNGKey(1), shape)
    q = quant.quantize_nf4(w, n_in)
    ax = n_in  # the packed axis (the last input dim)
    assert q["kernel_nf4"].dtype == jnp.uint8
    assert q["kernel_nf4"].shape[ax] == shape[ax] // 2  # two codes per byte
    assert q["kernel_absmax"].shape[ax] == shape[ax] // block
    back = quant.dequantize_kernel(q, n_in, jnp.float32, stacked=True)
    absmax = np.repeat(np.asarray(q["kernel_absmax"]), block, axis=ax)
    max_gap = float(np.max(np.diff(quant.nf4_code_book())))
    err = np.abs(np.asarray(back - w))
    assert (err <= absmax * max_gap / 2 + 1e-6).all()
    # every block's largest element is exact (code ±1)
    blocks = np.asarray(w).reshape(*shape[:ax], shape[ax] // block, block, *shape[ax + 1 :])
    at = np.argmax(np.abs(blocks), axis=ax + 1)
    exact = np.take_along_axis(
        np.asarray(back).reshape(blocks.shape) - blocks, np.expand_dims(at, ax + 1), ax + 1
    )
    np.testing.assert_allclose(exact, 0.0, atol=1e-6)


def _tiny():
    c = M.ModelConfig.tiny("llama")
    base = M.init_params(c, jax.random.PRNGKey(0))
    toks = jax.random.randint(jax.random.PRNGKey(2), (2, 7), 0, c.vocab_size)
    return c, base, toks


# Logits of the random-initialised tiny llama (std ≈ 0.157): the quantised forward's largest
# difference from the float one, measured 0.0030 (int8) and 0.042 (nf4); asserted with margin
# as a fraction of the float logits' std.
FORWARD_TOLERANCE = {"int8": 0.05, "nf4": 0.5}


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_quantised_forward_is_the_dequantised_forward(kind):
    """The layer dequantises its own kernels: the forward of the quantised tree equals the
    forward of the explicitly dequantised float tree, and differs from the float base only
    by the quantisation error (FORWARD_TOLERANCE)."""
    c, base, toks = _tiny()
    q = quant.quantize_base(base, kind)
    assert quant.holds_quantized(q["layers"])
    assert not any("kernel" in q["layers"][n] for n in quant.PROJECTION_IN_DIMS)
    got, _ = M.forward(q, toks, config=c)
    deq, _ = M.forward(quant.dequantize_base(q, jnp.float32), toks, config=c)
    ref, _ = M.forward(base, toks, config=c)
    np.testing.assert_allclose(got, deq, atol=1e-5)
    assert float(jnp.max(jnp.abs(got - ref))) < FORWARD_TOLERANCE[kind] * float(jnp.std(ref))


@pytest.mark.parametrize("remat", ["none", "full"])
def test_adapter_gradients_on_a_quantised_base_match_its_float_copy(remat):
    """LoRA's gradient on an nf4 base is the gradient on the dequantised float base (the base
    itself is integer codes and takes none)."""
    c, base, toks = _tiny()
    q = quant.quantize_base(base, "nf4")
    lc = LoRAConfig(rank=2, base_dtype="nf4")
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    ad = jax.tree.map(lambda x: x + 0.01, ad)

    def loss(ad, b):
        h = M.apply(attach_lora(b, ad, lc), toks, config=c, remat=remat).hidden
        return jnp.mean(h**2)

    g = jax.grad(loss)(ad, q)
    g_float = jax.grad(loss)(ad, quant.dequantize_base(q, jnp.float32))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_float)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    assert float(jnp.abs(g["layers"]["q_proj"]["b"]).sum()) > 0


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_merge_and_export_give_float_weights(kind, tmp_path):
    """Export merges into float weights: dequantised base + (α/r)·A B (in bfloat16), written
    as a float32 Hugging Face checkpoint that loads back to the same kernels."""
    from jaxrl_llm.interop import export_hf, load_model

    c, base, _ = _tiny()
    q = quant.quantize_base(base, kind)
    lc = LoRAConfig(rank=2, alpha=4.0, base_dtype=kind)
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    ad = jax.tree.map(lambda x: x + 0.05, ad)
    merged = merge_lora(q, ad, lc)
    w = merged["layers"]["down_proj"]["kernel"]
    # merged in bfloat16, the dtype the quantised base keeps its other weights in
    assert w.dtype == jnp.bfloat16
    deq = quant.dequantize_base(q, jnp.float32)["layers"]["down_proj"]["kernel"]
    a, b = ad["layers"]["down_proj"]["a"], ad["layers"]["down_proj"]["b"]
    want = deq + 2.0 * jnp.einsum("lir,lro->lio", a, b)
    # two bfloat16 roundings (the dequantised kernel, then the sum), each within 2^-8 of its
    # value (bfloat16's unit roundoff: 8 significant bits)
    err = np.abs(np.asarray(w.astype(jnp.float32) - want))
    assert (err <= 2**-8 * (np.abs(np.asarray(deq)) + np.abs(np.asarray(want))) + 1e-7).all()
    export_hf(tmp_path / "hf", config=c, params=merged, dtype="float32")
    index = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert index["torch_dtype"] == "float32"
    _, loaded, _ = load_model(str(tmp_path / "hf"))
    for name in quant.PROJECTION_IN_DIMS:
        np.testing.assert_allclose(
            loaded["layers"][name]["kernel"],
            merged["layers"][name]["kernel"].astype(jnp.float32),
            atol=1e-6,
        )


def test_base_dtype_config():
    from jaxrl_llm.train.config.sections import LoRASection

    assert LoRASection().base_dtype == "float32"
    assert LoRASection(base_dtype="nf4").base_dtype == "nf4"
    with pytest.raises(ConfigError, match=r"model.lora.base_dtype: unknown 'int4'; allowed"):
        LoRASection(base_dtype="int4")
    with pytest.raises(ValueError, match="base_dtype"):
        LoRAConfig(base_dtype="fp8")


def _base_rows(base_dtype):
    e = estimate_memory(
        MODEL_PRESETS["8b"],
        "grpo",
        batch_size=8,
        seq_len=1024,
        group_size=8,
        fsdp=8,
        lora_rank=16,
        device="tpu-v5e",
        lora_base_dtype=base_dtype,
    )
    return {r.component: r.bytes for r in e.rows if r.component.startswith("base ")}, e


def test_8b_lora_memory_shows_the_quantised_base():
    """8B GRPO LoRA on 8 chips: the projections (87% of the weights) shrink 2x with int8 and
    ~3.6x with nf4 against bf16 (½ byte + a float32 absmax per 64 = 0.5625 bytes per weight);
    the embeddings and norms stay bf16."""
    bf16, e16 = _base_rows("bfloat16")
    int8, e8 = _base_rows("int8")
    nf4, e4 = _base_rows("nf4")
    n = MODEL_PRESETS["8b"].num_params()
    proj, _ = projection_bytes(MODEL_PRESETS["8b"], "bfloat16")
    assert 0.85 < proj / n < 0.9
    proj16 = proj * 2 / 8
    assert int8["base projections (int8, frozen)"] == pytest.approx(proj16 / 2, rel=1e-3)
    assert nf4["base projections (nf4, frozen)"] == pytest.approx(proj16 / 2 * 0.5625, rel=1e-3)
    whole16 = bf16["base weights (bfloat16, frozen)"]
    assert 1.7 < whole16 / sum(int8.values()) < 1.9
    assert 2.5 < whole16 / sum(nf4.values()) < 2.8
    assert e16.total_bytes_per_device > e8.total_bytes_per_device > e4.total_bytes_per_device
    with pytest.raises(ConfigError, match="lora_base_dtype"):
        _base_rows("int4")


def _digit_reward(prompts, completions, answer, **kwargs):
    """1 when the completion holds the answer (the tiny model's rows, tests/train/harness)."""
    return [float(answer[i] in c[0]["content"]) for i, c in enumerate(completions)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_a_lora_grpo_step_runs_on_a_quantised_base(kind, tmp_path):
    """One GRPO step of the tiny model with LoRA on an int8 / nf4 base: the frozen base is
    stored quantised, the adapters move, and the Hugging Face export is float."""
    import jaxrl_llm
    from tests.train.harness import CHAT_ROWS, tiny_online_args

    model = dict(
        source="tiny", tokenizer="char", tiny=dict(num_layers=1), lora=dict(base_dtype=kind)
    )
    trainer = jaxrl_llm.GRPOTrainer(
        reward_funcs=[_digit_reward],
        train_dataset=CHAT_ROWS,
        args=tiny_online_args(tmp_path / "run", model=model, optim=dict(lr=1e-2)),
    )
    summary = trainer.train()
    assert summary["steps"] == 1
    policy = trainer.loop.policy
    assert policy.lora.base_dtype == kind and quant.holds_quantized(policy.base["layers"])
    b = policy.state.params["layers"]["q_proj"]["b"]
    assert float(jnp.abs(b).max()) > 0  # the adapters trained (B starts at 0)
    merged = trainer.model
    assert merged["layers"]["q_proj"]["kernel"].dtype == jnp.bfloat16
    from safetensors import safe_open

    out = trainer.save_model(str(tmp_path / "hf"))
    with safe_open(f"{out}/model.safetensors", "np") as f:
        dtypes = {f.get_tensor(k).dtype.kind for k in f.keys()}
    assert dtypes == {"f"}  # the merged checkpoint is float, no int8 / uint8 codes


def test_nf4_on_an_odd_input_dim_is_a_config_error():
    """nf4 packs two codes per byte along the last input dim: an odd MLP width (down_proj's
    input) is refused in one line when the run builds its base."""
    from jaxrl_llm.parallel import make_mesh
    from jaxrl_llm.train.programs.policy import frozen_base

    c = M.ModelConfig.tiny("llama", intermediate_size=81)
    shapes = jax.eval_shape(lambda: M.init_params(c, jax.random.PRNGKey(0)))
    with pytest.raises(ConfigError, match=r"model.lora.base_dtype=nf4: nf4 needs an even"):
        frozen_base(shapes, M.param_logical_axes(c), make_mesh(), "nf4", abstract=True)
    base, _ = frozen_base(shapes, M.param_logical_axes(c), make_mesh(), "int8", abstract=True)
    assert base["layers"]["o_proj"]["kernel_int8"].dtype == jnp.int8


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_the_backward_keeps_no_float_copy_of_a_quantised_base(remat):
    """Under remat the layer is recomputed in the backward: what the step saves for it holds no
    float array of a projection kernel's shape (a float base's kernels are saved, as constants)."""
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    c, base, toks = _tiny()
    lc = LoRAConfig(rank=2)
    ad = init_lora(c, lc, jax.random.PRNGKey(1))
    kernels = {
        f"{t}[{','.join(map(str, base['layers'][n]['kernel'].shape))}]"
        for n in quant.PROJECTION_IN_DIMS
        for t in ("f32", "bf16")
    }

    def float_kernels(b):
        def loss(ad):
            h = M.apply(attach_lora(b, ad, lc), toks, config=c, remat=remat).hidden
            return jnp.mean(h**2)

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(loss, ad)
        return [line for line in out.getvalue().splitlines() if line.split(" ")[0] in kernels]

    assert float_kernels(base)  # the check sees kernels where they are kept
    assert float_kernels(quant.quantize_base(base, "nf4")) == []

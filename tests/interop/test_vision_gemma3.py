"""Gemma 3 with its vision tower against transformers' ``Gemma3ForConditionalGeneration``
(float32, CPU): import keeps the tower, image+text logits and greedy generation (the static
engine's decode loop after :func:`prefill_with_images`) equal transformers', export loads back
into transformers with the same logits, and the bad inputs fail in one line.

The tiny model has odd, distinct sizes (text D=48, 3 heads, 1 KV head, V=101; SigLIP Dv=40,
5 heads, 24-pixel images of 4-pixel patches, 9 soft tokens per image), a sliding window (8)
shorter than an image's 9 tokens so the window and the image's bidirectional block interact.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxrl_llm import interop, sampling  # noqa: E402
from jaxrl_llm.errors import ModelLoadError  # noqa: E402
from jaxrl_llm.models.families.gemma import vision as V  # noqa: E402

IMAGE, BOI, EOI, EOS = 99, 97, 98, 2
M = 9  # soft tokens per image


def _tiny_gemma3(seed: int = 0):
    """A random Gemma3ForConditionalGeneration with every weight redrawn (norms near 1)."""
    text = transformers.Gemma3TextConfig(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    vis = transformers.SiglipVisionConfig(
        hidden_size=40,
        intermediate_size=56,
        num_hidden_layers=2,
        num_attention_heads=5,
        image_size=24,
        patch_size=4,
        vision_use_head=False,
    )
    cfg = transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vis.to_dict(),
        mm_tokens_per_image=M,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE,
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    norms = ("norm.weight", "layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * z if name.endswith(norms) else 0.1 * z)
    return model


def _prompt(text_a=(5, 6), text_b=(7, 8), tail=(10, 11)) -> list[int]:
    """Two images, each ``BOI IMAGE×9 EOI``, between text tokens."""
    img = [BOI] + [IMAGE] * M + [EOI]
    return [1, *text_a, *img, *text_b, *img, *tail]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = _tiny_gemma3()
    d = tmp_path_factory.mktemp("gemma3_vlm")
    model.save_pretrained(d)
    pixels = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(7))
    return model, d, pixels


@pytest.fixture(scope="module")
def vlm(saved):
    return interop.load_vision_model(saved[1])


def _hf_logits(model, ids, pixels):
    tokens = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=tokens, pixel_values=pixels, token_type_ids=(tokens == IMAGE).long())
    return out.logits.numpy()


def test_import_keeps_the_tower_and_logits_equal_transformers(saved, vlm):
    model, _, pixels = saved
    assert vlm.vision.mm_tokens_per_image == M and "vision" in vlm.params
    ids = _prompt()
    ours = V.forward_with_images(
        vlm.params,
        jnp.asarray([ids]),
        jnp.asarray(pixels.numpy()),
        config=vlm.config,
        vision=vlm.vision,
    )
    ref = _hf_logits(model, ids, pixels)
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=1e-4)
    # the image tokens' bidirectional attention matters: a causal-only run differs
    with torch.no_grad():
        causal = model(input_ids=torch.tensor([ids]), pixel_values=pixels).logits.numpy()
    assert np.abs(causal - ref).max() > 1e-2


def test_text_only_load_of_the_same_directory_drops_the_tower(saved, vlm):
    text = interop.load_model(str(saved[1]))
    assert "vision" not in text.params
    assert set(vlm.params) == set(text.params) | {"vision"}
    jax.tree.map(
        np.testing.assert_array_equal,
        text.params,
        {k: v for k, v in vlm.params.items() if k != "vision"},
    )


def _hf_greedy(model, ids, pixels, new):
    tokens = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=tokens,
            attention_mask=torch.ones_like(tokens),
            pixel_values=pixels,
            token_type_ids=(tokens == IMAGE).long(),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def test_greedy_generation_with_images_equals_transformers_generate(saved, vlm):
    """Two left-padded prompts (two images, one image) prefilled once each and decoded as
    groups of two samples (the engine's shared-prompt layout): every row equals
    transformers' ``generate`` of its prompt alone."""
    model, _, pixels = saved
    a = _prompt()
    b = [1, 12, BOI, *[IMAGE] * M, EOI, 13, 14]
    pix_b = torch.randn(1, 3, 24, 24, generator=torch.Generator().manual_seed(9))
    new, g = 8, 2
    want = [_hf_greedy(model, a, pixels, new), _hf_greedy(model, b, pix_b, new)]
    width = len(a) + 1  # one pad slot in front of the longer prompt too
    rows = [[0] * (width - len(p)) + p for p in (a, b)]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in (a, b)]
    logits, cache, nxt = V.prefill_with_images(
        vlm.params,
        jnp.asarray(rows),
        jnp.asarray(mask),
        jnp.asarray(torch.cat([pixels, pix_b]).numpy()),  # images in reading order
        config=vlm.config,
        vision=vlm.vision,
        cache_len=width + new,
    )
    state = sampling.init_decode_state(
        logits,
        cache,
        nxt,
        jnp.arange(2, dtype=jnp.int32),
        seed=0,
        num_samples=g,
        gen_len=new,
        max_new_tokens=new,
    )
    text_params = {k: v for k, v in vlm.params.items() if k != "vision"}
    out = sampling.decode(
        text_params,
        state,
        config=vlm.config,
        sampling=sampling.SamplingConfig(greedy=True),
        stop_ids=(EOS,),
    )
    got = [np.asarray(out.tokens[r, : int(out.lengths[r])]).tolist() for r in range(2 * g)]
    assert got == [want[0], want[0], want[1], want[1]]
    assert want[0] != want[1]  # the prompts differ in what they generate


def test_export_loads_back_into_transformers_with_the_same_logits(saved, vlm, tmp_path):
    model, _, pixels = saved
    interop.export_vision_hf(tmp_path, config=vlm.config, vision=vlm.vision, params=vlm.params)
    back, info = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = _prompt()
    np.testing.assert_allclose(
        _hf_logits(back.eval(), ids, pixels), _hf_logits(model, ids, pixels), atol=1e-5
    )


def test_an_image_on_a_text_only_model_is_one_line(tmp_path):
    cfg = transformers.Gemma3TextConfig(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
    )
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no vision tower") as e:
        interop.load_vision_model(tmp_path)
    assert "\n" not in str(e.value)


def test_images_on_text_only_params_are_one_line(vlm):
    text = {k: v for k, v in vlm.params.items() if k != "vision"}
    with pytest.raises(ValueError, match="without a vision tower") as e:
        V.embed_with_images(
            text,
            jnp.asarray([_prompt()]),
            jnp.zeros((2, 3, 24, 24)),
            config=vlm.config,
            vision=vlm.vision,
        )
    assert "\n" not in str(e.value)


def test_more_images_than_placeholders_is_one_line(vlm):
    with pytest.raises(ValueError, match=r"3 image\(s\) need 27 image placeholder tokens") as e:
        V.check_placeholders(np.asarray([_prompt()]), 3, vlm.vision)
    assert "\n" not in str(e.value)
    V.check_placeholders(np.asarray([_prompt()]), 2, vlm.vision)  # the right count passes
    with pytest.raises(ValueError, match="3 image"):  # the model's entry point checks too
        V.forward_with_images(
            vlm.params,
            jnp.asarray([_prompt()]),
            jnp.zeros((3, 3, 24, 24)),
            config=vlm.config,
            vision=vlm.vision,
        )

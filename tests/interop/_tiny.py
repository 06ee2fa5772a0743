"""Tiny random transformers models and a tiny tokenizer for interop / parity tests.

Sizes are odd and distinct (2 layers, D=48, 3 heads, 1 KV head, E=16, V=97, F=80) so that a
wrong reshape or transpose cannot hide.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers

SIZES = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)

# name -> (transformers config class, extra config kwargs)
VARIANTS = {
    "llama_tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True)),
    "llama_untied": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3_rope": (
        transformers.LlamaConfig,
        dict(
            tie_word_embeddings=False,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "mistral": (transformers.MistralConfig, dict(tie_word_embeddings=False, sliding_window=5)),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, dict(tie_word_embeddings=True)),
}


def tiny_hf_config(variant: str, **overrides):
    """A transformers config of the tiny size for one variant."""
    cls, extra = VARIANTS[variant]
    return cls(**{**SIZES, **extra, **overrides})


def randomize_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Re-draw every parameter (norm weights around 1, others N(0, 0.1²)) so a mapping error
    in any tensor, biases and norms included, changes the logits visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def tiny_hf_model(variant: str, *, seq_cls: bool = False, seed: int = 0, **overrides):
    """A random-initialised transformers causal LM (or 1-label sequence classifier)."""
    cfg = tiny_hf_config(variant, **overrides)
    torch.manual_seed(seed)
    if seq_cls:
        cfg.num_labels = 1
        model = transformers.AutoModelForSequenceClassification.from_config(cfg)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return randomize_(model, seed)


def tokens_and_mask(seed: int = 0, batch: int = 3, length: int = 11, pad: int = 4):
    """Random tokens ``[B, T]`` and a mask whose last row is left-padded by ``pad``."""
    rng = np.random.RandomState(seed)
    toks = rng.randint(3, SIZES["vocab_size"], (batch, length))
    mask = np.ones((batch, length), bool)
    mask[-1, :pad] = False
    toks[~mask] = SIZES["pad_token_id"]
    return toks, mask


def torch_logits(model, toks: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """transformers logits with our positions (cumsum(mask) − 1) and attention mask."""
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(toks),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(positions.astype(np.int64)),
        )
    return out.logits.float().numpy()


def tiny_tokenizer():
    """A word-level fast tokenizer over the tiny vocabulary, with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>", "user", "assistant", "system"]
    words += [f"w{i}" for i in range(SIZES["vocab_size"] - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> "
        "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
    )
    return fast


def hf_greedy(hf, prompts: list[list[int]], new: int) -> np.ndarray:
    """transformers' greedy continuation ``[R, new]`` of the token-id ``prompts``, left-padded
    with id 2 and no stop token (exactly ``new`` tokens a row)."""
    p = max(len(x) for x in prompts)
    ids = np.full((len(prompts), p), 2, np.int64)
    mask = np.zeros((len(prompts), p), np.int64)
    for r, x in enumerate(prompts):
        ids[r, p - len(x) :] = x
        mask[r, p - len(x) :] = 1
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )
    return out[:, p:].numpy()


def left_padded_batch(
    vocab: int, pad_id: int, *, length: int, pads: tuple[int, ...], seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids ``[R, length]`` from 3 up to ``vocab``, mask): row r left-padded by
    ``pads[r]`` ``pad_id`` tokens."""
    rng = np.random.RandomState(seed)
    toks = rng.randint(3, vocab, (len(pads), length))
    mask = np.ones(toks.shape, bool)
    for r, p in enumerate(pads):
        mask[r, :p] = False
    toks[~mask] = pad_id
    return toks, mask


def forward_logits(params, config, toks: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """jaxrl_llm's float32 logits ``[R, T, V]`` of a left-padded batch."""
    import jax.numpy as jnp

    from jaxrl_llm import models

    logits, _ = models.forward(
        params, jnp.asarray(toks), config=config, attention_mask=jnp.asarray(mask)
    )
    return np.asarray(logits)

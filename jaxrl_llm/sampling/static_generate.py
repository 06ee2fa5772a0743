"""Host side of the static engine: :func:`rollout` (arrays in, a :class:`Rollout` out) runs
:mod:`.decode`'s jitted prefill, decode-state set-up and decode loop; :func:`generate` pads
token lists into bucketed shapes first (:func:`pad_prompts`). :class:`Rollout` is what both
engines return (the paged engine's host side is :mod:`.paged_generate`)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.models import ModelConfig, separate_layers
from jaxrl_llm.sampling.config import DEFAULT_BUCKETS, SamplingConfig, bucket_length
from jaxrl_llm.sampling.decode import (
    DecodeState,
    decode,
    init_decode_state,
    prefill,
    prefill_with_routing,
)
from jaxrl_llm.sampling.rows import on_rows_mesh, pad_rows, put_rows, row_split


class Rollout(NamedTuple):
    """Completions of N = B·G rows (prompt-major: groups are consecutive rows of G).

    Attributes:
      tokens: ``[N, M]`` int32 completion tokens (pad id after the end).
      mask: ``[N, M]`` int32, 1 up to and including the stop token.
      lengths: ``[N]`` int32 number of completion tokens (= mask.sum(-1)).
      finished: ``[N]`` bool, the row ended with EOS / a stop token.
      truncated: ``[N]`` bool, the row hit ``max_new_tokens`` without a stop token
        (= ~finished).
      logprobs: ``[N, M]`` float32 log softmax(z / τ)[token] of each sampled token under the
        policy the losses use (``jaxrl_llm.ops.token_logprobs(..., temperature=τ)``), 0 where
        mask is 0.
      prompt_tokens: ``[N, P]`` int32 left-padded prompt of each row.
      prompt_mask: ``[N, P]`` int32, 1 on real prompt tokens.
      prompt_ids: ``[N]`` int32 the prompt id of each row.
      sample_ids: ``[N]`` int32 the sample index of each row within its group.
      routing: ``[N, P + M, L, k]`` int16 (int32 past 32767 experts) the experts a mixture of
        experts routed each token of the row (prompt, then completion) to in every layer,
        recorded with ``record_routing`` for rollout routing replay (R3, Ma et al. 2025,
        https://arxiv.org/abs/2510.11370); None when not recorded. Columns past a row's end
        hold the routing of the padding fed after it.
    """

    tokens: jax.Array
    mask: jax.Array
    lengths: jax.Array
    finished: jax.Array
    truncated: jax.Array
    logprobs: jax.Array
    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    prompt_ids: jax.Array
    sample_ids: jax.Array
    routing: jax.Array | None = None


def stop_token_ids(config: ModelConfig, sampling: SamplingConfig) -> tuple[int, ...]:
    """The token ids that end a row: the model's EOS ids (unless disabled) + extra stop ids."""
    ids = (tuple(config.eos_token_ids) if sampling.use_model_eos else ()) + sampling.stop_token_ids
    return tuple(sorted(set(int(t) for t in ids)))


def rollout(
    params,
    prompt_tokens: jax.Array | np.ndarray,
    prompt_mask: jax.Array | np.ndarray,
    *,
    config: ModelConfig,
    sampling: SamplingConfig = SamplingConfig(),
    num_samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 128,
    gen_len: int | None = None,
    prompt_ids: jax.Array | np.ndarray | None = None,
    record_routing: bool = False,
    mesh: Mesh | None = None,
    separate: bool | None = None,
) -> Rollout:
    """Sample G completions for each of B left-padded prompts (arrays in, arrays out).

    The prompt is prefilled once (B rows) and its cache shared by its G samples.

    Args:
      params: model parameters.
      prompt_tokens: ``[B, P]`` int left-padded prompts.
      prompt_mask: ``[B, P]`` 1 on real tokens; every row needs ≥ 1 real token and its last
        column must be real (left padding).
      config: model config.
      sampling: :class:`SamplingConfig`.
      num_samples: G ≥ 1 samples per prompt.
      seed: PRNG seed.
      max_new_tokens: ≥ 1 decode steps at most.
      gen_len: M ≥ max_new_tokens, width of the output buffers and of the cache's generation
        part (default: ``bucket_length(max_new_tokens)``).
      prompt_ids: ``[B]`` ids for the per-row PRNG keys (default 0..B−1); pass dataset
        indices so a prompt's samples do not depend on the batch it lands in.
      record_routing: a mixture of experts: record every token's experts
        (:attr:`Rollout.routing`); ignored for a dense model.
      mesh: the sampler's mesh (:attr:`jaxrl_llm.parallel.sampler_copy.SamplerCopy.local_mesh`):
        rows split over its batch axes, ``params`` laid out on it (tensor parallel over
        ``tensor``); None: one device's program.
      separate: the layers as separate arrays, run unrolled (:func:`decode_params`); None:
        on GPU only.

    Returns:
      a :class:`Rollout` with N = B·G rows and M = gen_len columns.
    """
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be >= 1, got {num_samples}")
    gen_len = bucket_length(max_new_tokens) if gen_len is None else int(gen_len)
    b, p = prompt_tokens.shape
    if prompt_ids is None:
        prompt_ids = jnp.arange(b, dtype=jnp.int32)
    chex.assert_shape(prompt_ids, (b,))
    # Rows split over the batch axes of the sampler's mesh (.rows): pad the prompts to a
    # multiple of the split with copies of the last one; their rows are dropped at the end.
    extra = pad_rows(b, row_split(mesh))
    prompt_tokens, prompt_mask, prompt_ids = (
        _padded_rows(x, extra, mesh) for x in (prompt_tokens, prompt_mask, prompt_ids)
    )
    params = decode_params(params, config, separate)
    record = record_routing and config.is_moe
    prompt_routing = None
    with on_rows_mesh(mesh):
        if record:
            last_logits, cache, next_pos, prompt_routing = prefill_with_routing(
                params, prompt_tokens, prompt_mask, config=config, cache_len=p + gen_len
            )
        else:
            last_logits, cache, next_pos = prefill(
                params, prompt_tokens, prompt_mask, config=config, cache_len=p + gen_len
            )
        state = init_decode_state(
            last_logits,
            cache,
            next_pos,
            prompt_ids,
            seed=seed,
            num_samples=num_samples,
            gen_len=gen_len,
            max_new_tokens=max_new_tokens,
            routing_config=config if record else None,
        )
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        state = decode(
            params,
            state,
            config=config,
            sampling=sampling,
            stop_ids=stop_token_ids(config, sampling),
            pad_id=pad_id,
        )
        out = _to_rollout(
            state, prompt_tokens, prompt_mask, prompt_ids, num_samples, prompt_routing
        )
    if extra:
        out = jax.tree.map(lambda x: x[: b * num_samples], out)
    return out


def decode_params(params, config: ModelConfig, separate: bool | None = None):
    """The params the decode programs read: the layers as separate per-layer arrays
    (:func:`~jaxrl_llm.models.separate_layers`, one copy of the layer weights unless
    ``params`` come split) when ``separate``, or when None on GPU, where XLA copies each
    scanned layer's weights at every token step (measured 1.9× slower decode of an 8B model on
    an H200, BENCHMARKS.md); else unchanged."""
    if separate if separate is not None else jax.default_backend() == "gpu":
        return separate_layers(params, config)
    return params


def _padded_rows(x, extra: int, mesh) -> jax.Array:
    """``x`` (rows first) as int32 with ``extra`` copies of its last row appended, its rows
    split over ``mesh``'s batch axes (:mod:`.rows`)."""
    x = np.asarray(x, np.int32)
    x = np.concatenate([x, np.repeat(x[-1:], extra, 0)])
    return jnp.asarray(x) if mesh is None else put_rows(x, mesh)


@functools.partial(jax.jit, static_argnames=("num_samples",))
def _to_rollout_jit(
    state: DecodeState, prompt_tokens, prompt_mask, prompt_ids, prompt_routing, *, num_samples: int
) -> Rollout:
    g = num_samples
    m = state.tokens.shape[1]
    mask = (jnp.arange(m)[None, :] < state.lengths[:, None]).astype(jnp.int32)
    rep = lambda x: jnp.repeat(x, g, axis=0, total_repeat_length=x.shape[0] * g)
    return Rollout(
        tokens=state.tokens,
        mask=mask,
        lengths=state.lengths,
        finished=state.done,
        truncated=~state.done,
        logprobs=jnp.where(mask > 0, state.logprobs, 0.0),
        prompt_tokens=rep(prompt_tokens),
        prompt_mask=rep(prompt_mask),
        prompt_ids=rep(prompt_ids),
        sample_ids=jnp.tile(jnp.arange(g, dtype=jnp.int32), prompt_tokens.shape[0]),
        routing=None
        if prompt_routing is None or state.routing is None
        else jnp.concatenate([rep(prompt_routing), state.routing], axis=1),
    )


def _to_rollout(
    state, prompt_tokens, prompt_mask, prompt_ids, num_samples, prompt_routing=None
) -> Rollout:
    return _to_rollout_jit(
        state,
        prompt_tokens,
        prompt_mask,
        prompt_ids,
        prompt_routing,
        num_samples=int(num_samples),
    )


def pad_prompts(
    prompts_tokens: list[list[int]],
    *,
    length: int | None = None,
    pad_id: int = 0,
    buckets: tuple[int, ...] = DEFAULT_BUCKETS,
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists into ``[B, P]`` arrays, P = ``length`` or the bucketed max length.

    Args:
      prompts_tokens: B non-empty lists of token ids.
      length: P (default ``bucket_length(max len, buckets)``).
      pad_id: id written in padding slots (masked out; any valid id).
      buckets: bucket sizes for P.

    Returns:
      (tokens ``[B, P]`` int32, mask ``[B, P]`` int32).
    """
    if not prompts_tokens:
        raise DataError("no prompts given; pass at least one prompt")
    for i, toks in enumerate(prompts_tokens):
        if len(toks) == 0:
            raise DataError(f"prompt {i} is empty; every prompt needs at least one token")
    longest = max(len(t) for t in prompts_tokens)
    p = bucket_length(longest, buckets) if length is None else int(length)
    if p < longest:
        raise DataError(f"prompt of {longest} tokens does not fit in length {p}")
    tokens = np.full((len(prompts_tokens), p), pad_id, np.int32)
    mask = np.zeros((len(prompts_tokens), p), np.int32)
    for i, toks in enumerate(prompts_tokens):
        tokens[i, p - len(toks) :] = np.asarray(toks, np.int32)
        mask[i, p - len(toks) :] = 1
    return tokens, mask


def generate(
    params,
    config: ModelConfig,
    prompts_tokens: list[list[int]],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    num_samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 128,
    prompt_ids: list[int] | None = None,
    prompt_buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    gen_buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    record_routing: bool = False,
    mesh: Mesh | None = None,
    separate: bool | None = None,
) -> Rollout:
    """Host-side generation from token lists: pad into buckets, prefill once, decode.

    Shapes are bucketed (P = bucket of the longest prompt, M = bucket of max_new_tokens), so
    calls with varying prompt lengths reuse a few compiled programs. The returned completion
    arrays are cut to ``max_new_tokens`` columns; the prompt arrays keep the bucketed width P.

    Args:
      params: model parameters.
      config: model config.
      prompts_tokens: B non-empty lists of prompt token ids.
      sampling: :class:`SamplingConfig` (default: τ = 1 ancestral sampling).
      num_samples: G samples per prompt (rows are prompt-major).
      seed: PRNG seed.
      max_new_tokens: ≥ 1.
      prompt_ids: B ints keying each prompt's PRNG stream (default 0..B−1).
      prompt_buckets, gen_buckets: bucket sizes for P and M.
      record_routing: a mixture of experts: record every token's experts
        (:attr:`Rollout.routing`, ``[N, P + max_new_tokens, L, k]``).
      mesh: the sampler's mesh (:func:`rollout`); None: one device's program.
      separate: the layers as separate arrays (:func:`rollout`); None: on GPU only.

    Returns:
      a :class:`Rollout` with N = B·G rows and ``max_new_tokens`` completion columns.
    """
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be >= 1, got {num_samples}")
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    for i, toks in enumerate(prompts_tokens):
        bad = [t for t in toks if not 0 <= int(t) < config.vocab_size]
        if bad:
            raise DataError(f"prompt {i} has token ids outside [0, {config.vocab_size}): {bad[:5]}")
    tokens, mask = pad_prompts(prompts_tokens, pad_id=pad_id, buckets=prompt_buckets)
    if prompt_ids is not None and len(prompt_ids) != len(prompts_tokens):
        raise ConfigError(
            f"prompt_ids has {len(prompt_ids)} entries for {len(prompts_tokens)} prompts"
        )
    gen_len = bucket_length(max_new_tokens, gen_buckets)
    out = rollout(
        params,
        tokens,
        mask,
        config=config,
        sampling=sampling,
        num_samples=num_samples,
        seed=seed,
        max_new_tokens=max_new_tokens,
        gen_len=gen_len,
        prompt_ids=None if prompt_ids is None else np.asarray(prompt_ids, np.int32),
        record_routing=record_routing,
        mesh=mesh,
        separate=separate,
    )
    m = max_new_tokens
    return out._replace(
        tokens=out.tokens[:, :m],
        mask=out.mask[:, :m],
        logprobs=out.logprobs[:, :m],
        routing=None if out.routing is None else out.routing[:, : tokens.shape[1] + m],
    )

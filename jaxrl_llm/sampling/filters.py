"""Next-token selection: temperature, top-k, top-p, min-p, greedy; per-row PRNG keys.

All functions take logits ``[N, V]`` (one row per sequence) and are pure and jittable.
Filtered-out tokens get logit −∞ (zero mass), so they are never drawn.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.sampling.config import SamplingConfig

_NEG_INF = -jnp.inf


def top_k_filter(z: jax.Array, k: int) -> jax.Array:
    """Keep the k largest entries per row (ties with the k-th value are kept), −∞ elsewhere.

    Top-k sampling: Fan et al. 2018, https://arxiv.org/abs/1805.04833.

    Args:
      z: ``[N, V]`` float logits (already divided by the temperature).
      k: number kept; k ≤ 0 or k ≥ V keeps everything.

    Returns:
      ``[N, V]`` filtered logits.
    """
    chex.assert_rank(z, 2)
    if k <= 0 or k >= z.shape[-1]:
        return z
    kth = jax.lax.top_k(z, k)[0][:, -1:]
    return jnp.where(z >= kth, z, _NEG_INF)


def top_p_filter(z: jax.Array, p: float) -> jax.Array:
    """Nucleus filter: keep the smallest set of most likely tokens with total mass ≥ p.

    Token y is kept iff the mass of the tokens strictly more likely than y is < p, so the most
    likely token is always kept (Holtzman et al. 2020, https://arxiv.org/abs/1904.09751; the
    rule of transformers' TopPLogitsWarper, except that tokens tied in probability are kept or
    dropped together instead of by sort order).

    No sort: the kept set is {y : p_y ≥ t*} with t* the smallest probability whose strictly-
    larger mass is < p. t* is found by bisection over the bit patterns of the (non-negative)
    float32 probabilities, which order like the values, so 31 masked sums over the vocabulary
    find it exactly — several times faster on CPU than sorting 49k logits per row every step.

    Args:
      z: ``[N, V]`` float logits (tempered); −∞ entries have zero mass.
      p: ∈ (0, 1]; 1 keeps everything.

    Returns:
      ``[N, V]`` filtered logits.
    """
    chex.assert_rank(z, 2)
    if p >= 1.0:
        return z
    probs = jax.nn.softmax(z.astype(jnp.float32), axis=-1)
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)  # monotone for values ≥ 0

    def mass_above(t):  # [N] mass of tokens with probability strictly above bits t
        return jnp.sum(jnp.where(bits > t[:, None], probs, 0.0), axis=-1)

    def body(_, lo_hi):
        lo, hi = lo_hi  # invariant: mass_above(lo) ≥ p > mass_above(hi)
        mid = lo + (hi - lo) // 2
        ok = mass_above(mid) < p
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    lo = jnp.zeros(z.shape[:1], jnp.int32)
    hi = jnp.max(bits, axis=-1)
    _, hi = jax.lax.fori_loop(0, 32, body, (lo, hi))
    return jnp.where(bits >= hi[:, None], z, _NEG_INF)


def min_p_filter(z: jax.Array, min_p: float) -> jax.Array:
    """Keep tokens with p(y) ≥ min_p · max_y' p(y'), −∞ elsewhere.

    Min-p sampling: Nguyen et al. 2024, https://arxiv.org/abs/2407.01082. In log space:
    z_y − max z ≥ log min_p.

    Args:
      z: ``[N, V]`` float logits (tempered).
      min_p: ∈ [0, 1); 0 keeps everything.

    Returns:
      ``[N, V]`` filtered logits.
    """
    chex.assert_rank(z, 2)
    if min_p <= 0.0:
        return z
    zmax = jnp.max(z, axis=-1, keepdims=True)
    return jnp.where(z - zmax >= jnp.log(min_p), z, _NEG_INF)


def filtered_logits(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Tempered, truncated logits the next token is drawn from (order: τ, top-k, top-p, min-p).

    Args:
      logits: ``[N, V]`` raw model logits.
      sampling: the (static) sampling config.

    Returns:
      ``[N, V]`` float32 logits with −∞ on excluded tokens.
    """
    chex.assert_rank(logits, 2)
    z = logits.astype(jnp.float32) / sampling.logprob_temperature
    z = top_k_filter(z, sampling.top_k)
    z = top_p_filter(z, sampling.top_p)
    z = min_p_filter(z, sampling.min_p)
    return z


CANDIDATES = 256
"""Tokens :func:`select_tokens` looks at first when a filter truncates the distribution: the
``CANDIDATES`` most likely (``lax.top_k``). A row whose kept set lies inside them draws from
them; any other row is filtered and drawn over the whole vocabulary."""


def _inverse_cdf(probs: jax.Array, u: jax.Array) -> jax.Array:
    """Index drawn from each row of unnormalised ``probs`` ``[N, C]`` with uniforms ``u``
    ``[N]``: the first index whose cumulative mass exceeds ``u`` × the row's total. A zero-mass
    entry is never drawn (its cumulative mass equals its predecessor's); rounding at the top
    end falls back to the last entry with mass."""
    cdf = jnp.cumsum(probs, axis=-1)
    i = jnp.sum(cdf <= (u * cdf[:, -1])[:, None], axis=-1)
    c = probs.shape[-1]
    last = c - 1 - jnp.argmax(probs[:, ::-1] > 0, axis=-1)  # last index with mass
    return jnp.minimum(i, last).astype(jnp.int32)


def _candidate_keep(vals: jax.Array, probs: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """``[N, C]`` bool: which of the C most likely tokens (tempered logits ``vals`` in
    descending order, ``probs`` their full-vocabulary probabilities) survive top-k, top-p and
    min-p, decided as :func:`filtered_logits` decides them. Exact for every candidate: the
    filters keep an upper set of values, and each decision needs only the mass of tokens more
    likely than the candidate (all candidates) or of the top-k set (inside the candidates when
    k ≤ C and its ties are)."""
    keep = jnp.ones(vals.shape, bool)
    if 0 < sampling.top_k < vals.shape[-1]:
        keep = vals >= vals[:, sampling.top_k - 1 : sampling.top_k]
    if sampling.top_p < 1.0:
        q = jnp.where(keep, probs, 0.0)
        q = q / jnp.sum(q, axis=-1, keepdims=True)  # renormalised after top-k
        above = jnp.sum(jnp.where(q[:, None, :] > q[:, :, None], q[:, None, :], 0.0), axis=-1)
        keep = keep & (above < sampling.top_p)
    if sampling.min_p > 0.0:
        keep = keep & (vals - vals[:, :1] >= jnp.log(sampling.min_p))
    return keep


def _draw(logits: jax.Array, u: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Token drawn per row from softmax(filtered_logits) with uniforms ``u`` (inverse CDF).

    Untruncated (τ only): over the whole vocabulary. Truncated (top-k ≤ C, top-p, min-p):
    first over the :data:`CANDIDATES` most likely tokens; a row whose kept set is not inside
    them (its C-th candidate survives the filters: a flat distribution) is filtered over the
    whole vocabulary instead — that pass runs only when some row needs it. Which way a row
    goes depends on its own logits only, so its token never depends on the rest of the batch.
    Sorting 49k logits per row every decode step (or 31 masked sums for an exact top-p over
    the vocabulary, and one Gumbel draw per vocabulary entry) is what this avoids: on CPU
    they cost more than the 135M-parameter model's unembedding.
    """
    v = logits.shape[-1]
    c = min(CANDIDATES, v)
    truncating = sampling.top_k > 0 or sampling.top_p < 1.0 or sampling.min_p > 0.0

    def full(_):
        z = filtered_logits(logits, sampling)
        return _inverse_cdf(jax.nn.softmax(z, axis=-1), u)

    if not truncating or sampling.top_k > c:
        return full(None)
    z = logits.astype(jnp.float32) / sampling.logprob_temperature
    vals, idx = jax.lax.top_k(z, c)
    probs = jnp.exp(vals - jax.nn.logsumexp(z, axis=-1, keepdims=True))
    keep = _candidate_keep(vals, probs, sampling)
    covered = ~keep[:, -1] if c < v else jnp.ones(keep.shape[:1], bool)
    pick = _inverse_cdf(jnp.where(keep, probs, 0.0), u)
    fast = jnp.take_along_axis(idx, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)
    slow = jax.lax.cond(jnp.all(covered), lambda _: fast, full, None)
    return jnp.where(covered, fast, slow)


def select_tokens(
    logits: jax.Array, keys: jax.Array, sampling: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """Choose one token per row and return its log-prob under the recorded policy.

    token ~ softmax(filtered_logits(z)) (or argmax z when greedy), drawn by inverse CDF with
    one uniform per row from its key (see :func:`_draw` for the candidate fast path);
    logp = log softmax(z / τ)[token] over the *full* vocabulary (see :class:`SamplingConfig`),
    identical to ``jaxrl_llm.ops.token_logprobs(z, token, temperature=τ)``.

    Args:
      logits: ``[N, V]`` raw model logits.
      keys: ``[N, ...]`` one PRNG key per row (unused when greedy).
      sampling: the (static) sampling config.

    Returns:
      (tokens ``[N]`` int32, logp ``[N]`` float32).
    """
    chex.assert_rank(logits, 2)
    chex.assert_axis_dimension(keys, 0, logits.shape[0])
    if sampling.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
        tokens = _draw(logits, u, sampling)
    z_full = logits.astype(jnp.float32) / sampling.logprob_temperature
    lse = jax.nn.logsumexp(z_full, axis=-1)
    picked = jnp.take_along_axis(z_full, tokens[:, None], axis=-1)[:, 0]
    return tokens, picked - lse


def row_keys(seed: jax.Array | int, prompt_ids: jax.Array, sample_ids: jax.Array) -> jax.Array:
    """Per-row PRNG keys: fold_in(fold_in(PRNGKey(seed), prompt_id), sample_id).

    A row's key depends only on (seed, its prompt id, its sample index), never on which other
    prompts share the batch, so its sample does not change when the batch is recomposed. The
    key of decode step t is ``fold_in(row_key, t)``.

    Args:
      seed: int scalar.
      prompt_ids: ``[N]`` int, the prompt each row answers (e.g. its index in the dataset).
      sample_ids: ``[N]`` int, the sample index within the prompt's group (0..G−1).

    Returns:
      ``[N, 2]`` uint32 raw keys.
    """
    chex.assert_rank(prompt_ids, 1)
    chex.assert_equal_shape([prompt_ids, sample_ids])
    base = jax.random.PRNGKey(seed)

    def one(p, s):
        return jax.random.fold_in(jax.random.fold_in(base, p), s)

    return jax.vmap(one)(prompt_ids.astype(jnp.uint32), sample_ids.astype(jnp.uint32))

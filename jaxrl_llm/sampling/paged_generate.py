"""Host-level generation on the continuous-batching paged engine (:mod:`.engine`), with the
arguments and the :class:`Rollout` of the static engine's :func:`jaxrl_llm.sampling.generate`.
On a sampler mesh the engine's data-parallel replicas (one per position on the mesh's batch
axes) run as one program over the whole mesh (:mod:`.slots`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.sampling.config import DEFAULT_BUCKETS, SamplingConfig, bucket_length
from jaxrl_llm.sampling.engine import PagedEngine
from jaxrl_llm.sampling.engine_rows import layout_routing
from jaxrl_llm.sampling.rows import row_split
from jaxrl_llm.sampling.static_generate import Rollout, generate, pad_prompts


def generate_paged(
    params,
    config: ModelConfig,
    prompts_tokens: list[list[int]],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    num_samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 128,
    prompt_ids: list[int] | None = None,
    stop_steps: list[int] | None = None,
    num_slots: int = 16,
    page_size: int = 16,
    chunk_steps: int = 16,
    dtype: str | None = None,
    prompt_buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    gen_buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    version: int = 0,
    refresh: Callable[[], tuple[Any, int]] | None = None,
    return_versions: bool = False,
    record_routing: bool = False,
    mesh: Mesh | None = None,
) -> Rollout | tuple[Rollout, np.ndarray]:
    """:func:`jaxrl_llm.sampling.generate` on the continuous-batching paged engine.

    Same arguments and the same :class:`Rollout` (rows in request order, prompt-major, each
    row's tokens keyed as in the static engine), plus the engine's sizes: ``num_slots`` S
    (raised to G if smaller), ``page_size``, ``chunk_steps`` and ``dtype``. ``stop_steps``
    (N = B·G ints ≤ max_new_tokens) caps each row's length (forced ragged lengths).

    ``mesh``: the sampler's mesh (``params`` laid out on it; None: one device). On a mesh
    whose batch axes (``data`` × ``fsdp``) have R > 1 positions, the engine runs R
    data-parallel replicas (:func:`jaxrl_llm.sampling.rows.replica_axes`) as one program
    (:class:`PagedEngine` with ``mesh``): each replica has a page pool, ``num_slots`` / R
    slots (at least G) and the groups dealt to it, prompt i to replica i mod R, so a group's
    prompt pages are shared within one replica; the weights stay as they are on the mesh
    (split over ``tensor`` where they are). One launch per round decodes every replica's
    chunk, and each program compiles once, not once per replica. Rows come back in request
    order with the tokens one replica would draw (per-row keys).

    Partial rollouts: ``refresh() -> (params, version)`` is called before every chunk; when
    its version differs from the engine's, the engine decodes on with those params (already
    in the rollout dtype; :meth:`PagedEngine.swap`). ``version`` is the starting params'.
    With ``return_versions`` the result is ``(rollout, versions)``, ``versions [N, M]`` int64:
    the version each token was sampled with (-1 past a row's end). ``record_routing`` (a
    mixture of experts): :attr:`Rollout.routing` ``[N, P + max_new_tokens, L, k]`` from the
    engines' per-row records (columns of no token hold the experts 0..k−1).
    """
    if max_new_tokens < 1 or num_samples < 1:
        raise ConfigError("max_new_tokens and num_samples must be >= 1")
    b, g = len(prompts_tokens), int(num_samples)
    tokens, mask = pad_prompts(
        prompts_tokens, pad_id=config.pad_token_id or 0, buckets=prompt_buckets
    )
    gen_len = bucket_length(max_new_tokens, gen_buckets)
    # Data-parallel replicas over the mesh's batch axes (.rows.replica_axes), one program:
    # each owns a page pool, its slots and the groups dealt to it (prompt i to replica i mod
    # R: a group stays whole on one).
    n_rep = row_split(mesh)
    engine = PagedEngine(
        params,
        config,
        sampling=sampling,
        seed=seed,
        num_slots=max(-(-num_slots // n_rep), g),
        page_size=page_size,
        max_len=tokens.shape[1] + gen_len,
        gen_len=gen_len,
        chunk_steps=chunk_steps,
        dtype=dtype,
        version=version,
        record_routing=record_routing,
        mesh=mesh,
    )
    pids, steps = _ids_and_budgets(prompt_ids, stop_steps, b, g, max_new_tokens)
    placed: list[int] = []  # row ids, in request order
    for i, toks in enumerate(prompts_tokens):
        placed += engine.submit(
            list(toks),
            prompt_id=pids[i],
            num_samples=g,
            max_new_tokens=steps[i * g : i * g + g],
            replica=i % n_rep,
        )
    while engine.busy:  # each round: the latest weights (partial rollouts), one chunk
        if refresh is not None:
            new_params, v = refresh()
            if int(v) != engine.version:
                engine.swap(new_params, v)
        engine.step()
    rows = [engine.rows[j] for j in placed]
    out = _rollout(rows, tokens, mask, pids, g, max_new_tokens, engine)
    if not return_versions:
        return out
    versions = np.full((b * g, max_new_tokens), -1, np.int64)
    for i, r in enumerate(rows):
        versions[i, : len(r.tokens)] = r.versions
    return out, versions


def _ids_and_budgets(
    prompt_ids: list[int] | None, stop_steps: list[int] | None, b: int, g: int, m: int
) -> tuple[list[int], list[int]]:
    """Each prompt's id (default its index) and each row's token budget (default ``m``),
    checked: B ids, B·G budgets of at most ``m``."""
    pids = list(range(b)) if prompt_ids is None else [int(i) for i in prompt_ids]
    steps = [m] * (b * g) if stop_steps is None else [int(s) for s in stop_steps]
    if len(pids) != b or len(steps) != b * g or max(steps) > m:
        raise ConfigError("prompt_ids needs B entries, stop_steps B·G entries <= max_new_tokens")
    return pids, steps


def _rollout(
    rows: list,
    tokens: np.ndarray,
    mask: np.ndarray,
    pids: list[int],
    g: int,
    m: int,
    engine: PagedEngine,
) -> Rollout:
    """The :class:`Rollout` of the engine's finished ``rows`` (request order, prompt-major):
    their tokens and log-probs cut to ``m`` columns, the ``[B, P]`` prompts repeated G times,
    and the recorded routing when ``engine`` records it."""
    n = len(rows)
    out_tok = np.full((n, m), engine.pad_id, np.int32)
    out_lp = np.zeros((n, m), np.float32)
    lengths = np.array([len(r.tokens) for r in rows], np.int32)
    for i, r in enumerate(rows):
        out_tok[i, : lengths[i]] = r.tokens
        out_lp[i, : lengths[i]] = r.logprobs
    finished = np.array([r.finished for r in rows], bool)
    b = len(pids)
    return Rollout(
        tokens=jnp.asarray(out_tok),
        mask=jnp.asarray((np.arange(m)[None] < lengths[:, None]).astype(np.int32)),
        lengths=jnp.asarray(lengths),
        finished=jnp.asarray(finished),
        truncated=jnp.asarray(~finished),
        logprobs=jnp.asarray(out_lp),
        prompt_tokens=jnp.asarray(np.repeat(tokens, g, axis=0)),
        prompt_mask=jnp.asarray(np.repeat(mask, g, axis=0)),
        prompt_ids=jnp.asarray(np.repeat(np.asarray(pids, np.int32), g)),
        sample_ids=jnp.asarray(np.tile(np.arange(g, dtype=np.int32), b)),
        routing=_routing(rows, tokens.shape[1], m) if engine.record_routing else None,
    )


def _routing(rows, p: int, m: int) -> jax.Array:
    """:func:`~jaxrl_llm.sampling.engine_rows.layout_routing` of the engines' rows."""
    prompt = [r.prompt_routing for r in rows]
    return jnp.asarray(layout_routing(prompt, [r.token_routing() for r in rows], p, m))


ROLLOUT_ENGINES: dict[str, Callable[..., Any]] = {"static": generate, "paged": generate_paged}
"""The rollout engines by name (``rollout.engine``, ``jaxrl-llm generate --engine``): the
static batch (default) and continuous batching over a paged KV cache. Same arguments, same
:class:`Rollout`, the same tokens for the same seed."""

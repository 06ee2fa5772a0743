"""Tinker sampling sessions: a frozen copy of a tenant's adapters merged into the base.

``save_weights_for_sampler`` / ``save_weights_and_get_sampling_client`` /
``create_sampling_client(model_path | base_model)`` each name a :class:`Sampler`; ``sample``
draws ``num_samples`` completions of one prompt with :func:`jaxrl_llm.sampling.generate`
(bucketed prefill + decode loop) on W' = W + (α/r)·A B (:func:`jaxrl_llm.models.lora.merge_lora`,
built once per sampler), returning token ids, their log-probs log softmax(z/τ)[y] and whether
the row stopped (a stop token) or hit ``max_tokens``. ``compute_logprobs`` (a sample request
with ``prompt_logprobs``) scores the prompt with one forward of the same merged weights.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.models.lora import LoRAConfig, merge_lora
from jaxrl_llm.ops import token_logprobs
from jaxrl_llm.sampling import SamplingConfig, generate
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import ServeError
from jaxrl_llm.serve.tinker import wire

#: merged weight copies kept at once (most recently used samplers)
MERGED_KEPT = 2


@dataclasses.dataclass
class Sampler:
    """A sampling session: the weights it samples from (None: the base model)."""

    sampler_id: str
    base_model: str
    model_path: str | None
    adapters: Any = None
    lora: LoRAConfig | None = None

    def params(self, served: ServedModel, cache: collections.OrderedDict) -> Any:
        """The merged weights, kept in ``cache`` for the :data:`MERGED_KEPT` most recently
        used samplers (an RL loop makes a sampler per step; each merged copy is model-sized)."""
        if self.adapters is None or self.lora is None:
            return served.params
        if self.sampler_id not in cache:
            cache[self.sampler_id] = merge_lora(served.params, self.adapters, self.lora)
            while len(cache) > MERGED_KEPT:
                cache.popitem(last=False)
        cache.move_to_end(self.sampler_id)
        return cache[self.sampler_id]


def _stop_ids(served: ServedModel, stop: Any) -> tuple[tuple[int, ...], bool]:
    """``(extra stop ids, stop on the model's EOS)`` of ``SamplingParams.stop``."""
    if stop is None:
        return (), True
    items = [stop] if isinstance(stop, str) else list(stop)
    ids = []
    for s in items:
        if isinstance(s, int):
            ids.append(s)
            continue
        tok = served.tokenizer
        encoded = tok.encode(s, add_special_tokens=False) if tok is not None else []
        if len(encoded) != 1:
            raise ServeError(400, f"stop string {s!r} is not one token; pass stop token ids")
        ids.append(int(encoded[0]))
    return tuple(ids), False


@functools.partial(jax.jit, static_argnames="config")
def _prompt_logprobs(params, tokens, *, config):
    logits, _ = models.forward(params, tokens[None, :-1], config=config)
    return token_logprobs(logits, tokens[None, 1:])[0]


def sample(
    served: ServedModel,
    sampler: Sampler,
    request: dict[str, Any],
    tokens: np.ndarray,
    seed: int,
    cache: collections.OrderedDict,
) -> bytes:
    """A ``SampleResponse`` for one ``asample`` request of ``tokens`` (``cache``: see
    :meth:`Sampler.params`)."""
    sp = request.get("sampling_params") or {}
    n = int(request.get("num_samples", 1))
    max_tokens = int(sp.get("max_tokens") or 16)
    temperature = float(sp.get("temperature", 1.0))
    top_k = int(sp.get("top_k", -1))
    stop_ids, use_eos = _stop_ids(served, sp.get("stop"))
    context = served.config.max_position_embeddings
    if len(tokens) + max_tokens > context:
        raise ServeError(
            400,
            f"the prompt ({len(tokens)} tokens) plus max_tokens ({max_tokens}) is longer than "
            f"the context ({context})",
        )
    sampling = SamplingConfig(
        greedy=temperature <= 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=max(top_k, 0),
        top_p=float(sp.get("top_p", 1.0)),
        stop_token_ids=stop_ids,
        use_model_eos=use_eos,
    )
    if sp.get("seed") is not None:
        seed = int(sp["seed"]) % (1 << 31)
    params = sampler.params(served, cache)
    out = generate(
        params,
        served.config,
        [tokens.tolist()],
        sampling=sampling,
        num_samples=n,
        seed=seed,
        max_new_tokens=max_tokens,
    )
    toks, lps = np.asarray(out.tokens), np.asarray(out.logprobs)
    lengths, finished = np.asarray(out.lengths), np.asarray(out.finished)
    seqs = [
        wire.Sampled(toks[i, : lengths[i]], lps[i, : lengths[i]], bool(finished[i]))
        for i in range(n)
    ]
    prompt_lp = None
    if request.get("prompt_logprobs"):
        prompt_lp = np.full((len(tokens),), np.nan, np.float32)
        if len(tokens) > 1:
            lp = _prompt_logprobs(params, jnp.asarray(tokens), config=served.config)
            prompt_lp[1:] = np.asarray(lp)
    return wire.encode_sample_response(seqs, prompt_lp)

"""Episodes of an agent written against the ``openai`` SDK (``env: {name: openai_agent,
kwargs: {agent: "my_agent:run"}}``), played against the run's own policy and laid out as an
:class:`~jaxrl_llm.train.online.experience.Experience`.

The sampler serves the policy on an OpenAI-compatible endpoint on 127.0.0.1 and a free port
(:func:`jaxrl_llm.serve.openai.endpoint`, its paged engine swapped to each step's weights and
version), runs the agent once per episode (``run(client, model, row)``, sync or async: a tool
loop, a harness; :class:`~jaxrl_llm.serve.openai.AgentRunner`) and takes back the turns the
endpoint recorded for it: the exact prompt and completion ids, behaviour log-probs and
versions. Every request is sampled with the run's ``rollout`` settings (temperature, top-k/p,
min-p), whatever the agent asks, so the behaviour log-probs are the policy's at the
temperature the loss uses; a request's ``max_tokens`` is capped at ``rollout.max_new_tokens``.

Layout: an episode's turns become segments (:func:`jaxrl_llm.serve.openai.segments`); its row
is the first segment: the first request's prompt, then the policy's tokens (mask 1) with the
tokens between turns (tool results, the template's turn ends; mask 0, attended through
``context_mask``), cut at ``rollout.max_new_tokens``. Later segments (a turn whose prompt does
not extend the first, e.g. the agent compacted its context or the template re-tokenised the
reply differently) are not trained yet; ``agent/extra_segments`` counts them. Reward: the
agent's rewards summed (each named one also in the scores), plus the run's reward functions on
the last turn's text. An episode whose agent raised, timed out, made no request or returned no
number is invalid (no gradient).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from jaxrl_llm.data.tokenize import TokenizedPrompt
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.sampling import Rollout, SamplingConfig, pad_prompts
from jaxrl_llm.serve import EngineLoop, ServerThread, make_app
from jaxrl_llm.serve.openai import AgentRunner, Job, Segment, endpoint, load_agent, segments
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.train.config.sections import EnvSection, RolloutSection
from jaxrl_llm.train.online.experience import Experience

log = logging.getLogger("jaxrl_llm")
#: The ``env.name`` of agents written against the ``openai`` SDK.
AGENT_ENV = "openai_agent"
#: Seconds one agent episode may take unless ``env.kwargs.timeout_s`` says otherwise.
DEFAULT_TIMEOUT_S = 600.0
#: The name the endpoint serves the policy under (what the agent's ``model`` argument is).
POLICY_NAME = "policy"


def check_agent_env(env: EnvSection) -> None:
    """Start-up check of an ``openai_agent`` environment: ``kwargs.agent`` imports."""
    load_agent(env.kwargs.get("agent", ""))


def agent_row(x: TokenizedPrompt) -> dict:
    """The row an agent gets: ``{"prompt": text or messages, **extras}`` (a fresh copy per
    episode: an agent may write into it)."""
    prompt = x.prompt
    if isinstance(prompt, tuple | list):
        prompt = [dict(m) for m in prompt]
    return {"prompt": prompt, **dict(x.extras)}


class AgentSampler:
    """Plays and scores a batch of agent episodes (see the module doc); arguments as
    :class:`~jaxrl_llm.train.online.episode_sampler.EpisodeSampler`'s. ``env.kwargs``:
    ``agent`` (``module:function``), ``timeout_s`` (one episode; default
    :data:`DEFAULT_TIMEOUT_S`), ``num_slots`` (rows decoded together, default 16)."""

    def __init__(
        self,
        env: EnvSection,
        settings: RolloutSection,
        rewards: RewardSet | None,
        *,
        tokenizer: Any,
        model_config: Any,
        prompt_buckets: tuple[int, ...],
        max_opening: int | None = None,
    ):
        self.env, self.settings, self.rewards = env, settings, rewards
        self.tokenizer, self.model_config = tokenizer, model_config
        self.prompt_buckets = prompt_buckets
        self.agent = load_agent(env.kwargs.get("agent", ""))
        self.timeout_s = env.kwargs.get("timeout_s", DEFAULT_TIMEOUT_S)
        self.num_slots = int(env.kwargs.get("num_slots", 16))
        self.max_len = int(model_config.max_position_embeddings)
        if max_opening is not None:
            self.max_len = min(self.max_len, int(max_opening) + settings.max_new_tokens)
        self._live: tuple[Any, Any, Any] | None = None  # (loop, endpoint, server)

    def _serve(self, params, version: int, sampling: SamplingConfig):
        """The endpoint, started on first use, serving ``params`` as ``version``."""
        if self._live is None:
            loop = EngineLoop().start()
            served = ServedModel(POLICY_NAME, self.model_config, params, self.tokenizer, "run")
            ep = endpoint(
                served,
                loop,
                max_len=self.max_len,
                max_tokens=self.settings.max_new_tokens,
                num_slots=self.num_slots,
                dtype=self.settings.dtype,
                record_turns=True,
            )
            server = ServerThread(make_app([ep.protocol])).start()
            self._live = (loop, ep, server)
            # compile the decode programs before any agent's clock starts
            ep.generator.submit(Job([0], 1, 1, sampling)).result()
        _, ep, server = self._live
        if ep.generator.version != version or ep.generator.params is not params:
            ep.generator.swap(params, version)
        ep.generator.forced = sampling
        return ep, server

    def close(self) -> None:
        """Stop the endpoint (its server and engine thread)."""
        if self._live is not None:
            loop, _, server = self._live
            server.stop()
            loop.stop()
            self._live = None

    def __call__(
        self,
        params,
        version: int,
        items: list[TokenizedPrompt],
        *,
        sampling: SamplingConfig,
        seed: int,
        num_samples: int,
        first_prompt_id: int = 0,
    ) -> Experience:
        """``num_samples`` episodes of each item, scored."""
        ep, server = self._serve(params, version, sampling)
        assert ep.recorder is not None
        runner = AgentRunner(
            self.agent, f"{server.url}/v1", POLICY_NAME, ep.recorder, timeout_s=self.timeout_s
        )
        g = num_samples
        rows = [agent_row(x) for x in items for _ in range(g)]
        outcomes = runner.run(rows)
        bad = [o.error for o in outcomes if o.error is not None]
        if bad:
            log.warning(
                "env %r: %d of %d agent episodes failed (first: %s)",
                AGENT_ENV,
                len(bad),
                len(outcomes),
                bad[0],
            )
        segs = [segments(o.turns) for o in outcomes]
        ids = [(first_prompt_id + i, s) for i in range(len(items)) for s in range(g)]
        return self._experience(items, outcomes, segs, ids, g, version)

    def _experience(self, items, outcomes, segs, ids, g, version) -> Experience:
        m, pad = self.settings.max_new_tokens, self.model_config.pad_token_id or 0
        n = len(outcomes)
        tokens = np.full((n, m), pad, np.int32)
        mask, context = np.zeros((n, m), np.int32), np.zeros((n, m), np.int32)
        logprobs = np.zeros((n, m), np.float32)
        valid = np.array([o.error is None for o in outcomes])
        openings, truncated = [], np.zeros(n, bool)
        for i, ss in enumerate(segs):
            first = ss[0] if ss else Segment([pad])
            k = min(len(first.tokens), m)
            truncated[i] = len(first.tokens) > m
            tokens[i, :k], mask[i, :k] = first.tokens[:k], first.mask[:k]
            logprobs[i, :k], context[i, :k] = first.logprobs[:k], 1
            openings.append(first.prompt)
        p_tok, p_mask = pad_prompts(openings, pad_id=pad, buckets=self.prompt_buckets)
        fields: dict[str, Any] = dict(
            tokens=tokens,
            mask=mask,
            lengths=mask.sum(1).astype(np.int32),
            finished=~truncated,
            truncated=truncated,
            logprobs=logprobs,
            prompt_tokens=np.asarray(p_tok),
            prompt_mask=np.asarray(p_mask),
            prompt_ids=np.array([p for p, _ in ids], np.int32),
            sample_ids=np.array([s for _, s in ids], np.int32),
        )
        ro = Rollout(**fields)  # host numpy, as the Experience holds it
        texts = [
            self.tokenizer.decode(o.turns[-1].token_ids, skip_special_tokens=True)
            if o.turns
            else ""
            for o in outcomes
        ]
        prompts = [self.tokenizer.decode(list(p)) for p in openings]
        extras = [dict(x.extras) for x in items for _ in range(g)]
        names = sorted({k for o in outcomes if o.rewards for k in o.rewards})
        scores = {
            f"agent/{k}": np.array(
                [o.rewards.get(k, np.nan) if o.rewards else np.nan for o in outcomes]
            )
            for k in names
        }
        total = np.array([sum(o.rewards.values()) if o.rewards else 0.0 for o in outcomes])
        metrics: dict[str, float] = {
            "env/failed": int((~valid).sum()),
            "env/timeouts": int(sum(o.timed_out for o in outcomes)),
            "env/turns_mean": float(np.mean([len(o.turns) for o in outcomes])),
            "env/truncated_frac": float(truncated.mean()),
            "agent/extra_segments": int(sum(max(len(ss) - 1, 0) for ss in segs)),
        }
        if self.rewards is not None:
            columns = {
                k: [e.get(k) for e in extras] for k in sorted({k for e in extras for k in e})
            }
            out = self.rewards(prompts, texts, **columns)
            metrics.update(out.metrics)
            valid &= np.asarray(out.valid, bool)
            total = total + np.asarray(out.rewards, np.float64)
            scores.update({k: np.asarray(v) for k, v in out.per_function.items()})
        total = np.where(valid, total, 0.0)
        return Experience(
            rollout=ro,
            texts=texts,
            prompts=prompts,
            extras=extras,
            rewards=total.astype(np.float32),
            valid=valid,
            scores=scores,
            metrics=metrics,
            group_size=g,
            policy_version=np.full(n, version, np.int64),
            context_mask=context,
            sources=[x.prompt for x in items for _ in range(g)],
        )

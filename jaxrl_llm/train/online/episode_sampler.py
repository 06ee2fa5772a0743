"""Multi-turn rollouts (``env`` in the run config): episodes played by
:func:`jaxrl_llm.envs.run_episodes`, scored, and laid out as an
:class:`~jaxrl_llm.train.online.experience.Experience` the learner trains on unchanged.

Layout: the completion side of row i holds the whole conversation after the opening — the
policy's turns (``mask`` 1, their sampled log-probs) and the environment's replies (``mask``
0, log-prob 0) — and ``context_mask`` marks all of them, so the learner attends to the
environment's tokens but trains and measures the KL only on the policy's. ``lengths`` counts
the policy's tokens. Reward = Σ step rewards + the configured reward functions on the final
policy turn (``completions``), ``prompts`` = the decoded opening.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import numpy as np

from jaxrl_llm.data.tokenize import TokenizedPrompt
from jaxrl_llm.envs import ChatCodec, EnvError, Episode, environment_factory, run_episodes
from jaxrl_llm.envs.registry import probe_environment
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.rewards.user_code import STOPPING, shared_runner
from jaxrl_llm.sampling import Rollout, SamplingConfig, pad_prompts, stop_token_ids
from jaxrl_llm.sampling.engine import layout_routing
from jaxrl_llm.train.config.sections import EnvSection, RolloutSection
from jaxrl_llm.train.online.agent_sampler import AGENT_ENV, check_agent_env
from jaxrl_llm.train.online.experience import Experience

log = logging.getLogger("jaxrl_llm")
#: The ``Experience.extras`` key holding an episode's non-numeric ``Step.info`` values (written
#: to ``samples.jsonl`` as ``info``; reward functions see it among their ``**fields``).
ENV_INFO = "env_info"


def raw_item(x: Any) -> dict:
    """The data row an environment's ``reset`` sees: ``{"prompt": ..., **extras}`` (of a
    :class:`TokenizedPrompt`, or of an untokenised example with the same two fields)."""
    prompt = x.prompt
    if isinstance(prompt, tuple | list):
        prompt = [dict(m) for m in prompt]
    return {"prompt": prompt, **dict(x.extras)}


def check_environment(env: EnvSection, item: Any) -> None:
    """The start-up checks of a run's environment: the class and its methods, its keyword
    arguments, and (``env.check``) one ``reset`` on ``item`` and one ``step("")``. An
    ``openai_agent`` environment: its agent function imports
    (:func:`jaxrl_llm.train.online.agent_sampler.check_agent_env`)."""
    if env.name == AGENT_ENV:
        check_agent_env(env)
        return
    factory = environment_factory(env.name, env.kwargs, timeout_s=env.step_timeout_s)
    if env.check:
        probe_environment(factory, raw_item(item), env.name, timeout_s=env.step_timeout_s)


class EpisodeSampler:
    """Plays and scores a batch of episodes (see the module docstring).

    Args:
      env: the run's ``env`` section; settings: its ``rollout`` section.
      rewards: the reward set on the final turn (None: the environment's rewards only).
      tokenizer: the policy's tokenizer (with a chat template); model_config: its config.
      prompt_buckets: left-padded opening widths.
      max_opening: an opening longer than this many tokens fails its episode (None: what the
        model's context leaves beside ``rollout.max_new_tokens``; the run passes
        ``data.max_length``).
    """

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
        self.factory = environment_factory(env.name, env.kwargs, timeout_s=env.step_timeout_s)
        self.max_opening = max_opening
        self.failures = 0  # consecutive batches in which every episode failed

    def _new_env(self) -> Any:
        """A fresh environment; one whose constructor fails (anything, ``sys.exit``
        included) becomes an environment whose ``reset`` reports that, failing its episode."""
        res = shared_runner("env").call(self.factory, timeout_s=self.env.step_timeout_s)
        return res.value if res.ok else FailedEnv(f"__init__: {res.error}")

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
        """``num_samples`` episodes of each item, scored; item i's episodes are keyed
        ``(first_prompt_id + i, sample)`` (a process's share of a step keeps its ids)."""
        r, env, g = self.settings, self.env, num_samples
        episodes = [
            Episode(
                item=raw_item(x),
                prompt_id=first_prompt_id + i,
                sample_id=s,
                env=self._new_env(),
                fallback_ids=list(x.prompt_ids),
            )
            for i, x in enumerate(items)
            for s in range(g)
        ]
        codec = ChatCodec(self.tokenizer, stop_token_ids(self.model_config, sampling))
        stats = run_episodes(
            params,
            self.model_config,
            episodes,
            codec=codec,
            sampling=sampling,
            seed=seed,
            group_size=g,
            max_turns=env.max_turns,
            turn_tokens=env.max_turn_tokens or r.max_new_tokens,
            budget=r.max_new_tokens,
            workers=env.workers,
            dtype=r.dtype,
            step_timeout_s=env.step_timeout_s,
            max_opening=self.max_opening,
            record_routing=r.records_routing,
        )
        _warn_failures(env.name, episodes)
        failed = np.array([ep.error is not None for ep in episodes])
        if failed.all():
            self.failures += 1
            if self.failures >= env.max_failures:
                raise EnvError(
                    f"env {env.name!r}: every episode failed in {self.failures} consecutive "
                    f"batches; last error: {episodes[-1].error}"
                )
        else:
            self.failures = 0
        return self._experience(episodes, items, g, version, stats)

    def _experience(self, episodes, items, g, version, stats) -> Experience:
        m, pad = self.settings.max_new_tokens, self.model_config.pad_token_id or 0
        n = len(episodes)
        tokens = np.full((n, m), pad, np.int32)
        mask, context = np.zeros((n, m), np.int32), np.zeros((n, m), np.int32)
        logprobs = np.zeros((n, m), np.float32)
        for i, ep in enumerate(episodes):
            k = len(ep.tokens)
            tokens[i, :k], mask[i, :k], logprobs[i, :k] = ep.tokens, ep.mask, ep.logprobs
            context[i, :k] = 1
        openings = [
            ep.opening_ids if ep.error is None and ep.opening_ids else ep.fallback_ids
            for ep in episodes
        ]
        p_tok, p_mask = pad_prompts(openings, pad_id=pad, buckets=self.prompt_buckets)
        truncated = np.array([ep.truncated for ep in episodes])
        fields: dict[str, Any] = dict(
            tokens=tokens,
            mask=mask,
            lengths=mask.sum(1).astype(np.int32),
            finished=~truncated,
            truncated=truncated,
            logprobs=logprobs,
            prompt_tokens=np.asarray(p_tok),
            prompt_mask=np.asarray(p_mask),
            prompt_ids=np.array([ep.prompt_id for ep in episodes], np.int32),
            sample_ids=np.array([ep.sample_id for ep in episodes], np.int32),
        )
        if self.settings.records_routing:
            fields["routing"] = _routing(episodes, openings, p_tok.shape[1], m)
        ro = Rollout(**fields)  # host numpy, as the Experience holds it
        texts = [ep.final_text for ep in episodes]
        prompts = [self.tokenizer.decode(list(o)) for o in openings]
        extras = [dict(x.extras) for x in items for _ in range(g)]
        notes = [ep.notes for ep in episodes]
        valid = np.array([ep.error is None for ep in episodes])
        env_r = np.array([ep.reward for ep in episodes], np.float64)
        scores = {"env": np.where(valid, env_r, np.nan)}
        metrics: dict[str, float] = {}
        total = np.where(valid, env_r, 0.0)
        if self.rewards is not None:
            fields = {k: [e.get(k) for e in extras] for k in sorted({k for e in extras for k in e})}
            t0 = time.perf_counter()
            out = self.rewards(prompts, texts, **fields)
            metrics.update(out.metrics)
            metrics["time/reward_s"] = time.perf_counter() - t0
            valid &= np.asarray(out.valid, bool)
            total = np.where(valid, total + np.asarray(out.rewards, np.float64), 0.0)
            scores.update({k: np.asarray(v) for k, v in out.per_function.items()})
        # the environment's total plus the reward functions' may still overflow float32
        with np.errstate(over="ignore"):
            overflow = valid & ~np.isfinite(np.asarray(total, np.float64).astype(np.float32))
        valid &= ~overflow
        total = np.where(valid, total, 0.0)
        metrics["env/reward_nonfinite"] = int(overflow.sum())
        metrics.update(_env_metrics(episodes, stats))
        if any(notes):  # non-numeric Step.info values: samples.jsonl, not metrics
            extras = [{**e, ENV_INFO: n} if n else e for e, n in zip(extras, notes)]
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
            messages=[ep.messages for ep in episodes],
            sources=[x.prompt for x in items for _ in range(g)],
        )


def _routing(episodes: list[Episode], openings: list, p: int, m: int) -> np.ndarray | None:
    """``[N, P + M, L, k]`` the episodes' recorded experts in the Experience layout (the
    opening left-padded to P, the completion side from column P), for routing replay. A row
    whose engine prompt is not its opening (an episode that failed) keeps the filler experts
    0..k−1 on its prompt: it is invalid, and its tokens are masked."""
    recorded = [ep.prompt_routing for ep in episodes if ep.prompt_routing is not None]
    if not recorded:
        return None
    empty = recorded[0][:0]
    prompt: list[np.ndarray] = []
    done: list[np.ndarray] = []
    for ep, opening in zip(episodes, openings, strict=True):
        pr, rest = ep.prompt_routing, ep.routing
        ok = pr is not None and rest is not None and len(pr) == len(opening)
        prompt.append(pr if ok and pr is not None else empty)
        done.append(rest if ok and rest is not None else empty)
    return layout_routing(prompt, done, p, m)


def _env_metrics(episodes: list[Episode], stats: dict) -> dict[str, float]:
    turns = np.array([ep.turns for ep in episodes])
    info: collections.Counter = collections.Counter()
    for ep in episodes:
        info.update(ep.info)
    out = {
        "env/turns_mean": float(turns.mean()),
        "env/turns_max": int(turns.max()),
        "env/failed": int(sum(ep.error is not None for ep in episodes)),
        "env/timeouts": int(sum(ep.timed_out for ep in episodes)),
        "env/openings_too_long": int(sum(ep.opening_too_long for ep in episodes)),
        "env/truncated_frac": float(np.mean([ep.truncated for ep in episodes])),
        "env/reward_mean": float(
            np.mean([ep.reward if ep.error is None else 0.0 for ep in episodes])
        ),
        "env/env_tokens_mean": float(np.mean([len(ep.mask) - sum(ep.mask) for ep in episodes])),
        "time/env_s": float(sum(ep.env_s for ep in episodes)),
        "time/env_wait_s": float(stats.get("idle_s", 0.0)),
    }
    out.update({f"env/{k}": float(v) for k, v in sorted(info.items())})
    # the share of episodes that did each counted thing at least once
    out.update(
        {
            f"env/{k}_frac": float(np.mean([ep.info.get(k, 0) > 0 for ep in episodes]))
            for k in sorted(info)
        }
    )
    return out


class FailedEnv:
    """Stands in for an environment whose constructor failed: its ``reset`` raises
    :class:`EnvError` with that failure, so the episode is invalid and the run goes on."""

    def __init__(self, error: str):
        self.error = error

    def reset(self, item: dict) -> list[dict]:
        """Raise the constructor's failure."""
        raise EnvError(self.error)

    def step(self, text: str) -> Any:
        """Never called (``reset`` failed)."""
        raise EnvError(self.error)


def _warn_failures(name: str, episodes: list[Episode]) -> None:
    """One warning line per batch with failed episodes: how many, and the first one's row."""
    bad = [ep for ep in episodes if ep.error is not None]
    if bad and not STOPPING.is_set():  # a stopping run's refused calls are not news
        ep = bad[0]
        log.warning(
            "env %r: %d of %d episodes failed (first: prompt %d sample %d: %s)",
            name,
            len(bad),
            len(episodes),
            ep.prompt_id,
            ep.sample_id,
            ep.error,
        )


def episode_records(exp: Experience) -> list[dict]:
    """``samples.jsonl`` records of an experience batch: the conversation of each episode (a
    single-turn row: the decoded prompt as the user turn and the completion)."""
    ro = exp.rollout
    out = []
    for i in range(len(exp)):
        if exp.messages is not None:
            messages = exp.messages[i]
        else:
            messages = [
                {"role": "user", "content": exp.prompts[i]},
                {"role": "assistant", "content": exp.texts[i]},
            ]
        out.append(
            {
                "prompt_id": int(ro.prompt_ids[i]),
                "sample": int(ro.sample_ids[i]),
                "messages": messages,
                "reward": float(exp.rewards[i]) if exp.valid[i] else None,
            }
        )
        if exp.extras[i].get(ENV_INFO):
            out[-1]["info"] = exp.extras[i][ENV_INFO]
    return out

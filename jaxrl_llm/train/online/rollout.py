"""The rollout side of the online loop: prompts → sampled completions → scored
:class:`~jaxrl_llm.train.online.experience.Experience`. Nothing here knows about losses.

Each prompt is prefilled once and its KV cache shared by its G samples (the jitted sampler,
:func:`jaxrl_llm.sampling.generate`), which records the sampling policy's per-token
log-probs (the behaviour log-probs). Rewards come from the run's
:class:`~jaxrl_llm.rewards.RewardSet`; a failing reward marks its row invalid instead of
stopping the run. DAPO's dynamic sampling (keep drawing prompts until the batch holds
``prompts_per_step`` groups whose rewards are not all equal) lives in :meth:`Rollouts.collect`.
"""

from __future__ import annotations

import functools
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives
from jaxrl_llm.data.tokenize import TokenizedPrompt
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives import pass_at_k
from jaxrl_llm.parallel import gather_numbers, process_share, to_host
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.sampling import ROLLOUT_ENGINES, SamplingConfig, bucket_length, cast_for_rollout
from jaxrl_llm.train.config.preflight import check_context_budget
from jaxrl_llm.train.config.sections import EnvSection, EvalSection, RolloutSection
from jaxrl_llm.train.online.agent_sampler import AGENT_ENV, AgentSampler
from jaxrl_llm.train.online.episode_sampler import EpisodeSampler
from jaxrl_llm.train.online.experience import Experience, concat_experience
from jaxrl_llm.train.run.faults import fault_point
from jaxrl_llm.train.run.progress import bar

# Prompt-length buckets for rollouts: ~1.5x apart, so padding wastes at most a third while a run
# compiles only a few programs.
PROMPT_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


class Rollouts:
    """Samples and scores episodes for the online loop.

    Args:
      settings: the run's ``rollout`` section (G, budget, sampling, dynamic sampling).
      rewards: the reward set (its first function is the held-out metric); None only with an
        ``env`` whose step rewards are the whole reward (then ``env`` is the metric).
      tokenizer: the policy's tokenizer (``decode``).
      model_config: the policy's model config.
      weights_fn: ``() -> (params, version)``: the policy's params (LoRA merged) to sample
        with and their version (the optimizer step), read together once per sampling call
        (the asynchronous producer hands a published snapshot).
      seed: the run's seed; sampling seeds are functions of (seed, step, round).
      env: the run's ``env`` section: multi-turn episodes (:mod:`jaxrl_llm.train.online.episode_sampler`)
        instead of one completion per sample; None = single-turn.
      partial: sampled (not greedy) generations poll ``weights_fn`` between chunks and
        continue with newer weights (``rollout.partial``): the asynchronous producer's
        sampler only, whose ``weights_fn`` reads a published snapshot (a cheap read).
      mesh: the sampler's mesh (this process's part of the run's sampler layout,
        :attr:`jaxrl_llm.parallel.sampler_copy.SamplerCopy.local_mesh`) that ``weights_fn``'s
        params are laid out on; None: one device.
      max_prompt_len: the longest prompt (``data.max_length``; None: 1 token): with
        ``rollout.max_new_tokens`` it must fit the model's context (a ConfigError here, before
        anything compiles); an environment's opening longer than it fails its episode.
    """

    def __init__(
        self,
        settings: RolloutSection,
        rewards: RewardSet | None,
        *,
        tokenizer: Any,
        model_config: Any,
        weights_fn: Callable[[], tuple[Any, int]],
        seed: int,
        env: EnvSection | None = None,
        partial: bool = False,
        max_prompt_len: int | None = None,
        mesh: Any = None,
    ):
        n = settings.max_new_tokens
        check_context_budget(
            int(model_config.max_position_embeddings),
            max_prompt_len or 1,
            n,
            key=f"rollout.max_new_tokens={n}",
        )
        if settings.records_routing and not getattr(model_config, "is_moe", False):
            raise ConfigError(
                "rollout.routing_replay / record_routing record a mixture of experts' "
                "routing; this model has no experts (set them to false)"
            )
        self.settings = settings
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.weights_fn = weights_fn
        self.seed = seed
        self.partial = partial
        self.mesh = mesh
        # the sampler is one program over every process's devices (a tensor group spans
        # processes): every process samples every row with it, then scores them all
        self.one_program = mesh is not None and any(
            d.process_index != jax.process_index() for d in mesh.devices.flat
        )
        r = settings
        self.sampling = SamplingConfig(
            temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, min_p=r.min_p
        )
        self.episodes = (
            None
            if env is None
            else (AgentSampler if env.name == AGENT_ENV else EpisodeSampler)(
                env,
                settings,
                rewards,
                tokenizer=tokenizer,
                model_config=model_config,
                prompt_buckets=PROMPT_BUCKETS,
                max_opening=max_prompt_len,
            )
        )

    def sample(
        self,
        items: list[TokenizedPrompt],
        *,
        seed: int,
        greedy: bool = False,
        num_samples: int | None = None,
        local: bool = False,
    ) -> Experience | None:
        """Generate ``num_samples`` (default G) completions of each item and score them.

        Across processes every process passes the same ``items`` and gets back the rows of
        its own share of them (host-local: :meth:`_sample_share`; None when its share is
        empty); ``local``: ``items`` are this process's own, sampled on its devices."""
        weights = self.weights_fn() if local and jax.process_count() > 1 else None
        if weights is not None and self.one_program:
            raise ConfigError(
                "a sampler spanning processes (rollout.tensor over hosts) samples the step's "
                "prompts together: a process's own extra samples (ReMax's greedy baseline) "
                "are not built; use a rollout.tensor within one host"
            )
        out = self._sample(
            items, seed=seed, greedy=greedy, num_samples=num_samples, weights=weights
        )
        return out if out is None or isinstance(out, Experience) else out()

    def _sample(
        self,
        items: list[TokenizedPrompt],
        *,
        seed: int,
        greedy: bool = False,
        num_samples: int | None = None,
        weights: tuple[Any, int] | None = None,
        prompt_ids: list[int] | None = None,
        prompt_buckets: tuple[int, ...] = PROMPT_BUCKETS,
    ) -> Experience | Callable[[], Experience] | None:
        """Generate; returns the scored :class:`Experience` (multi-turn episodes, scored as
        they are played) or ``score()``, which runs the reward functions on the completions
        and returns it (on any thread: the asynchronous producer scores off the sampling
        thread). ``weights``, ``prompt_ids`` and ``prompt_buckets`` are a process's share's
        (:meth:`_sample_share`): its local weights, the items' ids in the step, the step's
        prompt width."""
        g = self.settings.group_size if num_samples is None else num_samples
        sampling = SamplingConfig(greedy=True) if greedy else self.sampling
        params, version = self.weights_fn() if weights is None else weights
        if jax.process_count() > 1 and weights is None and not self.one_program:
            return self._sample_share(items, params, version, sampling, seed, g)
        if self.episodes is not None:
            return self.episodes(
                params, version, items, sampling=sampling, seed=seed, num_samples=g
            )
        assert self.rewards is not None
        params, config = cast_for_rollout(params, self.model_config, self.settings.dtype)
        engine: Callable[..., Any] = ROLLOUT_ENGINES[self.settings.engine]
        versions = None
        if self.settings.records_routing and not greedy:  # the update replays it (R3)
            engine = functools.partial(engine, record_routing=True)
        partial = self.partial and not greedy
        if partial:  # weights may change between chunks
            engine = functools.partial(
                engine,
                version=version,
                refresh=self._refresh(version, params),
                return_versions=True,
            )
        ro = engine(
            params,
            config,
            [list(x.prompt_ids) for x in items],
            mesh=self.mesh,
            sampling=sampling,
            num_samples=g,
            seed=seed,
            max_new_tokens=self.settings.max_new_tokens,
            prompt_buckets=prompt_buckets,
            prompt_ids=prompt_ids,
        )
        if partial:
            ro, versions = ro
        ro = jax.tree.map(np.asarray, to_host(ro))  # one program over processes: gathered
        if self.one_program:  # every process sampled every row: each scores its own share
            share = process_share(len(items))
            if share.start == share.stop:
                return None
            rows = slice(share.start * g, share.stop * g)
            ro = jax.tree.map(lambda x: x[rows], ro)
            versions = None if versions is None else versions[rows]
            items = items[share]
        tok = self.tokenizer
        texts = [
            tok.decode(ro.tokens[i, : ro.lengths[i]].tolist(), skip_special_tokens=True)
            for i in range(ro.tokens.shape[0])
        ]
        prompts = [tok.decode(list(x.prompt_ids)) for x in items for _ in range(g)]
        extras = [dict(x.extras) for x in items for _ in range(g)]
        sources = [x.prompt for x in items for _ in range(g)]
        rewards = self.rewards
        return functools.partial(
            _score, rewards, ro, texts, prompts, sources, extras, g, version, versions
        )

    def _sample_share(
        self,
        items: list[TokenizedPrompt],
        params: Any,
        version: int,
        sampling: SamplingConfig,
        seed: int,
        g: int,
    ) -> Experience | None:
        """A process's part of a multi-process step (every process calls it with the step's
        whole ``items``): sample and score its own share of the items
        (:func:`jaxrl_llm.parallel.process_share`) on its own devices, keyed by their ids in
        the step and padded to the step's prompt width, so its rows are those one process
        would draw for them. The rows stay on this host (host-local experience: process p's
        rows are the p-th block of the step's); None for an empty share. ``params`` are this
        process's part of the sampler's copy
        (:class:`~jaxrl_llm.parallel.sampler_copy.SamplerCopy`)."""
        share = process_share(len(items))
        mine = items[share]
        if not mine:
            return None
        if self.episodes is not None:
            return self.episodes(
                params,
                version,
                mine,
                sampling=sampling,
                seed=seed,
                num_samples=g,
                first_prompt_id=share.start,
            )
        longest = max(len(x.prompt_ids) for x in items)
        out = self._sample(
            mine,
            seed=seed,
            num_samples=g,
            weights=(params, version),
            greedy=sampling.greedy,
            prompt_ids=list(range(share.start, share.stop)),
            prompt_buckets=(bucket_length(longest, PROMPT_BUCKETS),),
        )
        return out if out is None or isinstance(out, Experience) else out()

    def _refresh(self, version: int, params: Any) -> Callable[[], tuple[Any, int]]:
        """``refresh()`` for a partial rollout: the newest published weights in the rollout
        dtype (cast once per new version)."""
        last = [version, params]

        def refresh() -> tuple[Any, int]:
            new, v = self.weights_fn()
            if v != last[0]:
                last[:] = [v, cast_for_rollout(new, self.model_config, self.settings.dtype)[0]]
            return last[1], last[0]

        return refresh

    def collect(
        self, iterator: Iterator[list[TokenizedPrompt]], step: int
    ) -> tuple[Experience, dict]:
        """One step's experience: ``prompts_per_step`` prompts × G samples, with DAPO's
        dynamic sampling when configured (groups whose rewards are all equal are dropped and
        more prompts drawn, up to ``max_sampling_rounds`` rounds; what is still missing is
        filled with dropped groups, which have zero advantage, to keep the batch shape).

        Across processes (host-local) each process keeps its own share, ``prompts_per_step /
        processes`` groups, from its own prompts of each round; the rounds go on until every
        process has its share (one gathered count per round), so every process draws the
        same prompts. The same filter as one process's, not the same groups kept."""
        r = self.settings
        g, want = r.group_size, r.prompts_per_step // jax.process_count()
        kept: list[Experience] = []
        reserve: list[Experience] = []
        dropped = rounds = crc = 0
        while True:
            items = next(iterator)
            for x in items:
                crc = zlib.crc32(np.asarray(x.prompt_ids, np.int32).tobytes(), crc)
            exp = self.sample(items, seed=self.seed * 1_000_003 + step * 101 + rounds)
            assert exp is not None  # prompts_per_step divides over processes (trainer)
            rounds += 1
            if not r.dynamic_sampling:
                kept.append(exp)
                break
            info = np.array(objectives.informative_groups(jnp.asarray(exp.rewards), group_size=g))
            info &= exp.valid.reshape(-1, g).all(-1)
            dropped += int((~info).sum())
            if info.any():
                kept.append(exp.select_groups(info))
            if (~info).any():
                reserve.append(exp.select_groups(~info))
            have = sum(k.num_groups for k in kept)
            if rounds >= r.max_sampling_rounds or gather_numbers(have).min() >= want:
                break
        have = sum(k.num_groups for k in kept)
        filled = 0
        if have < want:
            filled = want - have
            kept.extend(reserve)
        exp = concat_experience(kept, max_groups=want) if r.dynamic_sampling else kept[0]
        fault_point("rollout", step)
        return exp, _collect_info(iterator, crc, dropped, rounds, want - filled, filled)

    @property
    def can_defer_scoring(self) -> bool:
        """Whether :meth:`collect_deferred` applies: no dynamic sampling (which must score a
        batch before drawing the next) and single-turn (episodes score as they play)."""
        return (
            not self.settings.dynamic_sampling
            and self.episodes is None
            and jax.process_count() == 1  # across processes a share is scored, then gathered
        )

    def collect_deferred(
        self, iterator: Iterator[list[TokenizedPrompt]], step: int
    ) -> tuple[Callable[[], Experience], dict]:
        """:meth:`collect` with the scoring left to the caller (:attr:`can_defer_scoring`
        runs only): draws one batch of prompts, samples it (the same seeds, so the same
        tokens) and returns ``(score, info)``; ``score()`` runs the reward functions and
        returns the :class:`Experience`. The asynchronous producer samples the next batch
        while a slow reward scores this one."""
        assert self.can_defer_scoring
        items = next(iterator)
        crc = 0
        for x in items:
            crc = zlib.crc32(np.asarray(x.prompt_ids, np.int32).tobytes(), crc)
        score = self._sample(items, seed=self.seed * 1_000_003 + step * 101)
        assert score is not None and not isinstance(score, Experience)
        fault_point("rollout", step)
        return score, _collect_info(iterator, crc, 0, 1, self.settings.prompts_per_step, 0)

    def greedy_rewards(self, exp: Experience) -> np.ndarray:
        """``[N]`` the reward of the greedy completion of each row's prompt (ReMax's
        baseline), repeated over the group."""
        g = exp.group_size
        ro = exp.rollout
        items = [
            TokenizedPrompt(
                prompt_ids=tuple(int(t) for t in ro.prompt_tokens[i][ro.prompt_mask[i] > 0]),
                extras=exp.extras[i],
                prompt=None if exp.sources is None else exp.sources[i],
            )
            for i in range(0, len(exp), g)
        ]
        greedy = self.sample(items, seed=0, greedy=True, num_samples=1, local=True)
        assert greedy is not None
        return np.repeat(greedy.rewards, g)

    def evaluate(
        self, items: list[TokenizedPrompt], settings: EvalSection, metric: str
    ) -> dict[str, float]:
        """Greedy decoding on held-out ``items``: the mean of reward ``metric`` over the rows
        it scored, how many it scored, the mean completion length (across processes each
        scores its share of every batch and the sums are gathered)."""
        items = items[: settings.num_examples or None]
        total = np.zeros(4)  # scored rows' metric, scored rows, completion tokens, rows
        fracs: dict[str, float] = {}  # multi-turn: the share of episodes doing each env thing
        starts = range(0, len(items), settings.batch_size)
        for i in bar(starts, total=len(starts), desc="eval batches"):
            exp = self.sample(
                items[i : i + settings.batch_size], seed=0, greedy=True, num_samples=1
            )
            if exp is None:  # this process's share of the batch is empty
                continue
            for k, v in exp.metrics.items():
                if k.startswith("env/") and k.endswith("_frac"):
                    fracs[k] = fracs.get(k, 0.0) + v * len(exp) / len(items)
            vals = exp.scores[metric]
            ok = np.isfinite(vals)
            total += [vals[ok].sum(), ok.sum(), exp.rollout.lengths.sum(), len(exp)]
        keys = sorted(fracs)
        sums = gather_numbers(np.array([*total, *(fracs[k] for k in keys)])).sum(0)
        scored, n_valid = float(sums[0]), int(sums[1])
        out = {
            f"eval/{metric}": scored / n_valid if n_valid else float("nan"),
            "eval/num_examples": len(items),
            "eval/valid": n_valid,
            "eval/completion_length": float(sums[2] / max(sums[3], 1)),
            **{f"eval/{k}": float(v) for k, v in zip(keys, sums[4:])},
        }
        if settings.num_samples:
            out.update(self._pass_at(items, settings, metric))
        return out

    def _pass_at(
        self, items: list[TokenizedPrompt], settings: EvalSection, metric: str
    ) -> dict[str, float]:
        """``eval/pass@k`` over ``settings.num_samples`` sampled completions per prompt (a
        fixed seed, so every evaluation of a run draws the same way)."""
        n = settings.num_samples
        correct: list[int] = []
        starts = range(0, len(items), settings.batch_size)
        for i in bar(starts, total=len(starts), desc="eval batches"):
            exp = self.sample(items[i : i + settings.batch_size], seed=7_777_777 + i, num_samples=n)
            if exp is None:
                continue
            ok = np.nan_to_num(exp.scores[metric], nan=0.0) == 1.0
            correct.extend(ok.reshape(-1, n).sum(1).tolist())
        c = np.asarray(correct, np.int64)
        sums = gather_numbers(
            np.array([len(c), *(pass_at_k(n, c, k=k).sum() for k in settings.pass_at)])
        ).sum(0)
        return {
            f"eval/pass@{k}": float(v / max(sums[0], 1)) for k, v in zip(settings.pass_at, sums[1:])
        }


def _oldest(versions: np.ndarray, default: int) -> np.ndarray:
    """Each row's oldest sampled-token version (``default`` for a row with no token)."""
    sampled = np.where(versions >= 0, versions, np.iinfo(np.int64).max)
    oldest = sampled.min(axis=1)
    return np.where(oldest == np.iinfo(np.int64).max, default, oldest).astype(np.int64)


def _score(
    rewards: RewardSet,
    ro: Any,
    texts: list[str],
    prompts: list[str],
    sources: list[Any],
    extras: list[dict],
    g: int,
    version: int,
    versions: np.ndarray | None,
) -> Experience:
    """Run the reward functions on sampled completions: the scored :class:`Experience`."""
    fields = {k: [e.get(k) for e in extras] for k in sorted({k for e in extras for k in e})}
    t0 = time.perf_counter()
    ids = [ro.tokens[i, : ro.lengths[i]].tolist() for i in range(len(texts))]  # as sampled
    out = rewards(prompts, texts, sources=sources, completion_ids=ids, **fields)
    metrics = {**out.metrics, "time/reward_s": time.perf_counter() - t0}  # inside rollout_s
    return Experience(
        rollout=ro,
        texts=texts,
        prompts=prompts,
        extras=extras,
        sources=sources,
        rewards=np.asarray(out.rewards, np.float32),
        valid=np.asarray(out.valid, bool),
        scores={k: np.asarray(v) for k, v in out.per_function.items()},
        metrics=metrics,
        group_size=g,
        policy_version=(
            np.full(len(texts), version, np.int64)
            if versions is None
            else _oldest(versions, version)
        ),
        token_version=versions,
    )


def _collect_info(iterator: Any, crc: int, dropped: int, rounds: int, kept: int, filled: int):
    """A rollout's dynamic-sampling counts and data position (``collect``'s info)."""
    it = iterator.state()
    return {
        "dynamic/groups_dropped": dropped,
        "dynamic/rounds": rounds,
        "dynamic/groups_kept": kept,
        "dynamic/groups_filled": filled,
        # where the run is in its data, and a fingerprint of the prompts drawn
        # (equal across runs that drew the same prompts in the same order)
        "data/epoch": it["epoch"] + it["position"] / iterator.steps_per_epoch,
        "data/prompts_crc32": crc,
    }

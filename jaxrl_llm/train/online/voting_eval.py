"""Majority-vote evaluation of an online run: ``eval/maj@k`` and the per-prompt samples file
(``eval.maj_at``, ``eval.write_samples``), and the online run loop that adds them to its
evaluations; ``jaxrl-llm train``, ``jaxrl-llm eval`` and the Python trainers use the same code.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.output_dir import jax_main_process


def vote_eval(
    rollouts: Any, items: list, settings: Any, metric: str, *, step: int, folder: str
) -> dict[str, float]:
    """``eval/maj@k`` (``settings.maj_at``) and, with ``settings.write_samples``,
    ``folder/samples-<step>.jsonl``: ``settings.num_samples`` sampled completions per held-out
    prompt, drawn with the seeds of ``eval/pass@k`` (the same completions; the online
    rollouts' ``evaluate``) and scored by reward ``metric``.

    Args:
      rollouts: the run's :class:`~jaxrl_llm.train.online.rollout.Rollouts`.
      items: the held-out prompts (tokenised); the first ``settings.num_examples`` are used.
      settings: the ``eval`` section (:class:`~jaxrl_llm.train.config.sections.EvalSection`).
      metric: the reward whose score 1 is correct.
      step: the step evaluated (the samples file's name).
      folder: where the samples file goes (JAX's process 0 writes it).
    """
    import numpy as np

    from jaxrl_llm.rewards.voting import extract_votes, maj_at_k, sample_records

    if not (settings.maj_at or settings.write_samples) or not settings.num_samples:
        return {}
    items = items[: settings.num_examples or None]
    n = settings.num_samples
    answers: list[list] = []
    correct: list[list[bool]] = []
    records: list[dict] = []
    for i in range(0, len(items), settings.batch_size):
        exp = rollouts.sample(items[i : i + settings.batch_size], seed=7_777_777 + i, num_samples=n)
        if exp is None:  # across processes: this process's share of the batch is empty
            continue
        scores = np.asarray(exp.scores[metric], np.float64)
        votes = extract_votes(exp.texts)
        for g in range(0, len(exp.texts), n):
            answers.append(votes[g : g + n])
            correct.append([bool(x == 1.0) for x in scores[g : g + n]])
        if settings.write_samples:
            prompts = exp.sources if exp.sources is not None else exp.prompts
            refs = [e.get("answer") for e in exp.extras]
            records += sample_records(
                list(prompts),
                list(exp.texts),
                scores.tolist(),
                group_size=n,
                step=step,
                references=refs if any(r is not None for r in refs) else None,
            )
    if settings.write_samples and jax_main_process():
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"samples-{step}.jsonl"), "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    # across processes each scored its share of the prompts (process 0's are in the file)
    from jaxrl_llm.parallel import gather_numbers

    mine = [
        maj_at_k(answers, correct, k) * len(answers) if answers else 0.0 for k in settings.maj_at
    ]
    sums = gather_numbers(np.array([len(answers), *mine], np.float64)).sum(0)
    return {f"eval/maj@{k}": float(v / max(sums[0], 1)) for k, v in zip(settings.maj_at, sums[1:])}


_VOTING: list[type] = []


def voting_online_trainer() -> type:
    """The online run loop whose evaluations add ``eval/maj@k`` and the samples file
    (:func:`vote_eval`, as the run's ``eval`` section asks) after the greedy metrics and
    ``eval/pass@k``; both ``jaxrl-llm train`` (:func:`run_training`) and the Python trainers
    run it. A subclass made on first use, so that importing this module loads no JAX
    program."""
    if _VOTING:
        return _VOTING[0]
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    class VotingOnlineTrainer(OnlineTrainer):
        """:class:`~jaxrl_llm.train.online.trainer.OnlineTrainer` with ``eval.maj_at`` and
        ``eval.write_samples``."""

        _last_step: int | None = None

        def train_step(self, step: int) -> dict:
            metrics = super().train_step(step)
            self._last_step = step
            return metrics

        def evaluate(self) -> dict[str, float]:
            metrics = super().evaluate()
            if metrics and self.eval_data is not None:
                step = self.start_step if self._last_step is None else self._last_step
                metrics.update(
                    vote_eval(
                        self.rollouts,
                        self.eval_data.items,
                        self.cfg.eval,
                        self.eval_metric,
                        step=step,
                        folder=os.path.join(paths.log_dir(self.cfg), "eval"),
                    )
                )
            return metrics

    _VOTING.append(VotingOnlineTrainer)
    return VotingOnlineTrainer

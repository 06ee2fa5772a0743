"""The loss's side of the run plan, each resolved once by
:func:`~jaxrl_llm.train.config.plan.plan_run` and read from the
:class:`~jaxrl_llm.train.config.plan.RunPlan`: the loss's validated config
(:func:`loss_config`, with the ``schedules`` checked against it), the log-prob settings of
the policy's forwards (:func:`logprob_settings`), and the micro-batches that let an update
skip its zero-advantage groups (:func:`update_micro_batches`).
"""

from __future__ import annotations

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import LogprobSettings
from jaxrl_llm.losses.policy_config import EntropyControl, PolicyGradientConfig
from jaxrl_llm.losses.registry import LossSpec
from jaxrl_llm.train.config.run_config import RunConfig


def loss_config(cfg: RunConfig):
    """The algorithm's loss config: its paper preset with ``cfg.loss`` validated on top (and,
    for a loss with a generation-budget ``max_len``, the rollout's ``max_new_tokens`` unless
    ``loss.max_len`` is given). Read it from :attr:`RunPlan.loss_config`."""
    from jaxrl_llm.train.config.config_io import from_dict, to_dict

    algo = cfg.algo
    spec = algo.loss_spec()
    try:
        base = to_dict(algo.preset())
    except TypeError:  # the preset has required fields (e.g. pairwise_rank's group_size)
        base = {}
    overrides = dict(cfg.loss)
    if (
        cfg.is_online
        and "max_new_tokens" in algo.sampling_settings
        and base.get("max_len") is not None
        and "max_len" not in overrides
    ):
        overrides["max_len"] = cfg.rollout.max_new_tokens
    config = from_dict(spec.config_cls, {**base, **overrides}, prefix="loss")
    _check_schedules(cfg, spec, config)
    if (
        cfg.is_online
        and cfg.rollout.correction is not None
        and isinstance(config, PolicyGradientConfig)
        and config.entropy_control is not EntropyControl.NONE
    ):
        raise ConfigError(
            f"loss.entropy_control={config.entropy_control.value!r} with rollout.correction: "
            "KL-Cov / Clip-Cov take no importance weights yet; use one or the other"
        )
    return config


def _check_schedules(cfg: RunConfig, spec: LossSpec, config) -> None:
    seen = set()
    for item in cfg.schedules:
        key = f"schedules[{item.name}]"
        if item.name not in spec.traced_hparams:
            raise ConfigError(
                f"{key}: {cfg.algorithm}'s loss cannot schedule {item.name!r}; "
                f"it can schedule: {list(spec.traced_hparams) or 'nothing'}"
            )
        if item.name in seen:
            raise ConfigError(f"{key}: scheduled twice")
        seen.add(item.name)
        if not getattr(config, item.name) > 0:
            raise ConfigError(
                f"{key}: loss.{item.name} must be > 0 for a schedule (0 switches "
                f"the term off when the step compiles)"
            )


def logprob_settings(cfg: RunConfig) -> LogprobSettings:
    """How the policy's losses compute log-probs in this run: online RL batches read the
    completion window at the sampling temperature and, with ``logprobs.shared_prompt``,
    compute each prompt once per group; otherwise every column at τ = 1. Read it from
    :attr:`RunPlan.logprobs`."""
    lp, r, algo = cfg.logprobs, cfg.rollout, cfg.algo
    if not algo.rollout_logprobs:
        return LogprobSettings(chunk_size=lp.chunk_size)
    temperature = r.temperature if "temperature" in algo.sampling_settings else 1.0
    # each minibatch holds whole groups: the update's forward can share each group's prompt
    whole_groups = r.prompts_per_step % r.minibatches == 0
    group = r.group_size if lp.shared_prompt and whole_groups and not lp.pack else 1
    # rollout batches keep every target in their last max_new_tokens columns
    return LogprobSettings(
        temperature=temperature,
        chunk_size=lp.chunk_size,
        window=r.max_new_tokens,
        prompt_group_size=group,
    )


def update_micro_batches(cfg: RunConfig, loss_cfg=None, *, shards: int = 1) -> int:
    """How many micro-batches an online minibatch update is split into so that groups whose
    advantages are all zero can be skipped (``rollout.skip_zero_advantage``). Read it from
    :attr:`RunPlan.rows`.

    Each micro-batch holds k whole groups: the smallest k ≥ ``rollout.micro_batch_groups``
    that divides the minibatch's groups into at least two micro-batches and is a multiple of
    ``shards`` (the mesh's data × fsdp devices: every device then holds whole groups), else
    the smallest whose k·G rows split over the shards. 1 when skipping does not apply: an
    algorithm without group skipping, a loss with a β·KL or entropy term, minibatches that
    split groups.
    """
    r = cfg.rollout
    if (
        not cfg.algo.group_skipping
        or not r.skip_zero_advantage
        or r.group_size < 2
        or r.prompts_per_step % r.minibatches
    ):
        return 1
    spec = cfg.algo.loss_spec()
    if spec.zero_batch_fn is None or spec.zero_batch_fn(loss_cfg or loss_config(cfg)) is None:
        return 1
    if any(item.name in ("kl_coef", "entropy_coef") for item in cfg.schedules):
        return 1
    groups = r.prompts_per_step // r.minibatches
    sizes = range(max(1, r.micro_batch_groups), groups + 1)
    # First choice: k a multiple of the shards, so each device holds whole groups (the shared
    # prompt is then computed without crossing devices); else any k whose rows split evenly.
    for fits in (lambda k: k % shards == 0, lambda k: (k * r.group_size) % shards == 0):
        for k in sizes:
            if groups % k == 0 and groups // k > 1 and fits(k):
                return groups // k
    return 1

"""Checks run before anything compiles: the mesh against the batch and the sequence lengths,
the data splits, generation lengths against the model's context, and the packages of the
experiment trackers the config names.

A bad mesh size or a data set too small for one step is a one-line
:class:`~jaxrl_llm.errors.ConfigError` / :class:`~jaxrl_llm.errors.DataError` before a model
loads (and from ``jaxrl-llm train --dry-run``).
"""

from __future__ import annotations

import jax

from jaxrl_llm.errors import ConfigError, DataError
from jaxrl_llm.parallel import split_devices
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.config.sections import missing_package


def check_batch_divisible(mesh, rows: int, what: str) -> None:
    """A batch of ``rows`` rows must split evenly over the mesh's data × fsdp axes.

    ``mesh`` is a ``Mesh`` or a ``{"data": n, "fsdp": n, ...}`` dict of axis sizes.
    """
    shape = mesh if isinstance(mesh, dict) else mesh.shape
    shards = shape["data"] * shape["fsdp"]
    if rows % shards:
        raise ConfigError(
            f"{what}={rows} rows cannot be split over the mesh's data x fsdp = "
            f"{shards} devices; use a multiple of {shards} or set mesh.data / "
            f"mesh.fsdp"
        )


def check_mesh(cfg: RunConfig, num_devices: int | None = None, *, mesh=None) -> dict[str, int]:
    """Resolve ``cfg.mesh`` for ``num_devices`` (default: every device) and check that each
    step's batch splits over it — before any model is loaded, and by ``train --dry-run``.

    With ``mesh`` (the mesh of a policy built elsewhere), its axis sizes are checked instead
    of ``cfg.mesh``'s.

    Returns:
      the axis sizes by name (:data:`~jaxrl_llm.parallel.MESH_AXES`).

    Raises:
      ConfigError: the sizes do not fit the device count, the batch rows do not split, or
        the run cannot split its tokens over the ``context`` axis (:func:`check_context`).
    """
    from jaxrl_llm.parallel.mesh import MESH_AXES, mesh_shape

    if mesh is not None:
        sizes = {k: int(mesh.shape[k]) for k in MESH_AXES}
    else:
        n = jax.device_count() if num_devices is None else num_devices
        if cfg.is_online and cfg.rollout.devices:  # the learner's mesh spans the rest
            learner, _ = split_devices(cfg.rollout.devices, list(range(n)))
            n = len(learner)
        sizes = dict(
            zip(
                MESH_AXES,
                mesh_shape(
                    n,
                    data=cfg.mesh.data,
                    fsdp=cfg.mesh.fsdp,
                    tensor=cfg.mesh.tensor,
                    expert=cfg.mesh.expert,
                    context=cfg.mesh.context,
                ),
            )
        )
    r, t = cfg.rollout, cfg.train
    if cfg.algo.pairs_per_group:
        check_batch_divisible(sizes, r.prompts_per_step, "rollout.prompts_per_step (pairs)")
    elif cfg.is_online:
        check_batch_divisible(
            sizes,
            r.prompts_per_step * r.group_size // r.minibatches,
            "rollout.prompts_per_step x group_size / minibatches",
        )
    else:
        check_batch_divisible(
            sizes, t.batch_size // t.micro_batches, "train.batch_size / train.micro_batches"
        )
    check_context(cfg, sizes["context"])
    check_packing(cfg)
    return sizes


def check_packing(cfg: RunConfig) -> None:
    """``logprobs.pack`` packs the online policy-gradient learner batch (GRPO family, PPO,
    reverse-KL distillation); offline runs pack with ``data.packing``, online pairs and GKD
    (whose batch carries the teacher's own inputs) are not packed.

    Raises:
      ConfigError: one line naming the key to change.
    """
    if not cfg.logprobs.pack:
        return
    if not cfg.algo.rollout_logprobs:
        hint = "data.packing" if not cfg.is_online else "logprobs.pack: false"
        raise ConfigError(
            f"logprobs.pack packs the online policy-gradient update; {cfg.algorithm} "
            f"is not one: use {hint}"
        )
    kind = cfg.loss.get("kind")
    if cfg.algo.teacher and getattr(kind, "value", kind) == "gkd":
        raise ConfigError(
            "logprobs.pack with loss.kind: gkd: the teacher's inputs ride in the batch unpacked; "
            "use loss.kind: reverse_kl or logprobs.pack: false"
        )


def check_context(cfg: RunConfig, context: int) -> None:
    """What context parallelism (``mesh.context: C > 1``, ring attention over the token axis)
    needs of a run; nothing for C = 1.

    * ``model.attention: auto``: a forced implementation never goes round the ring, so its
      attention would gather every row's whole T on each device.
    * Offline: ``data.max_length`` (when set) a multiple of C: it caps the padded T (and is
      the packed row length), which must split into C blocks. Online batches are left-padded
      by the learner to a multiple of C, whatever their length.
    * Online group RL: ``logprobs.shared_prompt: false``. The shared-prompt forward attends
      the completions to a prompt computed once per group, an attention that is not
      self-attention over one row and so not ring attention: XLA's partitioner runs it over
      whole rows. Its numbers are right (one GRPO update on data=2 × context=4 gave the
      single-device loss exactly and parameters within 4e-9), but the memory that context
      parallelism is for is not saved, so it is refused rather than run silently so.

    Tested under C > 1 (tests/parallel/test_context_train.py): SFT, DPO with LoRA, the GRPO
    learner update with skipped micro-batches. Run by hand (2 steps, tiny model): GRPO end to
    end on either rollout engine (the rollout runs unsharded along T), and PPO with its critic
    (metrics within 3e-5 of a ``context=1`` run). Not tried, and not refused:
    ``rollout.correction``, a mixture of experts (its block splits tokens over ``context``
    too), ``mesh.tensor`` > 1.

    Raises:
      ConfigError: one line naming the key to change.
    """
    if context <= 1:
        return
    from jaxrl_llm.train.config.loss_plan import logprob_settings

    if cfg.model.attention != "auto":
        raise ConfigError(
            f"model.attention={cfg.model.attention} with mesh.context={context}: context "
            f"parallelism runs attention as ring attention, which only 'auto' selects; set "
            f"model.attention: auto"
        )
    d = cfg.data
    if not cfg.is_online and d.max_length is not None and d.max_length % context:
        raise ConfigError(
            f"data.max_length={d.max_length} cannot be split over mesh.context={context} "
            f"devices; use a multiple of {context}"
        )
    if cfg.is_online and logprob_settings(cfg).prompt_group_size > 1:
        raise ConfigError(
            f"logprobs.shared_prompt=true with mesh.context={context}: the shared-prompt "
            f"forward is not ring attention over one row; set logprobs.shared_prompt: false"
        )


def read_splits(cfg: RunConfig, fmt, tokenizer, *, per_step: int, per_step_key: str, unit: str):
    """The tokenised training and held-out sets of ``cfg.data`` (held-out None without
    ``data.eval``), read before anything compiles so that a bad line costs no compile.

    Raises:
      DataError: the training set (after ``data.length_policy``) cannot fill one step of
        ``per_step`` examples per host (``per_step_key`` names the setting, ``unit`` the
        examples: "examples", "prompts").
    """
    from jaxrl_llm.data import prepare_dataset

    d = cfg.data
    train = prepare_dataset(
        d.train,
        fmt,
        tokenizer,
        max_len=d.max_length,
        length_policy=d.length_policy,
        loss_on=d.loss_on,
    )
    held_out = (
        prepare_dataset(
            d.eval,
            fmt,
            tokenizer,
            max_len=d.max_length,
            length_policy=d.length_policy,
            loss_on=d.loss_on,
        )
        if d.eval
        else None
    )
    hosts = jax.process_count()
    if len(train.items) < per_step * hosts:
        raise DataError(
            f"{d.train}: {len(train.items)} {unit} (after data.length_policy="
            f"{d.length_policy}) cannot fill one step of {per_step_key}={per_step}"
            + (f" x {hosts} hosts" if hosts > 1 else "")
            + f"; add {unit} or lower {per_step_key}"
        )
    return train, held_out


def check_context_budget(context: int, prompt_len: int, max_new_tokens: int, *, key: str) -> None:
    """Refuse, before anything compiles, a generation that would run past the model's context:
    ``prompt_len + max_new_tokens > context`` (RoPE positions past ``max_position_embeddings``
    are silently wrong, and a budget of 1e8 tokens is an out-of-memory traceback). One check
    for ``jaxrl-llm generate`` (``--max-new-tokens``) and training (``rollout.max_new_tokens``).

    Raises:
      ConfigError: ``"<key>: prompt (P tokens) + new tokens exceed the model's context of C
        tokens; use at most C - P new tokens, shorten the prompt (data.max_length in training),
        or use a model with a longer context"``.
    """
    if prompt_len + max_new_tokens > context:
        raise ConfigError(
            f"{key}: prompt ({prompt_len} tokens) + new tokens exceed the model's context of "
            f"{context} tokens; use at most {max(context - prompt_len, 1)} new tokens, shorten "
            f"the prompt (data.max_length in training), or use a model with a longer context "
            f"(model.tiny.max_position_embeddings for model.source: tiny)"
        )


def check_tokenizer_sizes(cfg: RunConfig) -> None:
    """Config-time size checks of a tiny random model (its sizes are in the config, so a
    ``--dry-run`` makes them too): the ``char`` tokenizer decodes only its own 259 ids, so a
    ``model.tiny.vocab_size`` above that would sample ids it cannot decode; an online run's
    ``rollout.max_new_tokens`` must leave room in the context (:func:`check_context_budget`;
    a loaded model is checked when the rollout is built, :class:`~jaxrl_llm.train.online.rollout.
    Rollouts`).

    Raises:
      ConfigError: one line naming the key.
    """
    from jaxrl_llm.data import CharTokenizer
    from jaxrl_llm.models import ModelConfig

    m = cfg.model
    if m.source != "tiny":
        return
    tiny = dict(m.tiny or {})
    vocab = tiny.get("vocab_size")
    if m.tokenizer == "char" and isinstance(vocab, int) and vocab > CharTokenizer.vocab_size:
        raise ConfigError(
            f"model.tiny.vocab_size={vocab} with model.tokenizer=char: the char tokenizer has "
            f"{CharTokenizer.vocab_size} tokens and cannot decode the ids above them that the "
            f"model would sample; leave model.tiny.vocab_size out (or at most "
            f"{CharTokenizer.vocab_size})"
        )
    context = tiny.get("max_position_embeddings") or ModelConfig.tiny().max_position_embeddings
    if cfg.is_online and isinstance(context, int):
        n = cfg.rollout.max_new_tokens
        check_context_budget(context, 1, n, key=f"rollout.max_new_tokens={n}")


def check_trackers(cfg: RunConfig) -> None:
    """Every tracker the config asks for by name (``logging.trackers``, or ``wandb`` for
    ``logging.wandb_project``) has its package installed, and MLflow has a store it can
    write to: ``MLFLOW_TRACKING_URI``, or MLflow's default local store (``sqlite:///mlflow.db``,
    which needs the full ``mlflow`` package); a file store (``file:...``) needs
    ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses it otherwise).

    Raises:
      ConfigError: one line naming the tracker and the pip package or variable to set.
    """
    import importlib.util
    import os

    for name in cfg.logging.required_trackers():
        pip_name = missing_package(name)
        if pip_name is not None:
            raise ConfigError(
                f"logging.trackers: {name} needs the {pip_name} package: pip install {pip_name} "
                f"(or pip install 'jaxrl_llm[trackers]')"
            )
    if "mlflow" not in cfg.logging.required_trackers():
        return
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri and importlib.util.find_spec("sqlalchemy") is None:
        raise ConfigError(
            "logging.trackers: mlflow: set MLFLOW_TRACKING_URI (an MLflow server's URL), or "
            "pip install mlflow for its default local store sqlite:///mlflow.db"
        )
    file_store = uri.startswith("file:") or (bool(uri) and "://" not in uri and uri != "databricks")
    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true")
    if file_store and not allowed:
        raise ConfigError(
            f"logging.trackers: mlflow: MLFLOW_TRACKING_URI={uri} is a file store, which "
            f"MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true; set that or use a server"
        )


def known_model_config(source: str, tiny: dict | None = None):
    """The :class:`~jaxrl_llm.models.ModelConfig` of a model source that is known without
    loading it: ``tiny`` (with its ``tiny`` overrides, the char tokenizer's 259 ids), or a local
    directory holding a ``config.json``; None for the others (a hub id, an alias, a GGUF file,
    a run directory), and for a config the loader will refuse with its own line."""
    import json
    import os

    from jaxrl_llm.models import ModelConfig

    try:
        if source == "tiny":
            return ModelConfig.tiny(**{"vocab_size": 259, **(tiny or {})})
        path = os.path.join(source, "config.json")
        if os.path.isfile(path):
            from jaxrl_llm.interop.hf_config import model_config_from_hf

            with open(path, encoding="utf-8") as f:
                return model_config_from_hf(json.load(f))
    except Exception:  # noqa: BLE001 - the loader reports a bad config in its own line
        return None
    return None


def check_lengths(cfg: RunConfig) -> None:
    """An online run's lengths against the model's context, where the model's config is known
    before it loads (:func:`known_model_config`): the prompt budget (``data.max_length``, or 1
    token) + ``rollout.max_new_tokens``; for distillation, the teacher's prompt as well
    (``teacher.system_prompt``, counted in bytes with the char tokenizer) against the teacher's
    context. A loaded model is checked when its rollout is built.

    Raises:
      ConfigError: one line naming the key (:func:`check_context_budget`).
    """
    if not cfg.is_online:
        return
    n = cfg.rollout.max_new_tokens
    prompt = cfg.data.max_length or 1
    policy = known_model_config(cfg.model.source, cfg.model.tiny)
    if policy is not None:
        check_context_budget(
            policy.max_position_embeddings,
            prompt,
            n,
            key=f"rollout.max_new_tokens={n}"
            + (f" with data.max_length={prompt}" if cfg.data.max_length else ""),
        )
    t = cfg.teacher
    if t is None or not t.system_prompt:
        return
    teacher = known_model_config(t.source, t.tiny)
    if teacher is None:
        return
    system = len(t.system_prompt.encode("utf-8")) if t.tokenizer == "char" else 0
    context = teacher.max_position_embeddings
    if system + prompt + n > context:
        raise ConfigError(
            f"teacher.system_prompt ({system} tokens) + the prompt ({prompt}) + "
            f"rollout.max_new_tokens ({n}) exceed the teacher's context of {context} tokens; "
            f"shorten teacher.system_prompt to at most {max(context - prompt - n, 0)} tokens"
        )


def check_routing(cfg: RunConfig) -> None:
    """``rollout.routing_replay`` / ``record_routing`` record a mixture of experts' routing; on
    a dense model, known before it loads (:func:`known_model_config`), there is none to record,
    and the run would silently train without it.

    Raises:
      ConfigError: one line naming the key.
    """
    r = cfg.rollout
    if not cfg.is_online or not r.records_routing:
        return
    config = known_model_config(cfg.model.source, cfg.model.tiny)
    if config is not None and not config.is_moe:
        key = "routing_replay" if r.routing_replay else "record_routing"
        raise ConfigError(
            f"rollout.{key}: model.source={cfg.model.source!r} is a dense model (no experts), "
            f"so there is no routing to record or replay; leave rollout.{key} out"
        )

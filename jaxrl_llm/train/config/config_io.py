"""Typed configs from YAML with ``dotted.key=value`` overrides, validated before anything
compiles.

A config schema is a tree of frozen dataclasses. :func:`from_dict` builds it from plain dicts
and raises :class:`~jaxrl_llm.errors.ConfigError` with one line naming the dotted key and what
is allowed for: an unknown key (with the allowed keys and a close match), a wrong type, a value
outside an enum. Overrides are parsed as YAML scalars (``lr=1e-5``, ``model.remat=full``,
``data.packing=true``, ``mesh=null``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from jaxrl_llm.errors import ConfigError, did_you_mean

#: TRL's (transformers') names for keys this config spells otherwise: an unknown key that is one
#: of them is refused with the key to use (one spelling per key in a YAML file; the typed
#: configs of :mod:`jaxrl_llm.train.trl_config` take TRL's names). Keyed by the dotted key.
TRL_NAMES: dict[str, str] = {
    "learning_rate": "optim.lr",
    "lr_scheduler_type": "optim.schedule",
    "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.grad_clip",
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    "num_iterations": "rollout.epochs",
    "max_prompt_length": "data.max_length (the longest prompt, online)",
    "max_length": "data.max_length",
    "packing": "data.packing",
    "per_device_train_batch_size": (
        "a global batch: rollout.prompts_per_step prompts x rollout.group_size samples "
        "(online) or train.batch_size rows (offline), split over the mesh"
    ),
    "gradient_accumulation_steps": (
        "train.micro_batches (offline: train.batch_size split into that many micro-batches)"
    ),
    "beta": "loss.kl_coef (GRPO, RLOO), loss.beta (DPO, KTO, ORPO, online DPO) or ppo.kl_coef",
    "loss.beta": "loss.kl_coef (β of the KL penalty of the policy-gradient losses)",
    "epsilon": "loss.clip_eps",
    "peft_config": "model.lora: {rank, alpha, targets} (null: full fine-tuning)",
    "num_train_epochs": "max_steps (a number of steps, not epochs)",
    "logging_steps": "logging.log_every",
    "save_steps": "checkpoint.save_every",
    "save_total_limit": "checkpoint.keep",
    "eval_steps": "eval.every (online) or train.eval_every (offline)",
    "report_to": "logging.trackers",
    "run_name": "logging.run_name",
    "gradient_checkpointing": "model.remat: full",
    "bf16": "model.compute_dtype: bfloat16",
    "resume_from_checkpoint": "resume: true (the newest checkpoint in output_dir)",
    "model_name_or_path": "model.source",
}

#: Most values a YAML file may expand to through anchors and aliases (``*name``): a config is a
#: few hundred values; an alias bomb ("billion laughs") is billions.
MAX_YAML_VALUES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys in a mapping (YAML 1.2 forbids them;
    PyYAML keeps the last silently) and bounds what aliases expand to. Merge keys
    (``<<: *anchor``, YAML 1.1's) work as in PyYAML: the anchored mapping's keys, each of
    which the mapping's own keys override; only the mapping's own keys count as duplicates."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # flattened by SafeConstructor.construct_mapping
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: duplicate key {key!r} (first on line "
                    f"{seen[key]}); keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node, limit: int) -> int:
    """Values ``node`` expands to, counting each alias use again; stops past ``limit``."""
    memo: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in memo:
            return memo[id(n)]
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in n.value)
        else:
            total = 1
        memo[id(n)] = min(total, limit + 1)
        return memo[id(n)]

    return size(node)


def _distinct_size(node) -> int:
    """Values ``node`` holds as written (each node once, however many aliases use it)."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            todo.extend(x for kv in n.value for x in kv)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend(n.value)
    return len(seen)


#: Deepest nesting a YAML document may have: a config is a few levels deep; PyYAML's parser
#: recurses once per level and a 20,000-deep document exhausts Python's stack.
MAX_YAML_DEPTH = 100


def _depth_at_most(node, limit: int) -> bool:
    """Whether ``node`` nests at most ``limit`` levels (walked without recursion)."""
    todo = [(node, 1)]
    seen: set[int] = set()
    while todo:
        n, depth = todo.pop()
        if depth > limit:
            return False
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            todo.extend((x, depth + 1) for kv in n.value for x in kv)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend((x, depth + 1) for x in n.value)
    return True


def _safe_load(stream) -> Any:
    """Parse YAML with :class:`_StrictLoader`, refusing documents nested deeper than
    :data:`MAX_YAML_DEPTH` or whose aliases expand to more than :data:`MAX_YAML_VALUES` values
    before building them."""
    loader = _StrictLoader(stream)
    deep = ConfigError(f"nested more than {MAX_YAML_DEPTH} levels deep; a config is a few")
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise deep from None
        if node is None:
            return None
        if not _depth_at_most(node, MAX_YAML_DEPTH):
            raise deep
        if _expanded_size(node, MAX_YAML_VALUES) > MAX_YAML_VALUES:
            if _distinct_size(node) > MAX_YAML_VALUES:  # big as written: no alias needed
                raise ConfigError(
                    f"holds more than {MAX_YAML_VALUES:,} values; a config holds a few hundred "
                    f"(rows go in a data file: data.train)"
                )
            raise ConfigError(
                f"expands to more than {MAX_YAML_VALUES:,} values through anchors/aliases "
                f"(an alias bomb?); write the values out"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin in (dict, Mapping):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str):
    """Check/convert ``value`` to type ``tp``; raise ConfigError naming ``key``."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as err:
                errors.append((a, err))
        for a, problem in errors:  # a mapping for a section: its own error names the inner key
            if isinstance(value, Mapping) and dataclasses.is_dataclass(a):
                raise problem
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key}: expected a mapping of {sorted(f.name for f in dataclasses.fields(tp))}, "
                f"got {value!r}"
            )
        return from_dict(tp, value, prefix=key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}") from None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        args = typing.get_args(tp)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    value = float(value)  # YAML reads "1e-5" as a string
                except ValueError:
                    pass
            if not isinstance(value, float):
                raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    return value


def from_dict(cls, data: Mapping[str, Any], *, prefix: str = ""):
    """Build dataclass ``cls`` from ``data``, validating keys and types recursively."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            trl = TRL_NAMES.get(key) or TRL_NAMES.get(str(k))
            if trl:
                raise ConfigError(
                    f"unknown config key {key!r}: that is TRL's name; here it is {trl}"
                )
            raise ConfigError(
                f"unknown config key {key!r}{did_you_mean(k, fields)}; allowed keys"
                f"{' under ' + repr(prefix) if prefix else ''}: {sorted(fields)}"
            )
        kwargs[k] = _coerce(v, hints[k], key)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"missing required config key(s) {[f'{prefix}.{m}' if prefix else m for m in missing]}"
        )
    try:
        return cls(**kwargs)
    except ConfigError as e:
        # A section's own check (e.g. a loss config's ``beta=-0.1 must be > 0``) names its
        # field; prefix the section so the user knows where to look (``loss: ...``).
        if not prefix or str(e).startswith(prefix):
            raise
        raise ConfigError(f"{prefix}: {e}") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or 'config'}: {e}") from None


def to_dict(cfg) -> Any:
    """Dataclass tree -> plain dicts/lists/scalars (enums as their values), for YAML/JSON."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key part")
    try:
        value = _safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ConfigError):
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Apply ``dotted.key=value`` overrides to a nested dict (returns a new dict)."""
    import copy

    out = copy.deepcopy(data)
    for ov in overrides:
        path, value = parse_override(ov)
        node = out
        for p in path[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif isinstance(nxt, list):
                raise ConfigError(
                    f"override {ov!r}: {p!r} is a list; override it whole, e.g. {p}=[{{...}}, ...]"
                )
            elif not isinstance(nxt, dict):
                raise ConfigError(f"override {ov!r}: {p!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return out


#: Top-level keys with this prefix are a config file's own (a home for YAML anchors,
#: ``x-defaults: &d {...}`` then ``<<: *d``, as docker-compose's extension fields); dropped.
EXTENSION_PREFIX = "x-"


def load_yaml(path: str) -> dict:
    """Read a YAML config file into a dict, with clear errors for a missing or bad file.
    Top-level keys starting with :data:`EXTENSION_PREFIX` are dropped."""
    try:
        with open(path, encoding="utf-8") as f:
            data = _safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(
            f"config file {path!r} is a directory; pass a YAML file such as configs/sft.yaml"
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path!r}: not valid UTF-8 (byte {e.start}); save it as UTF-8 text"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read ({e.strerror or e})") from None
    except ConfigError as e:
        raise ConfigError(f"config file {path!r}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"config file {path!r}{where}: invalid YAML ({getattr(e, 'problem', e)})"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r}: the top level must be a mapping of keys")
    return {k: v for k, v in data.items() if not str(k).startswith(EXTENSION_PREFIX)}


def key_lines(path: str) -> dict[str, int]:
    """The 1-based line of every key of a YAML file, by dotted key (``rollout.group_size``,
    ``rewards[0].name``); empty when the file cannot be parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            root = yaml.compose(f, Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    out: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    key = f"{prefix}.{k.value}" if prefix else str(k.value)
                    out.setdefault(key, k.start_mark.line + 1)
                    walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = f"{prefix}[{i}]"
                out.setdefault(key, v.start_mark.line + 1)
                walk(v, key)

    walk(root, "")
    return out


_ERROR_KEY = re.compile(r"^(?:unknown config key '(?P<unknown>[^']+)'|(?P<key>[\w.\[\]]+):)")


def load_config(cls, path: str, overrides: Sequence[str] = ()):
    """YAML file + overrides -> validated dataclass ``cls``. An error about a key of the file
    (not one an override set) starts with the file and the key's line."""
    overrides = list(overrides)
    try:
        return from_dict(cls, apply_overrides(load_yaml(path), overrides))
    except ConfigError as e:
        m = _ERROR_KEY.match(str(e))
        key = (m.group("unknown") or m.group("key")) if m else None
        overridden = [".".join(parse_override(o)[0]) for o in overrides]
        from_override = key is not None and any(
            key == o or key.startswith((o + ".", o + "[")) for o in overridden
        )
        line = key_lines(path).get(key) if key and not from_override else None
        if line is None:
            raise
        raise ConfigError(f"{path} line {line}: {e}") from None

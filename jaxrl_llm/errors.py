"""Errors a user can act on. The CLI prints them as one line (no traceback).

Raise the most specific subclass with a message that names the input (file, line, key, path)
and what is allowed or what to do.
"""


class JaxrlError(Exception):
    """Base class of every error jaxrl_llm reports to a user as a single line."""


class ConfigError(JaxrlError, ValueError):
    """A config key, value or combination is invalid."""


class DataError(JaxrlError, ValueError):
    """A data file or example is malformed (names the file, line and field)."""


class ModelLoadError(JaxrlError, ValueError):
    """A model source cannot be loaded (missing path, bad file, unsupported architecture)."""


class CheckpointError(JaxrlError, RuntimeError):
    """A checkpoint is missing, incomplete or incompatible."""


class RewardError(JaxrlError, RuntimeError):
    """A reward function failed in a way that cannot be scored as zero."""


class TrainingError(JaxrlError, RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite steps)."""


def did_you_mean(word: object, choices) -> str:
    """``" (did you mean 'x'?)"`` naming the choice closest to ``word``, or ``""`` when none
    is close; appended to an "unknown X" message.

    Close is ``difflib``'s ratio ≥ 0.6 (its usual bar for a typo); among the closest, a choice
    with the same letters (two swapped: ``gpro`` → ``grpo``, not ``gspo``) comes first; a
    choice that differs only in case is close too.

    Example:
      >>> did_you_mean("gpro", ["grpo", "ppo", "dpo"])
      " (did you mean 'grpo'?)"
    """
    import difflib

    text, names = str(word), [str(c) for c in choices]
    close = difflib.get_close_matches(text, names, n=3)
    close.sort(key=lambda c: sorted(c) != sorted(text))  # stable: difflib's order otherwise
    if not close:
        close = [c for c in names if c.lower() == text.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_at_least(key: str, value, lo, note: str = "") -> None:
    """Raise :class:`ConfigError` ``"<key> must be >= <lo> (<note>), got <value>"`` when
    ``value < lo``; None passes (an optional setting left unset)."""
    if value is not None and value < lo:
        raise ConfigError(f"{key} must be >= {lo}{f' ({note})' if note else ''}, got {value}")

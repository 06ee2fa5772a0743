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

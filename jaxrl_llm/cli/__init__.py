"""Command-line interface: ``jaxrl-llm train / generate / convert / memory / plot / bench``."""

from jaxrl_llm.cli.main import main

__all__ = ["main"]

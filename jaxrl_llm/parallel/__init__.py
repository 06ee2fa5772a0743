"""jaxrl_llm.parallel (in progress)."""

__all__: list[str] = []

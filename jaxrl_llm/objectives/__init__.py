"""jaxrl_llm.objectives (in progress)."""

__all__: list[str] = []

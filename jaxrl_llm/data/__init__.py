"""jaxrl_llm.data (in progress)."""

__all__: list[str] = []

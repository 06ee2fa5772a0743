"""jaxrl_llm.sampling (in progress)."""

__all__: list[str] = []

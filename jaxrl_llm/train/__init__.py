"""jaxrl_llm.train (in progress)."""

__all__: list[str] = []

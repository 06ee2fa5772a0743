"""jaxrl_llm.losses (in progress)."""

__all__: list[str] = []

"""jaxrl_llm.rewards (in progress)."""

__all__: list[str] = []

"""jaxrl_llm.interop (in progress)."""

__all__: list[str] = []

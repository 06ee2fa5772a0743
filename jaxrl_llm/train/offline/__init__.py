"""Offline training (``trainer``): data -> loss -> sharded step.

Public names are exported by :mod:`jaxrl_llm.train`."""

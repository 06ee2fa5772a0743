"""Sizing a run before it runs: the memory estimate (``memory``, ``memory_presets``) and ahead-of-
time TPU compilation (``aot``, ``aot_inputs``, ``aot_report``).

Public names are exported by :mod:`jaxrl_llm.train`."""

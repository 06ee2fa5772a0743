"""Every model family, its facts in one folder (``models/families/<name>/``): presets, the
Hugging Face config mapping both ways, the weight names for import and export, and the
memory-planning sizes: Llama, Mistral, Qwen2 / 3 (:mod:`.llama`, the layout the others start
from), Qwen3-MoE and Mixtral (:mod:`.llama_moe`), Gemma 2 / 3 (:mod:`.gemma`), Gemma 4
(:mod:`.gemma4`), Qwen3.5 (:mod:`.qwen3_5`) and gpt-oss (:mod:`.gpt_oss`). A folder may hold a
group of families that differ only in a few facts (its ``__init__`` says why).

Layout, and why it sits under ``models/``:

- ``<name>/presets.py``: the family's sizes as field dicts (tiny, and the published ones). It
  imports only :mod:`jaxrl_llm.models.options` (and, for Qwen3-MoE / Mixtral, the Llama sizes
  they start from), so :class:`~jaxrl_llm.models.ModelConfig` can
  ask for them without an import circle.
- ``<name>/hf_config.py`` and ``<name>/weights.py``: transformers' config keys and weight names
  both ways (the Llama layout's names are the shared mapping's, so :mod:`.llama` has no
  ``weights.py``). They are plain dict and numpy code (transformers is imported lazily, to build its
  config class on export), so the family's whole entry can live beside its presets; ``interop/``
  asks the family's entry (``interop`` → ``models`` is the direction the package already
  allows; nothing in ``models/`` imports ``interop/``).
- :mod:`.facts`: what the shared config asks a family without naming it (its tiny preset, its
  norm's product dtype, whether it needs experts or a hybrid stack); a leaf table.
- :mod:`.registry`: the one table from :class:`~jaxrl_llm.models.Family` to a family's entry
  (:class:`~jaxrl_llm.models.families.registry.FamilyEntry`) for every family; with
  :mod:`.facts`, the only place a family is named outside its folder (no comparison or table
  of family names elsewhere in the package: ``tests/test_package_habits.py``).

Everything a family *computes* that the shared layer may meet again (attention sinks, biases,
the clamped SwiGLU, YaRN) is a config feature of the shared layer in ``models/``, not a fork of
it here. This package's ``__init__`` imports nothing, so that importing one preset module does
not pull in the registry (which imports the config).
"""

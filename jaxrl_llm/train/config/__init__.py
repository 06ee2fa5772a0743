"""A run's configuration: the schema (``sections``), the whole config and its checks
(``run_config``), YAML and overrides (``config_io``), the checks before anything compiles
(``preflight``) and the run plan it resolves to (``plan``).

Public names are exported by :mod:`jaxrl_llm.train`."""

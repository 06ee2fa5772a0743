"""The model being trained and its jitted programs: the policy (``policy``), the train state
(``state``), the sharded train step (``step``) and the one builder of a run's programs from its
plan (``builder``).

Public names are exported by :mod:`jaxrl_llm.train`."""

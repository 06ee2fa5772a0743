"""The run loop shared by the trainers (``loop``): resume, checkpoints (``checkpoint``,
``checkpoint_steps``, ``run_state``), logging (``logging``), fault points for the kill tests
(``faults``) and throughput helpers (``throughput``).

Public names are exported by :mod:`jaxrl_llm.train`."""

"""Online RL: the trainer (``trainer``: rollout -> experience -> learner), the rollout
(``rollout``, ``episode_sampler`` for environments), the experience record (``experience``), the
algorithm strategies (``algorithms``), the learner (``learner``), rollout correction
(``correction``), the asynchronous producer (``producer``) and rollout placement
(``placement``).

Public names are exported by :mod:`jaxrl_llm.train`."""

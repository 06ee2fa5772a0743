"""Fault injection for the kill-and-resume tests (``tests/train/test_kill_resume.py``).

``JAXRL_LLM_FAULT=PHASE:STEP`` makes a trainer SIGKILL its own process when step ``STEP``
reaches ``PHASE``, the way a preempted or OOM-killed job dies (no cleanup, no flush, an async
checkpoint write cut off). The phases, in the order a step passes them:

- ``job`` (step 0): a multi-process job's start-up checks have passed
  (:func:`jaxrl_llm.train.run.job.check_job`); the run has not started, and no handler of
  the run's is installed (``job:0:TERM``: a SIGTERM that JAX's own handler takes).
- ``start`` (step 0): a trainer's start-up begins, before its model loads and its programs
  compile (``JAXRL_LLM_FAULT=start:0:TERM``: a stop during start-up).
- ``rollout``: the step's prompts are drawn and sampled (the data iterator has advanced).
- ``update``: the first minibatch update of the step has been applied to the state in memory
  (offline: the step's update has been dispatched).
- ``checkpoint``: the step's checkpoint write has started and is still in flight.

``JAXRL_LLM_FAULT=PHASE:STEP:INT`` (or ``TERM``) sends that signal instead, as Ctrl-C or a
scheduler would, at a point of the run a test can name (a test process reading the run's
progress lines may lag behind steps that take milliseconds).
``PHASE:STEP:HOLD=S`` makes the process wait ``S`` seconds there instead (``job:0:HOLD=4``: a
process that joins the job's peer watch late, while process 0 listens).

Unset (the normal case), :func:`fault_point` is a dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import signal
import time

ENV_VAR = "JAXRL_LLM_FAULT"


def fault_point(phase: str, step: int) -> None:
    """SIGKILL this process if ``JAXRL_LLM_FAULT`` is ``f"{phase}:{step}"``; send it SIGINT
    or SIGTERM if it is ``f"{phase}:{step}:INT"`` / ``":TERM"``; wait ``S`` seconds if it is
    ``f"{phase}:{step}:HOLD=S"``."""
    spec = os.environ.get(ENV_VAR)
    if not spec or not spec.startswith(f"{phase}:{step}"):
        return
    if spec == f"{phase}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec.startswith(f"{phase}:{step}:HOLD="):
        time.sleep(float(spec.rsplit("=", 1)[1]))
    elif spec in (f"{phase}:{step}:INT", f"{phase}:{step}:TERM"):
        os.kill(os.getpid(), getattr(signal, "SIG" + spec.rsplit(":", 1)[1]))

"""Each request an agent makes, recorded as a turn of its episode (token in, token out).

A client that sends the header :data:`EPISODE_HEADER` (``x-jaxrl-episode: ID``) has every
choice the endpoint returns to it recorded under ``ID``: the exact prompt ids the engine
prefilled, the ids it drew (as the client saw them: cut at a stop string), their behaviour
log-probs and the weights' version of each token. A trainer reads an episode's turns back with
:meth:`TurnRecorder.take` and trains on exactly those tokens, never on a re-tokenisation of
the text the agent saw (which can differ: a BPE tokenizer may merge the characters of two
turns' tokens differently).
"""

from __future__ import annotations

import collections
import dataclasses
import threading

#: The request header that names the episode a request belongs to.
EPISODE_HEADER = "x-jaxrl-episode"


@dataclasses.dataclass(frozen=True)
class Turn:
    """One choice of one request.

    Attributes:
      prompt_token_ids: the ids the engine prefilled (the chat template's rendering).
      token_ids: the ids it drew for this choice, as returned (stop token included, cut
        after the token that completed a stop string).
      logprobs: their behaviour log-probs, log softmax(z / τ)[token].
      versions: per token, the version of the weights that drew it.
      finish_reason: ``stop``, ``length`` (or ``tool_calls`` is reported as ``stop``).
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


class TurnRecorder:
    """Turns by episode id, filled by the routes (any thread) and taken by the trainer."""

    def __init__(self) -> None:
        self._turns: dict[str, list[Turn]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def record(self, episode: str, turn: Turn) -> None:
        """Append ``turn`` to ``episode``'s turns."""
        with self._lock:
            self._turns[episode].append(turn)

    def take(self, episode: str) -> list[Turn]:
        """``episode``'s turns in the order they were answered, forgetting them."""
        with self._lock:
            return self._turns.pop(episode, [])

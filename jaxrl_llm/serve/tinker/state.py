"""What one Tinker service holds: sessions, tenants, samplers, futures, and its queue."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import json
import pathlib
import uuid
from typing import Any

from jaxrl_llm.serve.engine_loop import EngineLoop
from jaxrl_llm.serve.served import ServedModel
from jaxrl_llm.serve.server import ServeError
from jaxrl_llm.serve.tinker import tenants as tn
from jaxrl_llm.serve.tinker.sampler import Sampler
from jaxrl_llm.serve.tinker.service import Batcher, FwdBwd

KIND = "tinker"
RESUME = "_resume.json"
LAST = "_last"
#: delivered futures remembered (for a client that retries a lost response)
KEPT = 4096


class TinkerState:
    """The service's state; tenants and samplers change only on the engine loop's thread.

    Args:
      served: the base model.
      loop: the server's engine loop (this registers its ``"tinker"`` handler).
      root: ``--output-dir``: checkpoints, and what SIGTERM saves.
      max_tenants: the most tenants at once (a new one past it is refused with a 400).
    """

    def __init__(
        self, served: ServedModel, loop: EngineLoop, root: pathlib.Path, max_tenants: int = 64
    ):
        self.served, self.loop, self.root, self.max_tenants = served, loop, root, max_tenants
        self.sessions: set[str] = set()
        self.tenants: dict[str, tn.Tenant] = {}
        self.samplers: dict[str, Sampler] = {}
        self.futures: dict[str, tuple[concurrent.futures.Future, bool]] = {}
        self._delivered: collections.deque[str] = collections.deque()
        self.merged: collections.OrderedDict = collections.OrderedDict()
        self.batcher = Batcher(served)
        self.seeds = itertools.count(1)
        #: forward_backward requests accepted so far (a test waits on it)
        self.received = 0
        self.tokenizer_id = _tokenizer_id(served)
        loop.register(KIND, self.handle)

    # ----- lookups that refuse -----------------------------------------------------------------

    def check_model(self, base_model: str) -> None:
        """404 unless ``base_model`` is the served model."""
        if base_model != self.served.name:
            raise ServeError(
                404, f"unknown model {base_model!r}; this server serves {self.served.name!r}"
            )

    def check_capacity(self) -> None:
        """400 when another tenant would pass ``--max-tenants``."""
        if len(self.tenants) >= self.max_tenants:
            raise ServeError(
                400, f"this server holds its maximum of {self.max_tenants} tenants (--max-tenants)"
            )

    def tenant(self, model_id: str) -> tn.Tenant:
        """The tenant ``model_id`` (404 when unknown)."""
        t = self.tenants.get(model_id)
        if t is None:
            raise ServeError(404, f"unknown model_id {model_id!r} (no such training client)")
        return t

    def sampler(self, sampler_id: str) -> Sampler:
        """The sampling session ``sampler_id`` (404 when unknown)."""
        s = self.samplers.get(sampler_id)
        if s is None:
            raise ServeError(404, f"unknown sampling session {sampler_id!r}")
        return s

    # ----- work --------------------------------------------------------------------------------

    def queue(self, work: Any, model_id: str | None, *, proto: bool = False) -> dict[str, Any]:
        """Queue ``work`` (a :class:`FwdBwd` or a callable) and answer the SDK's future."""
        rid = str(uuid.uuid4())
        self.futures[rid] = (self.loop.submit(KIND, work), proto)
        return {"request_id": rid, "model_id": model_id}

    def delivered(self, request_id: str) -> None:
        """Note a future whose result went out; the oldest past :data:`KEPT` are forgotten
        (kept a while so that a client retrying a lost response still finds it)."""
        self._delivered.append(request_id)
        while len(self._delivered) > KEPT:
            self.futures.pop(self._delivered.popleft(), None)

    def handle(self, items: list[Any]) -> list[Any]:
        """The engine loop's handler: items in arrival order, runs of consecutive
        forward_backward calls of distinct tenants batched into one step."""
        results: list[Any] = [None] * len(items)
        i = 0
        while i < len(items):
            if isinstance(items[i], FwdBwd):
                j, seen = i, set()
                while (
                    j < len(items)
                    and isinstance(items[j], FwdBwd)
                    and items[j].tenant.model_id not in seen
                ):
                    seen.add(items[j].tenant.model_id)
                    j += 1
                results[i:j] = self.batcher.run(items[i:j])
                i = j
                continue
            try:
                results[i] = items[i]()
            except Exception as e:  # returned: fails this request only
                results[i] = e
            i += 1
        return results

    def save_for_sampler(self, tenant: tn.Tenant, name: str | None, body: dict) -> dict:
        """A named sampler checkpoint (its path), or an in-memory sampling session (its id)."""
        if name:
            path = tn.save(self.root, tenant, "sampler_weights", str(name), self.served.name)
            return {"type": "save_weights_for_sampler", "path": path}
        session = tenant.model_id.split(":train:")[0]
        sid = f"{session}:sample:{int(body.get('sampling_session_seq_id') or 0)}"
        self.samplers[sid] = Sampler(sid, self.served.name, None, tenant.adapters, tenant.lora)
        return {"type": "save_weights_for_sampler", "sampling_session_id": sid}

    # ----- SIGTERM and --resume ----------------------------------------------------------------

    def save_all(self) -> list[str]:
        """Save every tenant (adapters + optimizer) as its ``_last`` checkpoint; returns paths."""
        paths = [
            tn.save(self.root, t, "weights", LAST, self.served.name) for t in self.tenants.values()
        ]
        (self.root / RESUME).write_text(json.dumps(sorted(self.tenants)))
        return paths

    def resume(self) -> int:
        """Restore the tenants :meth:`save_all` saved; returns how many."""
        listed = self.root / RESUME
        if not listed.exists():
            return 0
        for model_id in json.loads(listed.read_text()):
            meta, arrays = tn.load(self.root, tn.tinker_path(model_id, "weights", LAST))
            tenant = tn.new_tenant(model_id, self.served.config, tn.LoraRequest(**meta["lora"]))
            tn.restore(tenant, arrays, optimizer=True)
            tenant.steps = int(meta.get("steps", 0))
            self.tenants[model_id] = tenant
            self.sessions.add(model_id.split(":train:")[0])
        return len(self.tenants)


def _tokenizer_id(served: ServedModel) -> str | None:
    """What ``get_info`` names as the tokenizer (``AutoTokenizer.from_pretrained`` of it is
    what the SDK's ``get_tokenizer`` does): the loaded tokenizer's own directory or Hub id
    when it has one (an alias resolves to its files), else ``--model``; None without one."""
    if served.tokenizer is None:
        return None
    path = getattr(served.tokenizer, "name_or_path", None)
    if not isinstance(path, str) or not path:
        return served.source
    return str(pathlib.Path(path).resolve()) if pathlib.Path(path).is_dir() else path

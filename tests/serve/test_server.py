"""The server seam: one app, an API key, one-sentence errors per protocol, the engine loop
batching work of one kind, SIGTERM saving through ``on_stop`` (exit 143)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import fastapi
import httpx
import jax
import pytest
from pydantic import BaseModel

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.serve import EngineLoop, Protocol, ServeError, ServerThread, make_app


def _protocol(loop: EngineLoop) -> Protocol:
    router = fastapi.APIRouter()

    class Body(BaseModel):
        x: int

    @router.post("/p/v1/double")
    async def double(body: Body):
        return {"y": await loop.run("double", body.x)}

    @router.get("/p/v1/refuse")
    async def refuse():
        raise ServeError(404, "unknown tenant 't-1'")

    @router.get("/p/v1/config")
    async def config():
        raise ConfigError("loss 'xyz' is not one of cross_entropy, ppo")

    return Protocol("p", router, prefix="/p/", error_body=lambda s, m: {"detail": m, "status": s})


def test_routes_errors_and_api_key():
    loop = EngineLoop({"double": lambda xs: [2 * x for x in xs]}).start()
    try:
        with ServerThread(make_app([_protocol(loop)], api_key="k")) as s:
            assert s.url.startswith("http://127.0.0.1:")
            ok = {"Authorization": "Bearer k"}
            assert httpx.post(f"{s.url}/p/v1/double", json={"x": 4}, headers=ok).json() == {"y": 8}
            r = httpx.post(f"{s.url}/p/v1/double", json={"x": 4}, headers={"X-API-Key": "k"})
            assert r.json() == {"y": 8}
            r = httpx.post(f"{s.url}/p/v1/double", json={"x": 4})
            assert r.status_code == 401 and r.json()["detail"] == "the request has no API key"
            r = httpx.post(f"{s.url}/p/v1/double", json={"x": 4}, headers={"X-API-Key": "z"})
            assert r.status_code == 401 and "wrong API key" in r.json()["detail"]
            r = httpx.post(f"{s.url}/p/v1/double", json={"x": "four"}, headers=ok)
            assert r.status_code == 422 and r.json()["detail"].startswith("x: ")
            r = httpx.get(f"{s.url}/p/v1/refuse", headers=ok)
            assert r.status_code == 404 and r.json() == {
                "detail": "unknown tenant 't-1'",
                "status": 404,
            }
            r = httpx.get(f"{s.url}/p/v1/config", headers=ok)
            assert r.status_code == 400 and "not one of" in r.json()["detail"]
            assert httpx.get(f"{s.url}/health", headers=ok).json()["protocols"] == ["p"]
        assert not s.thread.is_alive()
    finally:
        loop.stop()


def test_engine_loop_batches_one_kind_and_isolates_failures():
    seen: list[list[int]] = []
    gate = threading.Event()

    def handler(xs):
        gate.wait(10)
        seen.append(list(xs))
        return [ValueError(f"bad {x}") if x < 0 else x + 1 for x in xs]

    loop = EngineLoop({"inc": handler}).start()
    try:
        first = loop.submit("inc", 0)  # holds the thread at the gate
        time.sleep(0.05)
        rest = [loop.submit("inc", x) for x in (1, -2, 3)]
        gate.set()
        assert first.result(10) == 1
        assert rest[0].result(10) == 2 and rest[2].result(10) == 4
        with pytest.raises(ValueError, match="bad -2"):
            rest[1].result(10)
        assert seen == [[0], [1, -2, 3]]  # the three queued together ran as one group
        assert loop.call(lambda: "on the loop").result(10) == "on the loop"
    finally:
        loop.stop()


def test_sigterm_runs_on_stop_and_exits_143(tmp_path):
    marker = tmp_path / "saved"
    script = textwrap.dedent(
        f"""
        import fastapi
        from jaxrl_llm.serve import Protocol, serve
        def save():
            open({str(marker)!r}, "w").write("saved")
        p = Protocol("p", fastapi.APIRouter(), on_stop=save)
        raise SystemExit(serve([p], port=0, announce=lambda s: print(s, flush=True)))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving p on http://127.0.0.1:"), line
        url = line.split(" on ")[1].split()[0]
        assert httpx.get(f"{url}/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
        assert marker.read_text() == "saved"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_loads_the_tiny_model_as_train_does():
    from jaxrl_llm.cli.serve import load_served
    from jaxrl_llm.data import CharTokenizer

    m = load_served("tiny")
    assert m.name == "tiny" and m.source == "tiny"
    assert isinstance(m.tokenizer, CharTokenizer)
    assert m.config.vocab_size == CharTokenizer().vocab_size
    assert len(jax.tree_util.tree_leaves(m.params)) > 0


def test_serve_without_its_extra_is_one_line(monkeypatch, capsys):
    """A protocol whose extra is not installed still leaves every command working, and
    ``serve`` names the extra to install."""
    import importlib

    from jaxrl_llm.cli.main import main

    real = importlib.import_module

    def no_tinker(name, *a, **k):
        if name == "jaxrl_llm.serve.tinker":
            raise ModuleNotFoundError("No module named 'tinker'", name="tinker")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", no_tinker)
    assert main(["serve", "tinker", "--model", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "jaxrl-llm serve: error: serve tinker needs the module 'tinker': "
        "pip install 'jaxrl_llm[tinker]'"
    )

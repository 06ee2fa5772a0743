"""``jaxrl-llm serve tinker`` as a process: save_state / create_training_client_from_state /
load_state_with_optimizer round-trip the tenant, SIGTERM saves every tenant and exits 143,
``--resume`` brings them back under their model ids."""

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

KEY = "tml-cli-key"
SEQ = [3, 5, 7, 9, 11, 13]


def _datum():
    return types.Datum(
        model_input=types.ModelInput.from_ints(SEQ[:-1]),
        loss_fn_inputs={"target_tokens": SEQ[1:], "weights": [1.0] * (len(SEQ) - 1)},
    )


def _loss(tc):
    return tc.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]


def _tiny_dir(path):
    """The tiny model as a Hugging Face directory (config.json + model.safetensors)."""
    import jax
    from safetensors.numpy import save_file

    from jaxrl_llm import models
    from jaxrl_llm.interop.hf_config import hf_config_dict
    from jaxrl_llm.interop.state_dict import params_to_hf_state_dict

    config = models.ModelConfig.tiny()
    params = models.init_params(config, jax.random.PRNGKey(0))
    path.mkdir()
    save_file(params_to_hf_state_dict(params, config), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(hf_config_dict(config)))
    _word_tokenizer(config.vocab_size).save_pretrained(str(path))
    return path


def _word_tokenizer(vocab_size):
    """A word-level tokenizer: ``"t5 t7"`` -> ``[5, 7]``."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


class _Server:
    """``jaxrl-llm serve tinker --model DIR --model-name tiny`` on a free port; always
    stopped."""

    def __init__(self, model_dir, out_dir, *extra):
        args = ["serve", "tinker", "--model", str(model_dir), "--model-name", "tiny"]
        args += ["--port", "0", "--api-key", KEY]
        code = "import sys; from jaxrl_llm.cli.main import main; sys.exit(main(sys.argv[1:]))"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args, "--output-dir", str(out_dir), *extra],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        self.lines: list[str] = []
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r"serving tinker on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                return
        self.stop()
        raise AssertionError("server did not start:\n" + "".join(self.lines))

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.lines += self.proc.stderr.read().splitlines(keepends=True)
        return rc


@pytest.mark.slow
def test_save_load_sigterm_and_resume(tmp_path):
    os.environ["TINKER_TELEMETRY"] = "0"
    model_dir = _tiny_dir(tmp_path / "tiny")
    server = _Server(model_dir, tmp_path / "out")
    try:
        service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
        assert tc.get_tokenizer().encode("t5 t7") == [5, 7]  # get_info names the model's files
        tc.forward_backward([_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        trained = _loss(tc)
        path = tc.save_state("one").result().path
        assert path == f"tinker://{tc.model_id}/weights/one"
        listed = service.create_rest_client().list_checkpoints(tc.model_id).result()
        assert [c.tinker_path for c in listed.checkpoints] == [path]

        copy = service.create_training_client_from_state(path).result()
        assert copy.model_id != tc.model_id and _loss(copy) == trained
        # a second step from the same state with the optimizer restored: the same loss
        for client in (tc, copy):
            client.load_state_with_optimizer(path).result()
            client.forward_backward([_datum()], "cross_entropy").result()
            client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        stepped = _loss(tc)
        assert _loss(copy) == stepped and stepped < trained
        model_id = tc.model_id
        service.close("success").result(30)
    finally:
        rc = server.stop()
    assert rc == 143, "".join(server.lines)
    assert any("saved 2 tenants" in line for line in server.lines)

    again = _Server(model_dir, tmp_path / "out", "--resume")
    try:
        r = httpx.post(
            f"{again.url}/api/v1/get_info", json={"model_id": model_id}, headers={"X-API-Key": KEY}
        )
        assert r.status_code == 200 and r.json()["lora_rank"] == 4
        service = tinker.ServiceClient(base_url=again.url, api_key=KEY)
        last = service.create_training_client_from_state(f"tinker://{model_id}/weights/_last")
        np.testing.assert_equal(_loss(last.result()), stepped)
        service.close("success").result(30)
    finally:
        assert again.stop() == 143

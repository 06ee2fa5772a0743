"""The Tinker service driven by the unmodified ``tinker`` SDK (only ``base_url`` and the key
set): training steps equal jaxrl_llm's own SFT loss, sampler log-probs equal forward's,
tenants do not disturb each other, concurrent tenants share one step, the RL losses equal our
objectives, the custom loss path backpropagates the client's loss, bad inputs are one-sentence
4xx errors."""

import functools
import os
import threading

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from jaxrl_llm import models  # noqa: E402
from jaxrl_llm.losses.sft import sft_config, sft_loss  # noqa: E402
from jaxrl_llm.models.lora import LoRAConfig, attach_lora, init_lora  # noqa: E402
from jaxrl_llm.objectives import cispo_loss_parts, policy_loss_parts  # noqa: E402
from jaxrl_llm.serve import EngineLoop, ServerThread, make_app  # noqa: E402
from jaxrl_llm.serve.served import ServedModel  # noqa: E402
from jaxrl_llm.serve.tinker import build_state, protocol  # noqa: E402
from jaxrl_llm.serve.tinker.tenants import ALPHA, ATTN, MLP  # noqa: E402

KEY = "tml-test-key"
RANK = 4
LR = 1e-2
SEQ = [3, 5, 7, 9, 11, 13, 17, 19]
WEIGHTS = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, state, config, params) of a Tinker server on the tiny model."""
    os.environ["TINKER_TELEMETRY"] = "0"
    os.environ["TINKER_API_KEY"] = KEY
    cfg = models.ModelConfig.tiny()
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    loop = EngineLoop().start()
    state = build_state(
        ServedModel("tiny", cfg, params, None, "tiny"), loop, str(tmp_path_factory.mktemp("tk"))
    )
    try:
        with ServerThread(make_app([protocol(state)], api_key=KEY)) as s:
            yield s.url, state, cfg, params
    finally:
        loop.stop()


@pytest.fixture(scope="module")
def service(server):
    client = tinker.ServiceClient(base_url=server[0], api_key=KEY)
    try:
        yield client
    finally:
        client.close("success").result(
            30
        )  # finishes the session while the server is up: no stray heartbeats


def _client(service, seed):
    return service.create_lora_training_client(base_model="tiny", rank=RANK, seed=seed).result()


def _datum(seq=SEQ, weights=WEIGHTS):
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": seq[1:], "weights": weights},
    )


def _steps(tc, n, datum=None):
    losses = []
    for _ in range(n):
        fb = tc.forward_backward([datum or _datum()], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        losses.append(fb.result().metrics["loss:sum"])
        opt.result()
    return losses


def _sft_losses(cfg, params, n, seed=0):
    """The same steps through jaxrl_llm's SFT loss: weights shifted onto the full sequence,
    summed (loss_denominator 1), optax AdamW with the SDK's default betas / eps."""
    lora = LoRAConfig(rank=RANK, alpha=ALPHA, targets=ATTN + MLP)
    adapters = init_lora(cfg, lora, jax.random.PRNGKey(seed))
    opt = optax.adamw(LR, b1=0.9, b2=0.95, eps=1e-12, weight_decay=0.0)
    opt_state = opt.init(adapters)
    batch = {
        "input_ids": jnp.asarray([SEQ], jnp.int32),
        "attention_mask": jnp.ones((1, len(SEQ)), jnp.int32),
        "loss_mask": jnp.asarray([[0.0, *WEIGHTS]], jnp.float32),
        "loss_denominator": jnp.float32(1.0),
    }
    apply_fn = functools.partial(models.apply, config=cfg)

    def loss(ad):
        return sft_loss(
            attach_lora(params, ad, lora), batch, apply_fn=apply_fn, config=sft_config()
        )

    losses = []
    for _ in range(n):
        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(adapters)
        updates, opt_state = opt.update(grads, opt_state, adapters)
        adapters = optax.apply_updates(adapters, updates)
        losses.append(float(value))
    return losses


@pytest.mark.slow
def test_five_sdk_steps_equal_sft_and_sampler_logprobs_equal_forward(server, service):
    _, _, cfg, params = server
    tc = _client(service, 0)
    losses = _steps(tc, 5)
    np.testing.assert_allclose(losses, _sft_losses(cfg, params, 5), rtol=1e-5)
    assert losses[-1] < losses[0]

    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = [3, 5, 7]
    out = sampler.sample(
        types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, seed=3)
    ).result()
    assert len(out.sequences) == 2
    for seq in out.sequences:
        assert len(seq.tokens) == 6 and seq.stop_reason == "length"
        full = prompt + list(seq.tokens)
        fwd = tc.forward([_datum(full, [1.0] * (len(full) - 1))], "cross_entropy").result()
        forward_lp = np.asarray(fwd.loss_fn_outputs[0]["logprobs"].data)[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs, forward_lp, atol=1e-5)
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
        assert scored[0] is None
        np.testing.assert_allclose(scored[len(prompt) :], forward_lp, atol=1e-5)


@pytest.mark.slow
def test_two_tenants_interleaved_equal_their_solo_runs(server, service):
    other = _datum([2, 4, 6, 8, 10, 12, 14, 16], [1.0] * 7)
    solo_a = _steps(_client(service, 1), 3)
    solo_b = _steps(_client(service, 2), 3, other)
    a = _client(service, 1)
    b = _client(service, 2)
    both_a, both_b = [], []
    for _ in range(3):
        both_a += _steps(a, 1)
        both_b += _steps(b, 1, other)
    assert both_a == solo_a and both_b == solo_b


@pytest.mark.slow
def test_concurrent_tenants_run_in_one_step(server, service):
    _, state, _, _ = server
    a = _client(service, 5)
    b = _client(service, 6)
    solo = [c.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] for c in (a, b)]
    gate = threading.Event()
    blocker = state.loop.submit("tinker", lambda: gate.wait(60))
    before, steps_before = state.received, len(state.batcher.steps)
    futures = [c.forward([_datum()], "cross_entropy") for c in (a, b)]
    try:
        for _ in range(600):
            if state.received >= before + 2:
                break
            threading.Event().wait(0.05)
    finally:
        gate.set()
    blocker.result(60)
    together = [f.result().metrics["loss:sum"] for f in futures]
    assert state.batcher.steps[steps_before:] == [2]
    np.testing.assert_allclose(together, solo, rtol=1e-6)


@pytest.mark.slow
def test_rl_losses_equal_our_objectives(server, service):
    tc = _client(service, 7)
    rng = np.random.default_rng(0)
    n = len(SEQ) - 1
    sampled = (-4.6 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    adv = rng.standard_normal(n).astype(np.float32)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(SEQ[:-1]),
        loss_fn_inputs={"target_tokens": SEQ[1:], "logprobs": sampled, "advantages": adv},
    )
    for loss_fn, eps in (("importance_sampling", (np.inf, np.inf)), ("ppo", (0.2, 0.2))):
        out = tc.forward([datum], loss_fn).result()
        logp = np.asarray(out.loss_fn_outputs[0]["logprobs"].data, np.float32)[None]
        num, _, _ = policy_loss_parts(
            jnp.asarray(logp),
            jnp.asarray(sampled[None]),
            jnp.asarray(adv[None]),
            jnp.ones((1, n)),
            clip_eps=eps[0],
            clip_eps_high=eps[1],
        )
        np.testing.assert_allclose(out.metrics["loss:sum"], float(num), rtol=1e-5)
    out = tc.forward([datum], "cispo").result()
    num, _, _ = cispo_loss_parts(
        jnp.asarray(logp),
        jnp.asarray(sampled[None]),
        jnp.asarray(adv[None]),
        jnp.ones((1, n)),
        clip_eps_low=0.2,
        clip_eps_high=0.2,
    )
    np.testing.assert_allclose(out.metrics["loss:sum"], float(num), rtol=1e-5)
    dro = tc.forward([datum], "dro", loss_fn_config={"beta": 0.5}).result()
    want = -np.sum(adv * logp[0] - 0.25 * np.square(logp[0] - sampled))  # Tinker's formula
    np.testing.assert_allclose(dro.metrics["loss:sum"], want, rtol=1e-5)
    by_hand = -np.sum(np.exp(logp[0] - sampled) * adv)
    np.testing.assert_allclose(
        tc.forward([datum], "importance_sampling").result().metrics["loss:sum"],
        by_hand,
        rtol=1e-5,
    )


@pytest.mark.slow
def test_custom_loss_gives_the_gradient_of_the_clients_loss(server, service):
    import torch

    _, state, cfg, params = server
    tc = _client(service, 8)
    _steps(tc, 1)  # B != 0, so every adapter has a gradient
    coef = np.linspace(0.5, 1.5, len(SEQ) - 1).astype(np.float32)

    def client_loss(data, logprobs_list):
        lp = logprobs_list[0]
        loss = (torch.tensor(coef) * lp**2).sum()
        return loss, {"mine": float(loss.detach())}

    tenant = state.tenants[tc.model_id]
    adapters = tenant.adapters
    out = tc.forward_backward_custom([_datum()], client_loss).result()
    got = tenant.grads

    lora = tenant.lora

    def expected(ad):
        params_l = attach_lora(params, ad, lora)
        logits, _ = models.forward(params_l, jnp.asarray([SEQ[:-1]]), config=cfg)
        lp = jax.nn.log_softmax(logits[0], -1)[jnp.arange(len(SEQ) - 1), jnp.asarray(SEQ[1:])]
        return jnp.sum(jnp.asarray(coef) * lp**2)

    value, want = jax.value_and_grad(expected)(adapters)
    np.testing.assert_allclose(out.metrics["loss:sum"], float(value), rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_bad_inputs_are_clear_4xx_and_leave_other_tenants_alone(server, service):
    url, _, cfg, _ = server
    good = _client(service, 9)
    before = good.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]

    with pytest.raises(tinker.NotFoundError, match="unknown model 'nope'"):
        service.create_lora_training_client(base_model="nope", rank=RANK).result()
    cases = {
        "outside \\[0, 97\\)": _datum([3, 500, 7], [1.0, 1.0]),
        "more than the context": _datum(list(range(3, 3 + 300)), [1.0] * 299),
        "has shape \\[3\\], not \\[2\\]": _datum([3, 5, 7], [1.0, 1.0, 1.0]),
    }
    for message, datum in cases.items():
        with pytest.raises(tinker.BadRequestError, match=message):
            good.forward_backward([datum], "cross_entropy").result()

    h = {"X-API-Key": KEY}
    r = httpx.post(f"{url}/api/v1/retrieve_future", json={"request_id": "nope"}, headers=h)
    assert r.status_code == 404 and r.json()["detail"] == "unknown future 'nope'"
    r = httpx.post(f"{url}/api/v1/get_info", json={"model_id": "s:train:99"}, headers=h)
    assert r.status_code == 404 and "unknown model_id" in r.json()["detail"]
    r = httpx.post(f"{url}/api/v1/client/config", json={}, headers={"X-API-Key": "tml-wrong"})
    assert r.status_code == 401 and "wrong API key" in r.json()["detail"]
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=url, api_key="tml-wrong").get_server_capabilities()
    _unknown_loss(url, good.model_id)
    state = server[1]
    state.max_tenants, kept = len(state.tenants), state.max_tenants
    try:
        with pytest.raises(tinker.BadRequestError, match="maximum of .* tenants"):
            _client(service, 11)
    finally:
        state.max_tenants = kept

    after = good.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]
    assert after == before


def _unknown_loss(url, model_id):
    """A loss the server lacks (the SDK checks names itself, so send the proto directly)."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=1000, loss_fn="xyz")
    d = msg.data.add()
    d.model_input.add().encoded_text.tokens = np.asarray([3, 5], np.int32).tobytes()
    r = httpx.post(
        f"{url}/api/v1/forward_backward",
        content=msg.SerializeToString(),
        headers={"X-API-Key": KEY, "Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 400 and r.json()["detail"].startswith("loss_fn 'xyz' is not served")


@pytest.mark.slow
def test_padding_and_batch_neighbours_do_not_change_a_datum(server, service):
    tc = _client(service, 10)
    alone = tc.forward([_datum()], "cross_entropy").result()
    longer = _datum(list(range(3, 43)), [1.0] * 39)  # pads the batch to T = 64, B = 2
    both = tc.forward([_datum(), longer], "cross_entropy").result()
    np.testing.assert_allclose(
        both.loss_fn_outputs[0]["logprobs"].data,
        alone.loss_fn_outputs[0]["logprobs"].data,
        atol=1e-6,
    )
    assert len(both.loss_fn_outputs[1]["logprobs"].data) == 39

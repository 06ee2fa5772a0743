"""The Tinker wire format against the SDK's own encoders and decoders (no server): our
decoder reads what the SDK sends, the SDK's decoder reads what we answer."""

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import (  # noqa: E402
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from jaxrl_llm.serve.server import ServeError  # noqa: E402
from jaxrl_llm.serve.tinker import wire  # noqa: E402
from jaxrl_llm.serve.tinker.tenants import parse_path  # noqa: E402


def test_forward_backward_request_reads_what_the_sdk_writes():
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([3, 5, 7]),
            loss_fn_inputs={"target_tokens": [5, 7, 9], "weights": [0.0, 0.5, 1.0]},
        ),
        types.Datum(
            model_input=types.ModelInput.from_ints([4]),
            loss_fn_inputs={"target_tokens": [8], "logprobs": [-1.5], "advantages": [2.0]},
        ),
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}
        ),
        model_id="s:train:0",
        seq_id=3,
    )
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = True
    got = wire.decode_forward_backward(msg.SerializeToString(), None)
    assert (got.model_id, got.seq_id, got.loss_fn, got.forward_only) == (
        "s:train:0",
        3,
        "ppo",
        True,
    )
    assert got.loss_config == pytest.approx({"clip_low_threshold": 0.7})
    np.testing.assert_array_equal(got.data[0].tokens, [3, 5, 7])
    np.testing.assert_array_equal(got.data[0].inputs["target_tokens"], [5, 7, 9])
    np.testing.assert_allclose(got.data[0].inputs["weights"], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(got.data[1].inputs["advantages"], [2.0])
    with pytest.raises(ServeError, match="not a ForwardBackwardRequest"):
        wire.decode_forward_backward(b"\xff\xff\xff", None)


def test_outputs_are_read_back_by_the_sdk():
    outputs = [{"logprobs": np.array([-1.0, -2.0], np.float32)}, {"logprobs": np.array([-3.0])}]
    out = deserialize_forward_backward_output(
        wire.encode_forward_backward_output(outputs, {"loss:sum": 6.0})
    )
    assert out.metrics == {"loss:sum": 6.0}
    assert [o["logprobs"].data for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]

    seqs = [wire.Sampled(np.array([4, 2]), np.array([-0.5, -0.25]), True)]
    prompt = np.array([np.nan, -1.0], np.float32)
    sample = deserialize_sample_response(wire.encode_sample_response(seqs, prompt))
    assert sample.sequences[0].tokens == [4, 2] and sample.sequences[0].stop_reason == "stop"
    assert sample.sequences[0].logprobs == [-0.5, -0.25]
    assert sample.prompt_logprobs == [None, -1.0]


def test_checkpoint_paths():
    assert parse_path("tinker://s:train:0/weights/a") == ("s:train:0", "weights", "a")
    for bad in ("s/weights/a", "tinker://s/other/a", "tinker://s/weights/a/b"):
        with pytest.raises(ServeError, match="not a checkpoint path"):
            parse_path(bad)

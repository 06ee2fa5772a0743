"""The Tinker wire format: the binary (protobuf) bodies and the JSON shapes the SDK expects.

Learned from the SDK's own source (``tinker==0.38.0``: ``resources/``, ``proto/``,
``lib/api_future_impl.py``), not copied from it:

- ``POST /api/v1/forward_backward`` has a protobuf body (``ForwardBackwardRequest`` of
  ``tinker/proto/tinker_public.proto``), zstd-compressed only when the server's client config
  sets ``proto_compress_fwdbwd`` (we do not). Tokens are int32 bytes; each ``loss_fn_inputs``
  tensor is dense bytes (float32 or int64) with its shape.
- ``retrieve_future`` of a forward/backward or a sample must answer protobuf
  (``ForwardBackwardOutput``, ``SampleResponse``; the SDK refuses JSON for these two): per-datum
  outputs are one ``BatchedTensor`` per field (all datums' bytes concatenated, byte offsets),
  sampled tokens int32 bytes, log-probs float32 bytes.
- every other route is JSON; a pending future answers ``{"type": "try_again", ...}``, a failed
  one ``{"error": sentence, "category": "user"}``.

The message classes come from the SDK package (``tinker.proto.tinker_public_pb2``): the
schema is the SDK's, so the server needs ``pip install jaxrl_llm[tinker]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_llm.serve.server import ServeError

PROTO = "application/x-protobuf"


def _pb():
    try:
        from tinker.proto import tinker_public_pb2
    except ModuleNotFoundError as e:  # pragma: no cover - the extra is installed in tests
        raise ServeError(
            500, "the Tinker wire format needs the SDK's schema: pip install 'jaxrl_llm[tinker]'"
        ) from e
    return tinker_public_pb2


@dataclasses.dataclass(frozen=True)
class Datum:
    """One training example: ``tokens`` ``[T]`` int32 and ``inputs`` (name -> ``[T, ...]``)."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class FwdBwdRequest:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_config: dict[str, float]
    forward_only: bool
    data: list[Datum]


_NP_OF_DTYPE = {1: np.float32, 2: np.int64, 3: np.int32}


def _tensor(msg: Any, name: str) -> np.ndarray:
    np_dtype = _NP_OF_DTYPE.get(msg.dtype)
    if np_dtype is None:
        raise ServeError(400, f"loss_fn_inputs[{name!r}] has an unsupported dtype ({msg.dtype})")
    if msg.HasField("sparse_csr"):
        raise ServeError(400, f"loss_fn_inputs[{name!r}] is sparse; send dense tensors")
    arr = np.frombuffer(msg.dense, dtype=np_dtype)
    shape = tuple(msg.shape) or (arr.size,)
    if int(np.prod(shape)) != arr.size:
        raise ServeError(400, f"loss_fn_inputs[{name!r}] has {arr.size} values for shape {shape}")
    return arr.reshape(shape)


def decode_forward_backward(body: bytes, content_encoding: str | None) -> FwdBwdRequest:
    """The protobuf body of ``/api/v1/forward_backward`` as a :class:`FwdBwdRequest`."""
    if content_encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:
        raise ServeError(
            400, f"the forward_backward body is not a ForwardBackwardRequest: {e}"
        ) from e
    data = []
    for i, d in enumerate(msg.data):
        parts = []
        for chunk in d.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text" and chunk.ByteSize():
                raise ServeError(400, f"datum {i}: only token (encoded_text) inputs are served")
            parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
        tokens = np.concatenate(parts) if parts else np.zeros((0,), np.int32)
        inputs = {k: _tensor(v, k) for k, v in d.loss_fn_inputs.items()}
        data.append(Datum(tokens=tokens, inputs=inputs))
    config = {k: float(v.number) for k, v in msg.loss_fn_config_v2.items()}
    config = config or {k: float(v) for k, v in msg.loss_fn_config.items()}
    return FwdBwdRequest(
        msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data
    )


def encode_forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """Per-datum float32 outputs (same field names in every datum) and metrics as a
    ``ForwardBackwardOutput`` (one ``ArrayRecord``, one ``BatchedTensor`` per field)."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else ():
        arrays = [np.asarray(o[name], np.float32).reshape(-1) for o in outputs]
        bt = record.fields[name]
        bt.dtype = pb.DTYPE_FLOAT32
        bt.data = b"".join(a.tobytes() for a in arrays)
        bt.offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64).tobytes()
    return msg.SerializeToString()


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One sampled completion: its tokens, their log-probs and why it stopped."""

    tokens: np.ndarray
    logprobs: np.ndarray
    stopped: bool


def encode_sample_response(
    sequences: list[Sampled], prompt_logprobs: np.ndarray | None = None
) -> bytes:
    """Sampled sequences (and prompt log-probs, NaN at position 0) as a ``SampleResponse``."""
    pb = _pb()
    msg = pb.SampleResponse()
    for s in sequences:
        seq = msg.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s.tokens, np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return msg.SerializeToString()


def tokens_of(model_input: dict[str, Any], what: str) -> np.ndarray:
    """The token ids of a JSON ``ModelInput`` (``{"chunks": [{"tokens": [...]}, ...]}``)."""
    parts = []
    for chunk in model_input.get("chunks", []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ServeError(400, f"{what}: only token (encoded_text) inputs are served")
        parts.append(np.asarray(chunk.get("tokens", []), np.int64))
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros((0,), np.int32)


def try_again(request_id: str) -> dict[str, Any]:
    """The body of a future that is still running."""
    return {"type": "try_again", "request_id": request_id, "queue_state": "active"}


def failed(message: str) -> dict[str, Any]:
    """The body of a future that failed: the SDK raises ``RequestFailedError(message)``."""
    return {"error": message, "category": "user"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """A refused request: ``{"detail": sentence}``, which the SDK's ``APIStatusError`` shows."""
    return {"detail": message, "status": status}

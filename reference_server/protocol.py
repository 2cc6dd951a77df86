"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST) on the wire: tensors in JSON,
and Triton's binary tensor data extension.

A request body is JSON, or JSON followed by raw tensor bytes when the header
``Inference-Header-Content-Length`` gives the JSON's length; an input whose
``parameters.binary_data_size`` is set takes that many bytes, in input order. BYTES
tensors in binary are each element as a 4-byte little-endian length and the bytes.
Responses are JSON, or JSON plus binary outputs when the request asked for them
(``binary_data_output``, or ``binary_data`` on a requested output). Everything here is
pure: bytes in, arrays out, and a :class:`ProtocolError` with a message for bad input.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

DTYPES: dict[str, np.dtype | None] = {
    "BOOL": np.dtype(bool),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": None,  # variable-length elements: an object array of bytes
}


class ProtocolError(ValueError):
    """A request that does not follow the protocol or the model's metadata (HTTP 400)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model: name, datatype and shape (-1 for any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass
class InferRequest:
    """A decoded inference request."""

    id: str | None
    inputs: dict[str, np.ndarray]
    parameters: dict = field(default_factory=dict)
    outputs: list[dict] | None = None  # requested outputs, as sent

    def binary_output(self, name: str) -> bool:
        """Whether output ``name`` goes back as binary data."""
        for out in self.outputs or ():
            if out.get("name") == name:
                return bool((out.get("parameters") or {}).get("binary_data", False))
        return bool(self.parameters.get("binary_data_output", False))


def _bytes_elements(raw: bytes, count: int | None) -> np.ndarray:
    """Decode serialized BYTES elements (4-byte little-endian length, then the bytes)."""
    out, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ProtocolError("truncated BYTES element length")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ProtocolError("truncated BYTES element")
        out.append(raw[pos : pos + n])
        pos += n
        if count is not None and len(out) > count:  # walk no further than the shape allows
            raise ProtocolError(f"BYTES tensor has more than the {count} elements its shape needs")
    if count is not None and len(out) != count:
        raise ProtocolError(f"BYTES tensor has {len(out)} elements, shape needs {count}")
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def serialize_bytes(arr: np.ndarray) -> bytes:
    """BYTES elements to the binary wire format."""
    parts = []
    for x in arr.ravel():
        b = x if isinstance(x, bytes) else str(x).encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def _shape(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise ProtocolError(f"{what}: shape must be a list of non-negative integers")
    return tuple(value)


def _reject_constant(name: str):
    raise ProtocolError(f"body is not valid JSON: {name} is not a JSON number")


def _finite(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        raise ProtocolError(f"input {name!r}: values must be finite numbers")
    return arr


def _decode_tensor(
    t: dict, binary: memoryview | None, offset: int, max_elements: int | None = None
) -> tuple[str, np.ndarray, int]:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise ProtocolError("each input needs a name")
    name = t["name"]
    dtype_name = t.get("datatype")
    if dtype_name not in DTYPES:
        raise ProtocolError(f"input {name!r}: unknown datatype {dtype_name!r}")
    shape = _shape(t.get("shape"), f"input {name!r}")
    count = math.prod(shape) if shape else 1
    if max_elements is not None and count > max_elements:  # refused before a byte of it is decoded
        raise ProtocolError(
            f"input {name!r}: {count:,} elements exceed the {max_elements:,} a request may carry "
            "(a request carries 1..max_batch_size items)"
        )
    dtype = DTYPES[dtype_name]
    size = (t.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if binary is None or not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise ProtocolError(f"input {name!r}: binary_data_size {size!r} exceeds the binary data sent")
        raw = bytes(binary[offset : offset + size])
        offset += size
        if dtype is None:
            arr = _bytes_elements(raw, count)
        else:
            if size != count * dtype.itemsize:
                raise ProtocolError(f"input {name!r}: {size} bytes do not fit shape {list(shape)} of {dtype_name}")
            arr = _finite(name, np.frombuffer(raw, dtype=dtype))
    else:
        if "data" not in t:
            raise ProtocolError(f"input {name!r}: no data")
        flat = np.asarray(t["data"], dtype=object).ravel()
        if flat.size != count:
            raise ProtocolError(f"input {name!r}: {flat.size} values do not fit shape {list(shape)}")
        if dtype is None:
            arr = np.empty(count, dtype=object)
            arr[:] = [x.encode() if isinstance(x, str) else x for x in flat]
        else:
            try:
                arr = flat.astype(dtype)
            except (TypeError, ValueError, OverflowError):
                raise ProtocolError(f"input {name!r}: data is not {dtype_name} (or out of its range)") from None
            _finite(name, arr)
    return name, arr.reshape(shape), offset


def decode_request(body: bytes, header_length: str | None, max_elements: int | None = None) -> InferRequest:
    """Parse an inference request body (JSON, or JSON + binary tensors); a tensor of more
    than ``max_elements`` elements is refused before its data is decoded."""
    try:
        n = int(header_length) if header_length is not None else len(body)
    except ValueError:
        raise ProtocolError("Inference-Header-Content-Length is not an integer") from None
    if not 0 <= n <= len(body):
        raise ProtocolError("Inference-Header-Content-Length exceeds the body")
    try:
        doc = json.loads(body[:n], parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"body is not valid JSON: {err}") from None
    except RecursionError:
        raise ProtocolError("body is not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise ProtocolError("the request needs a non-empty 'inputs' list")
    binary = memoryview(body)[n:] if header_length is not None else None
    inputs, offset = {}, 0
    for t in doc["inputs"]:
        name, arr, offset = _decode_tensor(t, binary, offset, max_elements)
        if name in inputs:
            raise ProtocolError(f"input {name!r} given twice")
        inputs[name] = arr
    params = doc.get("parameters") or {}
    outputs = doc.get("outputs")
    if not isinstance(params, dict) or (outputs is not None and not isinstance(outputs, list)):
        raise ProtocolError("'parameters' must be an object and 'outputs' a list")
    if "binary_data_output" in params and not isinstance(params["binary_data_output"], bool):
        raise ProtocolError("'parameters.binary_data_output' must be true or false")
    for out in outputs or ():
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise ProtocolError("each requested output needs a name")
        p = out.get("parameters")
        if p is not None and not isinstance(p, dict):
            raise ProtocolError(f"output {out['name']!r}: 'parameters' must be an object")
        if p and "binary_data" in p and not isinstance(p["binary_data"], bool):
            raise ProtocolError(f"output {out['name']!r}: 'parameters.binary_data' must be true or false")
    rid = doc.get("id")
    return InferRequest(id=str(rid) if rid is not None else None, inputs=inputs, parameters=params, outputs=outputs)


def check_inputs(req: InferRequest, specs: list[TensorSpec]) -> None:
    """Every declared input present with its datatype and a matching shape; nothing else."""
    known = {s.name: s for s in specs}
    for name in req.inputs:
        if name not in known:
            raise ProtocolError(f"unexpected input {name!r}; the model takes {sorted(known)}")
    for spec in specs:
        if spec.name not in req.inputs:
            raise ProtocolError(f"missing input {spec.name!r}")
        arr = req.inputs[spec.name]
        dtype = DTYPES[spec.datatype]
        if (dtype is None) != (arr.dtype == object) or (dtype is not None and arr.dtype != dtype):
            raise ProtocolError(f"input {spec.name!r} must be {spec.datatype}")
        if len(arr.shape) != len(spec.shape) or any(
            want != -1 and want != got for want, got in zip(spec.shape, arr.shape, strict=True)
        ):
            raise ProtocolError(f"input {spec.name!r} has shape {list(arr.shape)}; the model takes {list(spec.shape)}")


def check_outputs(req: InferRequest, specs: list[TensorSpec]) -> None:
    """Every requested output exists: checked before inference, so a bad name is a 400
    that never counts as a success."""
    known = {s.name for s in specs}
    for out in req.outputs or ():
        if out["name"] not in known:
            raise ProtocolError(f"unknown output {out['name']!r}; the model has {sorted(known)}")


def _json_values(arr: np.ndarray) -> list:
    """Output values for JSON: bytes as text, and a non-finite float as null (NaN and
    Infinity are not JSON; strict parsers refuse them)."""
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return [x if math.isfinite(x) else None for x in arr.ravel().tolist()]
    return [x.decode() if isinstance(x, bytes) else x for x in arr.ravel().tolist()]


def encode_response(
    model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray], specs: list[TensorSpec], params: dict
) -> tuple[bytes, int | None]:
    """The response body and, with binary outputs, the JSON header's length."""
    wanted = [o.get("name") for o in req.outputs] if req.outputs else [s.name for s in specs]
    known = {s.name: s for s in specs}
    for name in wanted:
        if name not in known:
            raise ProtocolError(f"unknown output {name!r}; the model has {sorted(known)}")
    tensors, blobs = [], []
    for name in wanted:
        arr = outputs[name]
        spec = known[name]
        t = {"name": name, "datatype": spec.datatype, "shape": list(arr.shape)}
        if req.binary_output(name):
            raw = serialize_bytes(arr) if spec.datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            t["data"] = _json_values(arr)
        tensors.append(t)
    doc = {"model_name": model, "model_version": version, "outputs": tensors, "parameters": params}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc, allow_nan=False).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)

"""Request bodies for the load generator: Open Inference Protocol requests, built once
before a level and sent as they are (binary tensors for images, JSON for the ranker)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Payload:
    """A ready-to-send request body and its headers."""

    body: bytes
    headers: dict


def bytes_payload(raw: bytes, count: int, name: str = "image") -> Payload:
    """One binary-tensor request: ``raw`` serialized BYTES elements as a [count, 1] input."""
    head = json.dumps(
        {
            "inputs": [
                {"name": name, "datatype": "BYTES", "shape": [count, 1], "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    return Payload(head + raw, {"Inference-Header-Content-Length": str(len(head))})


def image_payloads(count: int, side: int, rng: np.random.Generator) -> list[Payload]:
    """Binary-tensor requests of one JPEG each, for the resnet model."""
    from reference_server.models import jpeg
    from reference_server.protocol import serialize_bytes

    return [bytes_payload(serialize_bytes(np.array([jpeg(rng, side=side)], dtype=object)), 1) for _ in range(count)]


def ranker_payloads(count: int, dense: int, entities: int, rng: np.random.Generator) -> list[Payload]:
    """JSON requests of one item each for the ranker fed from the feature store."""
    out = []
    for _ in range(count):
        doc = {
            "inputs": [
                {"name": "dense", "datatype": "FP32", "shape": [1, dense], "data": rng.standard_normal(dense).tolist()},
                {"name": "entity", "datatype": "INT64", "shape": [1, 1], "data": [int(rng.integers(0, entities))]},
            ]
        }
        out.append(Payload(json.dumps(doc).encode(), {"Content-Type": "application/json"}))
    return out

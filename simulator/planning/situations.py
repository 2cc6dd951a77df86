"""The interview trainer's situations and steps: the seed articles' systems, the numbers
drawn for each attempt, and the napkin steps a candidate estimates (data only, so the
command line can list them without loading the simulator; :mod:`simulator.planning.practice`
asks, checks and reveals)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@dataclass(frozen=True)
class Knob:
    """A number drawn for each attempt: uniform in [lo, hi], rounded to ``step``."""

    path: str
    lo: float
    hi: float
    step: float

    def draw(self, rng: np.random.Generator) -> float:
        x = round(rng.uniform(self.lo, self.hi) / self.step) * self.step
        return float(round(x, 6))


@dataclass(frozen=True)
class Situation:
    """A seed system: its scenario file, the story (a template over the givens), and the
    numbers drawn afresh each attempt."""

    file: str
    title: str
    story: str
    knobs: tuple[Knob, ...]


SITUATIONS: dict[str, Situation] = {
    "platform": Situation(
        "inference_platform.yaml",
        "A shared inference platform",
        "A shared inference platform takes {rate} at peak. Each request sends {payload_kb} KB and gets "
        "{response_kb} KB back. On one {gpu} worker the model runs a batch of {batch} in {batch_ms} ms. "
        "Requests must come back within {target} at p{percentile}. A worker costs {price} an hour, and "
        "the fleet keeps {headroom} headroom over the bare need.",
        (
            Knob("traffic.rate_rps", 120_000, 300_000, 10_000),
            Knob("traffic.payload_kb", 4, 16, 1),
            Knob("traffic.response_kb", 0.5, 2, 0.5),
            Knob("workers.service_time.base_ms", 3, 6, 0.5),
            Knob("workers.service_time.per_item_ms", 0.15, 0.35, 0.05),
            Knob("sla.target_ms", 100, 200, 10),
        ),
    ),
    "recsys_feature_fetch": Situation(
        "recsys_feature_fetch.yaml",
        "A recommendation ranker's feature fetch",
        "A recommendation ranker serves {rate}. Before scoring, each request reads {lookups} features "
        "from a key-value store, {per_trip} keys per round trip with {parallel} round trips in flight; "
        "a round trip takes about {trip_ms} ms (median). On one {gpu} worker the ranker scores a batch of "
        "{batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. A worker costs {price} an hour; "
        "keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 100, 400, 20),
            Knob("features.lookups_per_request", 200, 1000, 100),
            Knob("features.batch_size", 1, 10, 1),
            Knob("workers.service_time.base_ms", 12, 24, 2),
            Knob("sla.target_ms", 150, 300, 25),
        ),
    ),
    "vision_preprocessing": Situation(
        "vision_preprocessing.yaml",
        "An image model behind CPU decoding",
        "An image classifier receives {rate} of {payload_kb} KB JPEGs over a {bandwidth} link. Each image is "
        "decoded and resized on the CPU in about {pre_ms} ms, on {cpu_workers} CPU workers. On one {gpu} the "
        "model runs a batch of {batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. A GPU worker "
        "costs {price} an hour; keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 20, 45, 5),
            Knob("traffic.payload_kb", 100, 200, 25),
            Knob("preprocess.service.mean_ms", 25, 50, 5),
            Knob("preprocess.cpu_workers", 3, 6, 1),
            Knob("workers.service_time.base_ms", 10, 20, 2),
            Knob("sla.target_ms", 150, 300, 25),
        ),
    ),
    "cv_degradation": Situation(
        "cv_degradation.yaml",
        "A CV classifier near its limit",
        "A CV classifier gets {rate_per_min} requests a minute ({rate}) of {payload_kb} KB images. On one "
        "{gpu} worker the model runs a batch of {batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. "
        "A worker costs {price} an hour; keep {headroom} headroom. Traffic is about to grow by 15%: what "
        "fleet do you want before it does?",
        (
            Knob("traffic.rate_rps", 120, 240, 10),
            Knob("workers.service_time.base_ms", 18, 30, 2),
            Knob("workers.service_time.per_item_ms", 5, 9, 0.5),
            Knob("sla.target_ms", 200, 400, 25),
        ),
    ),
    "recsys_under_load": Situation(
        "recsys_under_load.yaml",
        "A ranking service under load",
        "A ranking service has {users} concurrent users, each sending a request every {think_s} s on "
        "average ({rate} by Little's law). Each request reads {lookups} features in round trips of "
        "{per_trip} keys. On one {gpu} worker the ranker scores a batch of {batch} in {batch_ms} ms. The SLA "
        "is p{percentile} ≤ {target}. A worker costs {price} an hour; keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 5_000, 20_000, 1_000),
            Knob("workers.service_time.base_ms", 8, 16, 1),
            Knob("workers.service_time.per_item_ms", 0.4, 1.0, 0.1),
            Knob("sla.target_ms", 100, 200, 10),
        ),
    ),
}


@dataclass(frozen=True)
class Step:
    """One napkin step the candidate estimates: the napkin line it is checked against
    (``quantity``), its unit and the relative tolerance."""

    key: str
    prompt: str
    quantity: str
    unit: str
    tolerance: float = 0.1


STEPS: tuple[Step, ...] = (
    Step("peak_rps", "peak request rate", "peak request rate", "req/s"),
    Step("ingress_gbps", "bandwidth in", "ingress bandwidth", "Gbit/s"),
    Step("egress_gbps", "bandwidth out", "egress bandwidth", "Gbit/s"),
    Step("batches_per_s", "batches per second (at the batch given)", "batches per second", "batches/s"),
    Step("per_worker_rps", "per-worker throughput", "per-worker throughput", "req/s"),
    Step("workers", "workers, bare", "workers", "workers"),
    Step("workers_headroom", "workers with the headroom", "workers with headroom", "workers"),
    Step("cost_per_hour", "cost per hour, with headroom", "cost with headroom", "USD/h"),
)

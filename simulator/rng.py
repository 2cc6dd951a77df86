"""Random streams: one ``numpy.random.Generator`` per purpose, all from one seed.

``SeedSequence(seed).spawn`` gives independent children; a stream's position among the
fields of :class:`Streams` fixes its seed, so new streams are appended and existing
scenarios keep their numbers. Variants of a scenario share their random inputs (common
random numbers), and because each purpose draws from its own stream, changing one knob
moves only the draws that knob owns: a larger shadow share copies more requests and
routes more copies, but the canary's users, routing and errors stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

Generator = np.random.Generator


@dataclass(frozen=True)
class Streams:
    """One independent generator per purpose; append new fields only (position = seed)."""

    arrivals: Generator  # inter-arrival times and traffic classes of the arrivals
    network_in: Generator  # client → API latency
    network_out: Generator  # API → client latency
    router: Generator  # the router's overhead
    features: Generator  # feature-store round trips
    preprocess: Generator  # preprocessing service times
    service: Generator  # the primary pool's batch service times
    postprocess: Generator  # postprocessing service times
    routing: Generator  # the primary pool's request → worker assignment
    result_cache: Generator  # result-cache keys
    feature_cache: Generator  # feature-cache keys
    fleet: Generator  # cold starts, crashes
    versions: Generator  # the canary's users
    canary_service: Generator  # the canary pool's batch service times
    shadow_service: Generator  # a dedicated shadow pool's batch service times
    classes: Generator  # per traffic class: service times and own-pool routing (spawned)
    shadow_copies: Generator  # which primary requests the shadow copies
    shadow_routing: Generator  # the shadow copies' worker assignment
    canary_routing: Generator  # the canary pool's worker assignment
    canary_errors: Generator  # which canary answers fail
    speed: Generator  # the platform's speed paths (a child per host or worker)
    tokens: Generator  # LLM requests' prompt and output lengths and prefix groups (a child each)
    steps: Generator  # LLM replicas' step-time noise (a child per replica)


STREAMS = tuple(f.name for f in fields(Streams))


def child(rng: Generator, k: int) -> Generator:
    """The ``k``-th child stream of ``rng``'s seed: the same generator whatever ``rng`` has
    drawn, and independent of it (a purpose's sub-streams, such as each batch queue's
    service times or a cache's hit and miss latencies)."""
    seq = rng.bit_generator.seed_seq
    return np.random.default_rng(
        np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, k), pool_size=seq.pool_size)
    )


def streams(seed: int) -> Streams:
    """One independent generator per purpose, all from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return Streams(*(np.random.default_rng(c) for c in children))

"""Random streams: one ``numpy.random.Generator`` per part of the model, all from one seed.

``SeedSequence(seed).spawn`` gives independent children; each stream's position in
:data:`STREAMS` fixes its seed, so new streams are appended and existing scenarios keep
their numbers. Variants of a scenario share their random inputs (common random numbers).
"""

from __future__ import annotations

import numpy as np

STREAMS = (  # append only: a stream's position fixes its seed
    "arrivals",
    "network_in",
    "network_out",
    "router",
    "features",
    "preprocess",
    "service",
    "postprocess",
    "routing",
    "result_cache",
    "feature_cache",
    "fleet",
    "versions",
    "canary_service",
    "shadow_service",
    "classes",
)


def streams(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per stage, all from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(s) for name, s in zip(STREAMS, children, strict=True)}

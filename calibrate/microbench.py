"""Forward time per batch size, in-process, after warm-up: the model alone, no server.

On a GPU each forward is timed with CUDA events (the GPU's own clock, so host jitter does
not leak in); on the CPU with ``perf_counter_ns``.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, … up to and including ``max_batch``."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def microbench(
    model_cfg, precisions: list[str], max_batch: int, *, repeats: int = 30, warmup: int = 5, seed: int = 0
) -> pd.DataFrame:
    """p50/p95/p99/mean forward time (ms) per precision and batch size."""
    import torch

    from reference_server.models import ServedModel

    rng = np.random.default_rng(seed)
    rows = []
    for precision in precisions:
        model_cfg.precision = precision
        model = ServedModel(model_cfg)
        cuda = model.device.type == "cuda"
        for b in batch_sizes(max_batch):
            batch = model.collate(model.example(b, rng))
            for _ in range(warmup):
                model.forward(batch)
            times = []
            for _ in range(repeats):
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    model.forward(batch)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter_ns()
                    model.forward(batch)
                    times.append((time.perf_counter_ns() - t0) / 1e6)
            t = np.asarray(times)
            rows.append(
                {
                    "precision": precision,
                    "batch_size": b,
                    "device": str(model.device),
                    "p50_ms": float(np.percentile(t, 50)),
                    "p95_ms": float(np.percentile(t, 95)),
                    "p99_ms": float(np.percentile(t, 99)),
                    "mean_ms": float(t.mean()),
                    "per_item_ms": float(t.mean() / b),
                }
            )
    return pd.DataFrame(rows)

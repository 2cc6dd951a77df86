"""Calibrating from a Triton deployment without our server: its statistics and perf_analyzer.

* Triton's ``/v2/models/{m}/stats`` JSON has, per batch size, the count and total ns of
  compute_input, compute_infer and compute_output: the mean batch service time per size,
  from which the affine model is fitted (weighted by how many batches each size ran).
* perf_analyzer's CSV (``-f``) has one row per concurrency or request rate with
  throughput and p50/p90/p95/p99 client latency in microseconds: measured levels for
  ``calibrate validate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd


def triton_batch_times(stats: dict, model: str | None = None) -> pd.DataFrame:
    """Mean batch service time (ms) and batch count per batch size from Triton's stats JSON."""
    models = stats.get("model_stats")
    if not isinstance(models, list) or not models:
        raise ValueError("not Triton statistics: no 'model_stats' list")
    entry = next((m for m in models if model is None or m.get("name") == model), None)
    if entry is None:
        raise ValueError(f"model {model!r} not in the statistics ({[m.get('name') for m in models]})")
    rows = []
    for b in entry.get("batch_stats", []):
        n = int(b["compute_infer"]["count"])
        if n == 0:
            continue
        ns = sum(int(b[k]["ns"]) for k in ("compute_input", "compute_infer", "compute_output"))
        rows.append({"batch_size": int(b["batch_size"]), "batches": n, "service_ms": ns / n / 1e6})
    if not rows:
        raise ValueError("the statistics hold no batch_stats with executions")
    return pd.DataFrame(rows)


def affine_from_triton(stats: dict, model: str | None = None) -> dict:
    """Affine batch service time fitted to Triton's per-size means (weighted least squares)."""
    df = triton_batch_times(stats, model)
    b, y, w = df["batch_size"].to_numpy(float), df["service_ms"].to_numpy(), df["batches"].to_numpy(float)
    if len(df) == 1:
        return {"kind": "affine", "base_ms": 0.0, "per_item_ms": float(y[0] / b[0]), "noise_cv": 0.0}
    per, base = np.polyfit(b, y, 1, w=np.sqrt(w))
    return {"kind": "affine", "base_ms": float(max(base, 0.0)), "per_item_ms": float(per), "noise_cv": 0.0}


PERF_ANALYZER_COLUMNS = {
    "Inferences/Second": "achieved_rps",
    "p50 latency": "p50_ms",
    "p95 latency": "p95_ms",
    "p99 latency": "p99_ms",
}


def perf_analyzer_levels(path: str | Path) -> pd.DataFrame:
    """Measured levels from perf_analyzer's ``-f`` CSV (latencies in us → ms)."""
    df = pd.read_csv(path)
    missing = [c for c in PERF_ANALYZER_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a perf_analyzer CSV (missing columns {missing})")
    out = df[list(PERF_ANALYZER_COLUMNS)].rename(columns=PERF_ANALYZER_COLUMNS)
    for c in ("p50_ms", "p95_ms", "p99_ms"):
        out[c] = out[c] / 1000.0
    key = "Request Rate" if "Request Rate" in df.columns else None
    out["offered_rps"] = df[key] if key else out["achieved_rps"]
    out["level"] = range(len(out))
    return out


def load_stats(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())

"""Predicted against measured: simulate each measured load level with a calibration profile.

The scenario is generated from the profile and the server's own configuration (as its
``/v2/models/{m}/config`` reported it): the request overhead as the router's delay,
preprocessing on one CPU thread (FCFS, as the server runs it), the dynamic batcher's
settings, and the fitted batch service time on the server's model instances, all
sharing one queue.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.config import Scenario
from simulator.engine import simulate
from simulator.metrics import window


def _dist(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k != "fit"}


def scenario_from_profile(profile: dict, rate_rps: float, *, duration_s: float, seed: int = 0) -> Scenario:
    """A scenario of the calibrated server under Poisson load at ``rate_rps``."""
    server = profile["server"]
    st = profile["service_time"]
    features = {}
    if "features" in profile:
        f = profile["features"]
        features = {k: f[k] for k in ("lookups_per_request", "batch_size", "parallelism")}
        if "store" in f:  # round trips queue for the server's event loop: a one-thread station
            features["store"] = f["store"]
        else:
            features["round_trip"] = _dist(f["round_trip"])
    return Scenario.model_validate(
        {
            "features": features,
            "name": f"calibrated-{profile['model']['kind']}",
            "seed": seed,
            "duration_s": duration_s,
            "warmup_s": min(2.0, duration_s / 10),
            "sla": {"percentile": 99, "target_ms": 1000},
            "traffic": {"rate_rps": rate_rps},
            "router": {"overhead": _dist(profile["stages"]["overhead"]), "balancing": "shared"},
            "preprocess": {
                "service": _dist(profile["stages"]["preprocess"]),
                "cpu_workers": server["preprocess_threads"],
            },
            "batching": {
                "max_batch_size": server["max_batch_size"],
                "max_queue_delay_ms": server["max_queue_delay_ms"],
                "max_queue_size": server["max_queue_size"],
            },
            "workers": {
                "count": 1,
                "instances": server["instances"],
                "service_time": {k: v for k, v in st.items() if k not in ("r2", "batches")},
            },
            "postprocess": {"service": _dist(profile["stages"]["postprocess"])},
            "cost": {"price_per_hour_usd": 1.0},
        }
    )


def predict(profile: dict, rate_rps: float, *, duration_s: float = 120.0, seed: int = 0) -> dict[str, float]:
    """Simulated end-to-end p50/p95/p99 (ms) at ``rate_rps``."""
    s = scenario_from_profile(profile, rate_rps, duration_s=duration_s, seed=seed)
    run = simulate(s)
    rec = run.records
    done = window(rec, s) & rec.completed
    e2e = (rec.t_response - rec.arrival)[done]
    p50, p95, p99 = np.percentile(e2e, [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99)}


def compare(profile: dict, measured: pd.DataFrame, *, duration_s: float = 120.0) -> pd.DataFrame:
    """One row per level and percentile: measured, predicted, error %."""
    rows = []
    for _, m in measured.iterrows():
        pred = predict(profile, float(m["offered_rps"]), duration_s=duration_s, seed=int(m["level"]))
        for q in ("p50", "p95", "p99"):
            meas = float(m[f"{q}_ms"])
            rows.append(
                {
                    "level": int(m["level"]),
                    "offered_rps": float(m["offered_rps"]),
                    "load": float(m.get("load", np.nan)),
                    "held_out": bool(m.get("held_out", False)),
                    "percentile": q,
                    "measured_ms": meas,
                    "predicted_ms": pred[f"{q}_ms"],
                    "error_pct": (pred[f"{q}_ms"] - meas) / meas * 100.0,
                }
            )
    return pd.DataFrame(rows)


def chart(table: pd.DataFrame, path) -> None:
    """Measured against predicted latency per load level, as a PNG (Altair + vl-convert)."""
    import altair as alt

    long = table.melt(
        id_vars=["offered_rps", "percentile"], value_vars=["measured_ms", "predicted_ms"], var_name="source"
    )
    long["source"] = long["source"].str.replace("_ms", "")
    c = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=alt.X("offered_rps:Q", title="offered load (req/s)"),
            y=alt.Y("value:Q", title="latency (ms)", scale=alt.Scale(type="log")),
            color=alt.Color("percentile:N"),
            strokeDash=alt.StrokeDash("source:N"),
        )
        .properties(width=520, height=320, title="measured vs predicted latency")
    )
    c.save(str(path), format="png")

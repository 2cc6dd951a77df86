"""What the twin's test can tell apart (calibrate/README, "The LLM twin"): the slow test's
protocol run against a simulated engine that *is* the twin's model, so that the twin is
correct by construction and every error it makes is the protocol's noise.

Each replication simulates one engine with the calibrated scenario (its step time and its
host's speed process) on a fresh seed: ``--half-s`` seconds at half the knee, then the
test's ramp (60% to 150% of the knee in 10 s steps), as one open-loop run. The twin reads
what /metrics would have shown every 4 s of the half-load phase
(:func:`calibrate.vllm_metrics.scrapes_of`) and announces its breaking rate (TTFT p99 over
250 ms, as 10 s windows measure it); the ramp's crossing is found as the test finds it (the
isotonic fit of the steps' p99). Printed: each replication's speed factor, announcement,
crossing and error; then how often one ramp lands within 15%, how often three do (the
issue's bar), and how often three pass the test's rule (the median within 15%, each within
25%), with binomial intervals; and how the error follows the half-load window's speed.

    python calibrate/experiments/llm_twin_target.py [--reps 24] [--half-s 24] [--step-s 10] [--profile DIR]

The default profile is a shortened calibration's, as the test makes (set I's, kept in
``data/llm-short-setI``): about 30 s a replication at the test's design. The full
``calibrate/profiles/cpu-tiny-llm`` takes far longer (its 15 s speed component makes each of
the twin's predictions 303 s of simulation: 14 s at 11 req/s here).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from twin_engine import profile_engine

from calibrate.headroom import monotone_crossing
from calibrate.vllm_metrics import scrapes_of
from calibrate.watch_llm import LLMTwin
from simulator import simulate
from simulator.scenario.config import Scenario

SLA_MS, Q, SCRAPE_S = 250.0, 99.0, 4.0
RAMP = [0.6 + 0.05 * k for k in range(19)]  # the slow test's: 60% to 150% of the knee


def one(base: dict, knee: float, info: dict, half_s: float, step_s: float, seed: int) -> dict:
    doc = json.loads(json.dumps(base))
    steps = [{"at_s": 0.0, "rate_rps": 0.5 * knee}]
    steps += [{"at_s": half_s + k * step_s, "rate_rps": f * knee} for k, f in enumerate(RAMP)]
    traffic = {k: v for k, v in doc["traffic"].items() if k not in ("rate_rps", "shape")}
    doc["traffic"] = {**traffic, "shape": {"kind": "steps", "steps": steps}}
    doc["duration_s"] = half_s + len(RAMP) * step_s
    doc["warmup_s"] = 0.0
    doc.pop("autoscaler", None)
    r = simulate(Scenario.model_validate(doc), seed=seed).records
    # the twin, fed the first and the last scrape of the half-load phase (as the test feeds it)
    n = round(half_s / SCRAPE_S)
    scrapes = scrapes_of(r, SCRAPE_S, n, info)
    twin = LLMTwin(base, info, ttft_sla=(Q, SLA_MS), window=n, sla_window_s=step_s)
    rows = [x for x in (twin.update(s) for s in (scrapes[0], scrapes[-1])) if x is not None]
    # the ramp's steps, from each step's second second on, as the test takes them
    ttft = np.where(np.isfinite(r.t_first_token), r.t_first_token - r.arrival, 1e7)
    steps_p = []
    for k, f in enumerate(RAMP):
        t0 = (half_s + k * step_s + 1.0) * 1e3
        sel = (r.arrival >= t0) & (r.arrival < (half_s + (k + 1) * step_s) * 1e3)
        steps_p.append((f * knee, float(np.percentile(ttft[sel], Q)) if sel.any() else 1e7))
    crossed = monotone_crossing(steps_p, SLA_MS)
    announced = rows[-1]["breaking_rate_rps"]
    return {
        "seed": seed,
        "speed_factor": rows[-1]["speed_factor"],
        "announced": announced,
        "crossed": crossed,
        "error": announced / crossed - 1,
    }


def wilson(k: int, n: int) -> str:
    lo, hi = stats.binomtest(k, n).proportion_ci(method="wilson")
    return f"{k}/{n} ({k / n:.0%}; 95% {lo:.0%}-{hi:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=str(Path(__file__).parent / "data/llm-short-setI"))
    ap.add_argument("--reps", type=int, default=24)
    ap.add_argument("--half-s", type=float, default=24.0, help="the half-load phase the twin reads (the test's: 24)")
    ap.add_argument("--step-s", type=float, default=10.0, help="the ramp's steps and the twin's SLA window (test: 10)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.reps < 3:
        ap.error("--reps: at least 3 (the figures are over triples of ramps)")
    folder = Path(a.profile)
    base, knee, info = profile_engine(folder)
    print(  # noqa: T201
        f"{folder}: knee {knee:.2f} req/s; half load {a.half_s:g} s; steps {a.step_s:g} s; {a.reps} replications",
        flush=True,
    )
    out = []
    for i in range(a.reps):
        t = time.perf_counter()
        got = one(base, knee, info, a.half_s, a.step_s, seed=1000 * a.seed + i)
        out.append(got)
        print(  # noqa: T201
            f"  {i + 1:2d}: speed {got['speed_factor']:.3f} announced {got['announced']:.2f} "
            f"crossed {got['crossed']:.2f} ({got['error']:+.1%})  {time.perf_counter() - t:.0f} s",
            flush=True,
        )
    df = pd.DataFrame(out)
    e = df["error"].to_numpy()
    print(  # noqa: T201
        f"error: mean {e.mean():+.1%}, sd {e.std(ddof=1):.1%}, median {np.median(e):+.1%}"
    )
    within = {b: wilson(int((abs(e) <= b).sum()), len(e)) for b in (0.05, 0.15)}
    print(  # noqa: T201
        f"one ramp within 15%: {within[0.15]}; within 5%: {within[0.05]}"
    )
    triples = list(itertools.combinations(range(len(e)), 3))
    issue = sum(all(abs(e[j]) <= 0.15 for j in t) for t in triples)
    rule = sum(abs(np.median(e[list(t)])) <= 0.15 and max(abs(e[list(t)])) <= 0.25 for t in triples)
    print(  # noqa: T201
        f"of {len(triples)} triples: every ramp within 15% (the issue's) {issue / len(triples):.1%}; "
        f"the test's rule (median 15%, each 25%) {rule / len(triples):.1%}"
    )
    spread = {k: df[k].std(ddof=1) / df[k].mean() for k in ("announced", "crossed", "speed_factor")}
    print(  # noqa: T201
        f"spread (sd over mean): announced {spread['announced']:.1%}, crossed {spread['crossed']:.1%}, "
        f"speed factor {spread['speed_factor']:.1%} (mean {df['speed_factor'].mean():.3f})"
    )
    lf, le = np.log(df["speed_factor"]), np.log1p(df["error"])
    fit = stats.linregress(lf, le)
    print(  # noqa: T201
        f"log error against log speed factor: slope {fit.slope:.2f}, r {fit.rvalue:.2f}; "
        f"speed factor sd {lf.std(ddof=1):.3f} (log)"
    )


if __name__ == "__main__":
    main()

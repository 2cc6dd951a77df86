"""How long the ranker's loop lets new requests in before a handler whose fetch is back
(``preprocess.event_loop.reads_first_ms``), fitted by simulation (calibrate/README, "Reads
first, for a while").

On the reference server a Redis reply's continuation passes the loop's ready queue a few
times before its handler runs again, and at each pass the requests that arrived meanwhile
are read first; in a burst the first requests' fetches end late. The model's loop takes its
jobs in the order they became ready unless ``reads_first`` holds a resumption while any
request waits to be read, which near the loop's full rate starves it; ``reads_first_ms``
bounds that wait. The bound is fitted on the fitted levels' own fetch times
(``feature_us``, from the handler's send to its turn after the reply): for each hold in
:data:`HOLDS`, the profile simulated at each fitted level, the fetch as the server times it
(a light-load round trip drawn, then the wait from the reply to the handler's turn), and
the hold whose p90s come closest (sum of squared log ratios). Past 3-4 ms the p90 no
longer tells the holds apart (the bursts' waits are all inside it), so the fit takes the
shortest hold within :data:`KNEE` and :data:`NOISE` of the least error; the p99 is left
out because at the highest fitted level it holds the slow episodes, which no order of the
loop's jobs makes.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd

# the holds tried, ms: 0 is the order ready, inf no bound (reads first while any waits)
HOLDS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, math.inf)
# the shortest hold whose error is within KNEE × the least + NOISE (a p90 4% off at each of
# three levels; fetch times made by the model itself at another seed, 10 s a level, leave
# 0.003-0.006 at their own hold)
KNEE, NOISE = 1.1, 0.005


def with_hold(profile: dict, hold: float) -> dict:
    """A copy of ``profile`` whose loop reads first for ``hold`` ms (0: in the order
    ready; inf: while any request waits)."""
    out = copy.deepcopy(profile)
    out["frontend"]["event_loop"]["reads_first"] = {"hold_ms": None if hold == math.inf else float(hold)}
    return out


def fetch_times(profile: dict, rate: float, hold: float, *, seed: int = 31, secs: float = 40.0) -> np.ndarray:
    """The model's fetches at ``rate`` with reads first for ``hold`` ms, as the server times
    them (ms): a light-load round trip drawn, then the simulated wait from the reply to the
    handler's turn (the resumption's own time left out)."""
    from calibrate.scenario import scenario_dict
    from simulator.engine import simulate
    from simulator.results.metrics import window
    from simulator.scenario.config import Scenario

    doc = scenario_dict(with_hold(profile, hold), rate, duration_s=secs, warmup_s=2.0, seed=seed)
    s = Scenario.model_validate(doc)
    rec = simulate(s).records
    w = window(rec, s) & rec.completed
    resume = doc["preprocess"]["event_loop"]["resume_ms"]
    light = np.asarray(profile["features"]["light_round_trip"]["samples_ms"])
    drawn = np.random.default_rng(seed).choice(light, int(w.sum()))
    return drawn + rec.t_preprocessed[w] - resume - rec.t_features[w]


def fit_reads_first(profile: dict, requests: pd.DataFrame, *, secs: float = 40.0) -> dict | None:
    """The hold fitted on the fitted levels (module docstring): ``{"hold_ms": ms or None
    (no bound), "measured_p90_ms": by level, "by_hold": each hold's p90s and error}``
    (``hold_ms`` 0: in the order ready). None for a profile whose handler does not await
    its fetch (no ``event_loop.resume_ms``) or without the fetch's times."""
    from calibrate.scenario import ranker_on_loop

    loop = (profile.get("frontend") or {}).get("event_loop") or {}
    if not ranker_on_loop(profile) or loop.get("resume_ms") is None or "feature_us" not in requests:
        return None
    ok = requests[(requests["status"] == 200) & ~requests["warmup"]]
    levels = [f["level"] for f in profile["fit_levels"]]
    want = np.array([ok.loc[ok["level"] == lv, "feature_us"].quantile(0.9) / 1e3 for lv in levels])
    if not np.all(np.isfinite(want) & (want > 0)):
        return None
    rows = []
    for hold in HOLDS:
        got = np.array(
            [np.percentile(fetch_times(profile, profile["levels_rps"][lv], hold, secs=secs), 90) for lv in levels]
        )
        rows.append({"hold_ms": hold, "p90_ms": got.round(4).tolist(), "error": float(np.sum(np.log(got / want) ** 2))})
    least = min(r["error"] for r in rows)
    best = min(r["hold_ms"] for r in rows if r["error"] <= KNEE * least + NOISE)
    for r in rows:  # JSON has no inf: no bound is None
        r["hold_ms"] = None if r["hold_ms"] == math.inf else r["hold_ms"]
    return {
        "hold_ms": None if best == math.inf else best,
        "measured_p90_ms": want.round(4).tolist(),
        "by_hold": rows,
    }

"""The relay's tail against the host's wake-ups, by load (calibrate/README, "The way back
through the hub": what the relay's tail follows).

The relay (``relay_us``: a request's item from its front end to the hub, and its answer
back, the two hops) has a p99 that jumps between 30% and 50% load and then stays, whether
or not the front end was busy when the answer came. The hiccup meter on each core sleeps
1 ms over and over and records each overshoot above 0.5 ms (``hiccups.csv``): a sleeping
thread woken late, which is what a front end or the hub asleep in its poll is when a hop
reaches it. By level, on a run's committed files (no device time): the relay's median,
p99 and share over 2 and 3 ms, and the meter's overshoots over 1, 2 and 3 ms per core and
second (the instance's core left out: its meter is coarse).

Then how much of the tail such wake-ups could make: each held-out level's design simulated
from the committed scenario (the queue as the client drove it), and to every request
``hops`` extra wake-ups added, each late with the probability the meter's overshoots have
per wake-up at that level beyond the fitted light level's (about 943 wake-ups a core and
second: a 1 ms sleep and its usual jitter), by one of that level's recorded overshoots. A
what-if that reads the held-out levels' meters, to size the mechanism, not a fit.

Last, where on the way back the tail sits: a batch's answers leave the hub in the batch's
order; the first one to each front end finds it asleep, a later one finds it awake. By
level, the share of relays over 2 ms for answers that found their front end awake, and
for those that woke it, by how many other front ends the same batch woke before it.

And what the measured way outside the batch would add if the model had all of its load
dependence: to each simulated request of a held-out level, the measured relay's and the
time outside the server's timer's excess over the fitted light level's, quantile by
quantile (each request its own draw), another what-if on the held-out measurements.

    python calibrate/experiments/wakeups.py [PROFILE_DIR]   # default: calibrate/profiles/gpu-h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.interval import SliceDesign, design_run

say = print
WAKEUPS_PER_S = 943.0  # a 1 ms sleep's wake-ups a second, with its usual jitter
DESIGNS = 40


def main(folder: Path) -> None:
    profile = json.loads((folder / "profile.json").read_text())
    slices = pd.read_csv(folder / "slices.csv")
    slices = slices[slices["kept"]]
    meter = pd.read_csv(folder / "hiccups.csv").merge(slices[["slice", "attempt", "level"]], on=["slice", "attempt"])
    instance_cores = set(profile["server"].get("instance_cores") or [])
    meter = meter[~meter["core"].isin(instance_cores)]
    cores = meter["core"].nunique()
    seconds = slices.groupby("level")["seconds"].sum()
    cols = ["level", "warmup", "status", "relay_us", "offered_rps", "latency_ms", "frontend", "request_us"]
    cols += ["dispatched_at_ns", "enqueued_at_ns"]
    m = pd.read_csv(folder / "measurements.csv.gz", usecols=cols)
    m = m[~m["warmup"] & (m["status"] == 200)]
    m_lat = {level: g["latency_ms"].to_numpy() for level, g in m.groupby("level")}
    rows = []
    for level, g in m.groupby("level"):
        relay = g["relay_us"] / 1e3
        over = meter.loc[meter["level"] == level, "overshoot_ms"]
        per = seconds[level] * cores
        rows.append(
            {
                "req/s": round(float(g["offered_rps"].iloc[0]), 1),
                "relay p50": relay.median(),
                "relay p99": relay.quantile(0.99),
                "relay > 2 ms": (relay > 2).mean(),
                "relay > 3 ms": (relay > 3).mean(),
                "meter > 1 ms /core/s": (over > 1).sum() / per,
                "> 2 ms": (over > 2).sum() / per,
                "> 3 ms": (over > 3).sum() / per,
            }
        )
    table = pd.DataFrame(rows)
    say(f"{folder}: {cores} cores metered")
    say(table.to_string(index=False, float_format=lambda v: f"{v:.4f}" if v < 1 else f"{v:.2f}"))
    r = table[["relay > 2 ms", "> 2 ms"]].corr(method="spearman").iloc[0, 1]
    say(f"\nSpearman, the relay's share over 2 ms against the meter's rate over 2 ms, by level: {r:+.2f}")

    def late(level: int) -> tuple[float, np.ndarray]:
        over = meter.loc[meter["level"] == level, "overshoot_ms"].to_numpy()
        return len(over) / (seconds[level] * cores) / WAKEUPS_PER_S, over

    light, light_load = min((f["level"], f["load"]) for f in profile["fit_levels"])
    base, _ = late(light)
    fitted = {f["level"] for f in profile["fit_levels"]}
    rng = np.random.default_rng(0)
    say(
        f"\nLate wake-ups added per request (late per wake-up beyond the fitted {light_load:.0%} level's "
        f"{base:.2%}), median of {DESIGNS} designs:"
    )
    for level in sorted(set(m["level"]) - fitted):
        rate = float(m.loc[m["level"] == level, "offered_rps"].iloc[0])
        p, over = late(level)
        got: dict[int, list] = {0: [], 2: [], 4: []}
        for k in range(DESIGNS):
            lat = design_latencies(profile, rate, 2000 + k)
            for hops, out in got.items():
                extra = np.zeros(len(lat))
                for _ in range(hops):
                    hit = rng.random(len(lat)) < max(p - base, 0.0)
                    extra[hit] += rng.choice(over, hit.sum())
                out.append(np.percentile(lat + extra, [50, 99]))
        measured = np.percentile(m_lat[level], [50, 99])
        cells = ", ".join(
            f"{h} hops {a:.2f} / {b:.2f}" for h, (a, b) in ((h, np.median(v, axis=0)) for h, v in got.items())
        )
        say(f"  {rate:7.1f} req/s: late {p:.2%} a wake-up; p50 / p99 ms: {cells}")
        say(f"    measured {measured[0]:.2f} / {measured[1]:.2f}")

    woke(m)
    outside_excess(profile, m, light, fitted)


def design_latencies(profile: dict, rate: float, seed: int) -> np.ndarray:
    """One simulated design of the run's slices at ``rate`` (:func:`calibrate.interval.design_run`):
    the kept latencies, ms."""
    d = profile["design"]
    design = SliceDesign(int(d["rounds"]), float(d["slice_s"]), float(d["warmup_s"]), (d["levels"] - 1) * d["slice_s"])
    rec, kept = design_run(profile, rate, design, seed=seed)
    keep = rec.completed & kept
    return (rec.t_response - rec.arrival)[keep]


def outside_excess(profile: dict, m: pd.DataFrame, light: int, fitted: set) -> None:
    """Part 4 of the module: the held-out levels' measured relay and outside time, their
    excess over the light level's by quantile, added to simulated designs."""
    u = np.linspace(0.0005, 0.9995, 2000)
    m = m.assign(relay=m["relay_us"] / 1e3, outside=m["latency_ms"] - m["request_us"] / 1e3)

    def q(level: int, col: str) -> np.ndarray:
        return np.quantile(m.loc[m["level"] == level, col].to_numpy(), u)

    rng = np.random.default_rng(0)
    say("\nThe measured excess over the light level added to simulated designs, p50 / p99 ms (median of 40):")
    for level in sorted(set(m["level"]) - fitted):
        rate = float(m.loc[m["level"] == level, "offered_rps"].iloc[0])
        relay, outside = q(level, "relay") - q(light, "relay"), q(level, "outside") - q(light, "outside")
        got: dict[str, list] = {"model": [], "+ relay": [], "+ relay + outside": []}
        for k in range(DESIGNS):
            lat = design_latencies(profile, rate, 3000 + k)
            i, j = rng.integers(0, len(u), len(lat)), rng.integers(0, len(u), len(lat))
            for name, add in zip(got, (0.0, relay[i], relay[i] + outside[j]), strict=True):
                got[name].append(np.percentile(lat + add, [50, 99]))
        cells = ", ".join(f"{n} {a:.2f} / {b:.2f}" for n, (a, b) in ((n, np.median(v, axis=0)) for n, v in got.items()))
        measured = np.percentile(m.loc[m["level"] == level, "latency_ms"], [50, 99])
        say(f"  {rate:7.1f} req/s: {cells}; measured {measured[0]:.2f} / {measured[1]:.2f}")


def woke(m: pd.DataFrame) -> None:
    """The relay's share over 2 ms by whether the answer woke its front end, and by how many
    front ends its batch woke before it (part 3 of the module)."""
    m = m.sort_values(["dispatched_at_ns", "enqueued_at_ns"]).copy()
    m["first"] = m.groupby(["dispatched_at_ns", "frontend"]).cumcount() == 0
    m["before"] = m.groupby("dispatched_at_ns")["first"].cumsum() - m["first"]
    m["over"] = m["relay_us"] > 2000
    say("\nRelays over 2 ms: answers that found their front end awake | that woke it, by front ends woken before")
    for _, g in m.groupby("level"):
        first = g[g["first"]]
        by = first.groupby(first["before"].clip(upper=4))["over"].mean()
        cells = "  ".join(f"{int(k)}{'+' if k == 4 else ''}: {v:.2%}" for k, v in by.items())
        say(f"  {g['offered_rps'].iloc[0]:7.1f} req/s: awake {g.loc[~g['first'], 'over'].mean():.2%} | woke {cells}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "calibrate/profiles/gpu-h200"))

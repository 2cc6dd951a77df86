"""How precise one fit of the LLM twin is, against how much simulation it spends
(calibrate/README, "The LLM twin"): the committed CPU profile's model as a simulated
engine at half its knee for 70 s, scraped every 10 s (:func:`calibrate.vllm_metrics.scrapes_of`);
the twin (window 6, TTFT p99 <= 250 ms over 10 s windows, as ``calibrate watch --openai
--interval-s 10`` runs it) measures the last window once, then fits it again and again,
each time on other seeds, under each design: how many seeds, and how many of the speed
process's slowest correlation times the simulated span covers (``speed_spans``). A first
fit (cold, three seeds of 20 spans) gives the start of every fit after it (a warm
start, as the watch's updates after the first have).

Printed per design: the spread over the seed sets (the sample standard deviation, relative
to the mean) of the speed factor, of the TTFT p99 predicted at the window's rate (over 10 s
windows) and of the breaking rate; and the wall time a fit took.

    python calibrate/experiments/llm_twin_precision.py [--sets 10] [--designs 3x20,2x10,3x10,2x20,1x20]   # ~15 min
"""

from __future__ import annotations

import argparse
import statistics
import time

from twin_engine import half_knee_scrapes, profile_engine

from calibrate.watch_llm import LLMTwin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=10, help="seed sets a design is fitted with")
    ap.add_argument("--designs", default="3x20,2x10,3x10,2x20,1x20", help="SEEDSxSPANS, comma-separated")
    ap.add_argument("--seed", type=int, default=5, help="the simulated engine's seed")
    a = ap.parse_args()
    designs = [tuple(int(v) for v in d.split("x")) for d in a.designs.split(",")]
    base, knee, info = profile_engine()
    scrapes = half_knee_scrapes(base, knee, info, 70.0, 10.0, 6, a.seed)
    twin = LLMTwin(base, info, ttft_sla=(99.0, 250.0), window=6, sla_window_s=10.0)
    job = None
    for s in scrapes:
        got = twin.measure(s)
        job = got[1] if got is not None else job
    print(f"knee {knee:.2f} req/s; the engine at {0.5 * knee:.2f} req/s, window {job['span_s']:.0f} s")  # noqa: T201
    twin.seeds, twin.speed_spans = (1, 2, 3), 20
    twin.fit(job)  # a first fit, cold: where every fit below starts
    start = (twin.factor, twin.slope, twin.last_break)
    print(f"the first fit: speed {twin.factor:.3f}, breaks at {twin.last_break[0]:.2f} req/s")  # noqa: T201
    for n_seeds, spans in designs:
        factors, breaks, took, p99s = [], [], [], []
        for k in range(a.sets):
            twin.seeds = tuple(range(1 + k * n_seeds, 1 + (k + 1) * n_seeds))
            twin.speed_spans = spans
            twin.factor, twin.slope, twin.last_break = start
            t = time.perf_counter()
            row = twin.fit(job)
            took.append(time.perf_counter() - t)
            factors.append(row["speed_factor"])
            breaks.append(row["breaking_rate_rps"])
            p99s.append(row["predicted_ttft_p99_ms"])
            print(  # noqa: T201
                f"  {n_seeds}x{spans} seeds {twin.seeds}: speed {factors[-1]:.3f}, "
                f"TTFT p99 {p99s[-1]:.1f} ms, breaks at {breaks[-1]:.2f} req/s, {took[-1]:.1f} s",
                flush=True,
            )

        def rel_sd(xs: list[float]) -> float:
            return statistics.stdev(xs) / statistics.fmean(xs) * 100

        print(  # noqa: T201
            f"{n_seeds} seeds x {spans} spans: speed {statistics.fmean(factors):.3f} (sd {rel_sd(factors):.1f}%), "
            f"TTFT p99 {statistics.fmean(p99s):.1f} ms (sd {rel_sd(p99s):.1f}%), "
            f"breaks at {statistics.fmean(breaks):.2f} req/s (sd {rel_sd(breaks):.1f}%), "
            f"a fit {statistics.median(took):.1f} s ({min(took):.1f}-{max(took):.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()

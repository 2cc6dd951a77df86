"""What one update of the LLM twin costs (calibrate/README, "The LLM twin"): a simulated
engine, the committed CPU profile's model, at half its knee for 100 s, scraped every 10 s
(:func:`calibrate.vllm_metrics.scrapes_of`), and the twin (window 6, the SLA TTFT p99 <= 250 ms
over 10 s windows, as ``calibrate watch --openai --interval-s 10`` runs it) updated on each
scrape: each update's wall time, its simulations, the speed factor and the breaking rate.

    python calibrate/experiments/llm_twin_updates.py [--updates N] [--cold] [--seeds N]

``--cold`` forgets the last update before each (the factor, its slope, the breaking rate):
every search starts as the first does. Run an older commit's twin with this script by
``PYTHONPATH=<its worktree>`` (the script uses only ``LLMTwin`` and ``scrapes_of``, and
builds the KV labels from the profile itself (``twin_engine.py``), so that an older twin
runs it).
"""

from __future__ import annotations

import argparse
import statistics
import time

from twin_engine import half_knee_scrapes, profile_engine

from calibrate.watch_llm import LLMTwin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=9, help="updates after the first scrape (at most 9)")
    ap.add_argument("--cold", action="store_true", help="every update's searches start cold")
    ap.add_argument("--seed", type=int, default=5, help="the simulated engine's seed")
    ap.add_argument("--seeds", type=int, default=None, help="the twin's simulations a prediction (default: its own)")
    a = ap.parse_args()
    if not 1 <= a.updates <= 9:
        ap.error("--updates: 1 to 9")
    base, knee, info = profile_engine()
    scrapes = half_knee_scrapes(base, knee, info, 100.0, 10.0, a.updates, a.seed)
    twin = LLMTwin(base, info, ttft_sla=(99.0, 250.0), window=6, sla_window_s=10.0)
    if a.seeds is not None:
        twin.seeds = tuple(range(1, a.seeds + 1))
    made: list[float] = []
    predict = twin.predict

    def counted(rate, lengths, factor):
        made.append(factor)
        return predict(rate, lengths, factor)

    twin.predict = counted
    print(  # noqa: T201
        f"knee {knee:.2f} req/s; the engine at {0.5 * knee:.2f} req/s; {'cold' if a.cold else 'warm'}; "
        f"{len(twin.seeds)} seeds a prediction"
    )
    took, sims = [], []
    for s in scrapes:
        if a.cold:
            twin.factor = 1.0
            for name, value in (("last_break", None), ("slope", 1.0)):  # absent from older twins
                if hasattr(twin, name):
                    setattr(twin, name, value)
        made.clear()
        t = time.perf_counter()
        row = twin.update(s)
        if row is None or "speed_factor" not in row:
            continue
        took.append(time.perf_counter() - t)
        sims.append(len(made))
        print(  # noqa: T201
            f"  scrape at {s.t:3.0f} s: update {took[-1]:5.1f} s, {len(made):2d} simulations, "
            f"speed {row['speed_factor']:.3f}, breaks at {row['breaking_rate_rps']:.2f} req/s",
            flush=True,
        )
    later = took[1:] or took
    print(  # noqa: T201
        f"updates after the first: median {statistics.median(later):.1f} s ({min(later):.1f}-{max(later):.1f}), "
        f"simulations median {statistics.median(sims[1:] or sims):g} ({min(sims[1:] or sims)}-{max(sims[1:] or sims)})"
    )


if __name__ == "__main__":
    main()

"""The platform meters: the sleep meter's pauses and the speed meter's chunk times."""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

from calibrate.hiccups import SLOW, HiccupMeter, platform_speed


def test_the_meters_time_chunks_on_every_core_and_stop():
    """Real meter processes: over ~1 s each fine core times a chunk every 10 wake-ups and
    the coarse one every wake-up (20 ms); the windows cover the interval; nothing is left."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    coarse = {cores[-1]} if len(cores) > 1 else set()
    with HiccupMeter(cores, coarse=coarse) as meter:
        meter.collect()
        start = time.perf_counter_ns()
        time.sleep(1.0)
        h = meter.collect()
        procs = list(meter._procs)
    assert not any(p.is_alive() for p in procs)
    assert set(np.unique(h.speed_core)) == set(cores)
    assert (h.chunk_us > 0).all()
    assert (h.chunk_wall_us >= h.chunk_us * 0.9).all()  # CPU time within wall time (clock granularity aside)
    for core in cores:
        n = int((h.speed_core == core).sum())
        assert (20 <= n <= 60) if core in coarse else (30 <= n <= 110), (core, n)
    w = h.speed_windows(start, 0.25)
    assert set(w["window"]) <= {-0.25, 0.0, 0.25, 0.5, 0.75, 1.0}
    assert w["chunks"].sum() == len(h.chunk_us)


def _speed(ratios_by_core: dict[int, list[float]], *, slice_id: int = 0) -> pd.DataFrame:
    rows = []
    for core, ratios in ratios_by_core.items():
        for k, r in enumerate(ratios):
            rows.append(
                {
                    "slice": slice_id,
                    "attempt": 0,
                    "level": 0,
                    "core": core,
                    "window": k * 0.25,
                    "chunk_us": 40.0 * r * (1 + core),
                    "chunks": 25,
                }
            )
    return pd.DataFrame(rows)


def test_platform_speed_is_the_median_core_over_its_own_usual():
    """Two cores with different chunk times (40 and 80 us usually): a window where both are
    1.5x slower is a 1.5x slowdown; where only one of the two is, it reads 1.25x (their median)."""
    base = [1.0] * 8
    slow = [*base[:4], 1.5, *base[:3]]
    both = {0: slow, 1: slow}
    per_slice, summary = platform_speed(_speed(both))
    assert per_slice["slowdown_max"].iloc[0] == pytest.approx(1.5)
    assert summary["share_slow"] == pytest.approx(1 / 8)
    assert summary["series"][4] == pytest.approx(1.5)
    one = {0: slow, 1: base}
    per_slice, summary = platform_speed(_speed(one))
    assert per_slice["slowdown_max"].iloc[0] == pytest.approx(1.25)
    assert summary["share_slow"] == pytest.approx(1 / 8)  # 1.25 counts: SLOW is inclusive
    assert SLOW == 1.25


def test_platform_speed_correlates_slices_p99_with_their_slowest_window():
    frames = [_speed({0: [1.0] * 3 + [1.0 + k / 10]}, slice_id=k) for k in range(6)]
    p99 = pd.Series([1.0, 1.1, 1.3, 1.2, 1.6, 2.0], index=range(6))
    _, summary = platform_speed(pd.concat(frames, ignore_index=True), p99)
    assert summary["slices_correlated"] == 6
    assert summary["spearman_p99_vs_slowest"] == pytest.approx(
        pd.Series(range(6)).corr(p99.reset_index(drop=True), method="spearman")
    )


def test_the_instances_coarse_cores_are_left_out_where_others_were_metered():
    """An instance's core reads slow after every forward; with another core metered, the
    platform's speed is that core's. Metered alone, the coarse core still counts."""
    base = [1.0] * 8
    noisy = {0: base, 1: [1.0, 1.6] * 4}
    per_slice, summary = platform_speed(_speed(noisy), coarse={1})
    assert per_slice["slowdown_max"].iloc[0] == pytest.approx(1.0)
    assert summary["share_slow"] == 0
    _, alone = platform_speed(_speed({1: [1.0, 1.6] * 4}), coarse={1})
    assert alone["max"] == pytest.approx(1.6 / 1.3)  # over its own median (1.3)

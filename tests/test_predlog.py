"""Prediction logging: the pipeline never delays responses, and its backlog follows the fluid limit."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.results.reduce import summarize
from simulator.stages.prediction_log import record_ms
from tests.helpers import scenario


def _run(bandwidth_gbps):
    s = scenario(
        duration_s=20.0,
        traffic={"rate_rps": 2000},
        router={"balancing": "shared"},
        workers={"count": 4, "service_time": {"kind": "exponential", "mean_ms": 1.0}},
        logging={"record_kb": 100, "bandwidth_gbps": bandwidth_gbps},
    )
    return s, simulate(s)


def test_responses_do_not_wait_for_logs():
    _, fast = _run(100.0)
    _, slow = _run(1.2)
    np.testing.assert_array_equal(fast.records.t_response, slow.records.t_response)


def test_overloaded_pipeline_backlog_follows_the_fluid_limit():
    _, run = _run(1.2)  # 150 MB/s of capacity against 2000 x 100 KB = 200 MB/s offered
    out = summarize(run)["logging"]
    assert out["falling_behind"]
    r = run.records
    first = np.nanmin(r.t_response)
    emitted_mb = np.count_nonzero(r.t_response <= 20_000) * 0.1
    fluid = emitted_mb - 150.0 * (20_000 - first) / 1000  # everything not yet shipped at full speed
    assert out["backlog_mb_at_end"] == pytest.approx(fluid, rel=1e-3)


def test_underloaded_pipeline_lag_is_near_the_record_time():
    s, run = _run(16.0)  # 2 GB/s of capacity, 10% utilised
    out = summarize(run)["logging"]
    assert not out["falling_behind"]
    assert out["utilization"] == pytest.approx(0.1, rel=0.05)
    assert out["lag_ms"]["p50"] == pytest.approx(record_ms(s.logging), rel=1e-6)
    assert out["lag_ms"]["p99"] < 5 * record_ms(s.logging)

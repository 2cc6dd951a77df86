"""A big batch leaves the next one slower (``service_time.after_batch``): the factor by the
size of the instance's batch before, by formula on each scheduler, the same whole or in
chunks, its fit recovered, bad tables refused."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.idle import fit_after_batch, previous_size
from simulator.engine import simulate
from simulator.scenario.config import Scenario, Workers
from simulator.serving.workers import ServiceModel
from tests.helpers import chunked_against_plain, refusal
from tests.test_after_idle import _doc as idle_doc

AFTER = {"1": 1.0, "8": 1.7}  # 1 + 0.1 a request of the batch before, past the first
SIZES = (1, 4, 1, 8, 1, 1)


def _doc(tmp_path, loop: bool, after: dict | None, batching: dict | None = None) -> dict:
    """Groups of ``SIZES`` requests arriving at once, 200 ms apart: each group one batch."""
    d = idle_doc(tmp_path, loop, None, batching or {"max_batch_size": 8, "max_queue_delay_ms": 5})
    times = np.concatenate([np.full(k, 0.1 + 0.2 * i) for i, k in enumerate(SIZES)])
    np.savetxt(tmp_path / "arrivals.txt", times, fmt="%.6f")
    d["duration_s"] = 2
    if after is not None:
        d["workers"]["service_time"]["after_batch"] = after
    return d


def _expected() -> np.ndarray:
    """Each group's batch time: the table (6 ms for one, 11 for 8, linear between) times the
    factor at the size before it (none for the first)."""
    table = np.interp(SIZES, [1, 8], [6.0, 11.0])
    factor = np.concatenate([[1.0], np.interp(SIZES[:-1], [1, 8], [1.0, 1.7])])
    return table * factor


@pytest.mark.parametrize(
    ("loop", "batching"),
    [
        (True, None),  # the event loop's dispatch
        (False, None),  # the compiled batcher
        (False, {"max_batch_size": 8, "max_queue_delay_ms": 5, "deadline_ms": 500}),  # the SimPy scheduler
    ],
)
def test_a_batch_is_slower_by_the_size_of_the_batch_before(tmp_path, loop, batching):
    rec = simulate(Scenario.model_validate(_doc(tmp_path, loop, AFTER, batching))).records
    took = rec.t_inferred - rec.t_dispatch - (0.15 if loop else 0.0)
    _, first = np.unique(rec.t_dispatch, return_index=True)
    np.testing.assert_array_equal(rec.batch_size[first], SIZES)
    np.testing.assert_allclose(took[first], _expected(), atol=1e-9)
    plain = simulate(Scenario.model_validate(_doc(tmp_path, loop, None, batching))).records
    np.testing.assert_allclose(
        (plain.t_inferred - plain.t_dispatch - (0.15 if loop else 0.0))[first], np.interp(SIZES, [1, 8], [6, 11])
    )


def test_simpy_workers_keep_each_instances_batch_before():
    doc = {"count": 1, "service_time": {"kind": "table", "batch_ms": {"1": 6, "8": 11}, "after_batch": AFTER}}
    model = ServiceModel(Workers.model_validate(doc), 8, np.random.default_rng(0))
    assert model.finish(0.0, 8, 0.0, inst=0) == pytest.approx(11.0)  # nothing before it
    assert model.finish(0.0, 1, 0.0, inst=1) == pytest.approx(6.0)  # another instance
    assert model.finish(20.0, 1, 0.0, inst=0) == pytest.approx(20.0 + 6 * 1.7)  # after its 8
    assert model.finish(30.0, 1, 0.0, inst=1) == pytest.approx(30.0 + 6 * 1.0)  # after its 1


def test_a_run_cut_in_chunks_is_the_whole_run(tmp_path):
    """A busy loop, random gaps, two instances: each instance's batch before carries across
    chunks; the factor lengthens the batches against the same run without it."""
    took, plain = chunked_against_plain(tmp_path, _doc(tmp_path, True, {"1": 1.0, "8": 1.2}), "after_batch")
    assert np.nanmean(took) > np.nanmean(plain)


def test_the_fit_recovers_the_factor():
    """Batches timed with a known factor by the size before and a log-normal noise: the fit
    gives each size's mean factor back within 2%, relative to all batches' mean."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 9, 20_000)
    before = np.concatenate([[np.nan], sizes[:-1]])
    true = np.where(np.isnan(before), 1.0, np.interp(np.nan_to_num(before, nan=1.0), [1, 8], [1.0, 1.5]))
    ratio = true * rng.lognormal(-0.005, 0.1, len(sizes))
    fitted = fit_after_batch(before, ratio)
    known = ~np.isnan(before)
    base = true[known].mean()
    for k in range(1, 9):
        assert fitted[float(k)] == pytest.approx(np.interp(k, [1, 8], [1.0, 1.5]) / base, rel=0.02)
    assert fit_after_batch(np.full(100, np.nan), ratio[:100]) is None


def test_the_size_before_is_read_per_slice_from_the_dispatch_clock():
    import pandas as pd

    df = pd.DataFrame(
        {
            "slice": [0, 0, 0, 0, 1, 1],
            "dispatched_at_ns": [30, 10, 10, 20, 5, 9],
            "batch_size": [1, 2, 2, 3, 4, 1],
        }
    )
    np.testing.assert_array_equal(previous_size(df), [3, np.nan, np.nan, 2, np.nan, 4])


@pytest.mark.parametrize(
    ("table", "message"),
    [({"1": 1.0}, "at least two"), ({"1": 1.0, "8": 0.0}, "finite and > 0"), ({"-1": 1.0, "8": 1.2}, ">= 0")],
)
def test_a_bad_table_is_refused_naming_its_line(tmp_path, table, message):
    text = refusal(tmp_path, _doc(tmp_path, True, table))
    assert message in text
    assert "workers.service_time" in text
    assert "line " in text


def test_a_profile_with_the_factor_says_it_and_carries_it_into_its_scenario():
    import json
    from pathlib import Path

    from calibrate.report_model import fitted_model
    from calibrate.scenario import scenario_dict

    folder = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc"
    profile = json.loads((folder / "profile.json").read_text())
    assert "after_batch" not in " ".join(fitted_model(profile))  # fitted with the factor off
    profile["service_time"]["after_batch"] = {"8": 1.06, "1": 0.98}  # as a profile.json gives it back
    assert "×0.98 after 1, ×1.06 after 8" in " ".join(fitted_model(profile))
    doc = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)
    assert Scenario.model_validate(doc).workers.service_time.after_batch == {8.0: 1.06, 1.0: 0.98}

"""The pressure experiment's estimator (calibrate/experiments/pressure.py): the count in the
system read off arrivals and answers, and an instrumental slope that recovers a known
effect where a slow spell also builds the backlog (which biases least squares)."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.backlog import iv_slope
from calibrate.experiments.pressure import in_system


def test_the_count_in_the_system_is_read_at_each_windows_instants():
    arrived = np.array([0.0, 0.1, 0.6])
    done = np.array([0.35, 0.9, 0.7])
    got = in_system(arrived, done, 2, 0.5)
    # ten instants a window, 0.025, 0.075, ... 0.975: the first window holds 1 at its first two
    # instants, 2 from 0.1 to 0.35, then 1; the second 1, 2 from 0.6 to 0.7, 1, none after 0.9
    assert got[0] == pytest.approx((2 + 2 * 5 + 3) / 10)
    assert got[1] == pytest.approx((2 + 2 * 2 + 4 + 0) / 10)


def test_the_instrument_recovers_the_effect_that_least_squares_reads_backwards():
    """Backlog x = the schedule's z plus what a slow spell adds; speed y = b·x + the spell.
    Least squares reads the spell as a backlog slowing the host; the schedule does not."""
    rng = np.random.default_rng(11)
    n, b = 20_000, -0.002
    z = rng.normal(0.0, 3.0, n)  # requests the schedule puts in the system
    spell = rng.normal(0.0, 0.03, n)  # the host's own log speed
    x = z + 100.0 * spell + rng.normal(0.0, 1.0, n)  # a slow spell builds a backlog
    y = b * x + spell
    got = iv_slope(y - y.mean(), x - x.mean(), z - z.mean())
    assert got["ols"] > 0  # read backwards: busy looks slow
    assert got["first"] == pytest.approx(1.0, abs=0.05)
    assert got["iv"] == pytest.approx(b, abs=0.0005)

"""Fixtures shared by the test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def root_dir() -> Path:
    """The repository root (scenarios/, README.md)."""
    return ROOT


DEFAULT_SERVER = ["--resolution", "64", "--width", "48", "--max-batch-size", "8", "--max-queue-delay-ms", "2"]


@pytest.fixture(scope="session")
def calibrated_default(tmp_path_factory) -> Path:
    """A short calibration of the default server (``calibrate run``'s model), on this host
    and this hour: a speed process is the host's and the hour's, so the slow checks that
    predict a live server calibrate it first (4 rounds of 2 s slices, ~2 minutes)."""
    pytest.importorskip("torch", reason="calibration drives the reference server (torch)")
    pytest.importorskip("aiohttp", reason="the calibration's load generator needs aiohttp")
    from calibrate.run import Design, calibrate_run

    out = tmp_path_factory.mktemp("calibrated-default")
    calibrate_run(
        DEFAULT_SERVER, out, design=Design(rounds=4, slice_s=2.0, min_requests=0), draws=20, log=lambda _m: None
    )
    return out

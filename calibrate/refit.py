"""What a calibration run writes, and fitting a run again from what it measured.

:func:`refit_run` (``servesim calibrate refit``) reads a ``calibrate run`` folder, fits the
batch time, the front end, the speed process and the batching window again from its fitted
levels alone, validates the held-out levels again and rewrites the fit and the report; the
measurements stay as they were. :func:`save_measurements` and :func:`write_run` are the two
halves of a run's output, shared by :func:`calibrate.run.calibrate_run` and the refit, as are
the two fits onto the event loop that both make (:func:`held_cost`, :func:`reads_first`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

import calibrate.scenario as calibrated
from calibrate import backlog_fit, drain, idle
from calibrate.cycle import fit_window
from calibrate.fit import fit_profile
from calibrate.held import factors_by_held
from calibrate.profile import frontend_cores
from calibrate.reads import fit_reads_first
from calibrate.report import markdown
from calibrate.scenario import write_scenario
from calibrate.speed import fit_run_speed
from calibrate.station import fit_frontend
from calibrate.validate import chart, compare

# the loop's work by the count held as the closed loop measured it (event_loop.cost_by_held)
# rather than a straight line's share per request held: tried, not adopted (calibrate/README,
# "The loop's cost is not a straight line"); ranker_loop_models.py --by-held turns it on
HELD_BY_COUNT = False


def held_cost(profile: dict) -> None:
    """What the closed loop measured (``loop_in_flight``) onto the fitted event loop: its
    share per request held; with :data:`HELD_BY_COUNT`, the factor by the count held from
    its counts (:func:`calibrate.held.factors_by_held`)."""
    loop = (profile.get("frontend") or {}).get("event_loop")
    held = profile.get("loop_in_flight") or {}
    if loop is None:
        return
    loop.pop("cost_by_held", None)
    loop.pop("cost_per_in_flight", None)
    by = factors_by_held(held.get("by_in_flight") or []) if HELD_BY_COUNT else None
    if by is not None:
        loop["cost_by_held"] = by
    elif held.get("cost_per_in_flight"):
        loop["cost_per_in_flight"] = held["cost_per_in_flight"]


def reads_first(profile: dict, requests: pd.DataFrame, log) -> None:
    """A ranker whose handler awaits its fetch: how long its loop reads new requests before
    a resumption (:func:`calibrate.reads.fit_reads_first`), onto its event loop; unless
    :data:`calibrate.scenario.READS_FIRST` sets it for every profile."""
    loop = (profile.get("frontend") or {}).get("event_loop")
    if loop is None:
        return
    loop.pop("reads_first", None)
    if calibrated.READS_FIRST is not None:
        return
    fit = fit_reads_first(profile, requests)
    if fit is not None:
        loop["reads_first"] = fit
        hold = fit["hold_ms"]
        said = "in the order ready" if hold == 0 else "while any waits" if hold is None else f"for {hold:g} ms"
        log(f"reads before a resumption: {said}")


def slice_gap(profile: dict, requests: pd.DataFrame) -> None:
    """``design.slice_gap_ms``, the time between one slice and the next by the server's
    clock, which the validation puts before each slice (:func:`calibrate.validate.follows`)."""
    gap = idle.slice_gap_ms(requests)
    if gap is not None:
        profile.setdefault("design", {})["slice_gap_ms"] = round(gap, 2)


def refit_run(out: Path, *, draws: int, rng: np.random.Generator) -> dict:
    """A run's profile with the batch time, the front end and the speed process fitted
    again from its own fitted levels (:func:`calibrate.fit.fit_profile`,
    :func:`calibrate.speed.fit_speed_process`), validated again: profile.json,
    scenario.yaml and validation.{json,md,png} rewritten; the measurements untouched."""
    profile = json.loads((out / "profile.json").read_text())
    requests = pd.read_csv(out / "measurements.csv.gz")
    slices = pd.read_csv(out / "slices.csv")
    hiccups = pd.read_csv(out / "hiccups.csv")
    old = json.loads((out / "validation.json").read_text())
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    shares = bool((profile.get("frontend") or {}).get("client_shares_cores"))
    fe = profile.get("frontend")
    if fe is not None:  # the batch time, the front end (its hub apart) and its event loop, again
        used = slices[slices["kept"] & slices["level"].isin(fit_levels)]
        front = fit_frontend(
            used, servers=fe["servers"], client_shares_cores=shares, cores=frontend_cores(profile["server"])
        )
        if "speed" in fe:
            front["speed"] = fe["speed"]
        features = fetch_cost = None
        if fe.get("on_store"):  # the ranker's loop on its Redis trips, and the fetch: again
            f = profile["features"]
            features = {"keys": f["lookups_per_request"], **{k: f[k] for k in ("batch_size", "parallelism")}}
            fetch_cost = profile.get("feature_fetch_microbench")
        fit = fit_profile(
            requests, fit_levels=fit_levels, rng=rng, frontend=front, features=features, fetch_cost=fetch_cost
        )
        profile["service_time"], profile["service_time_fits"] = fit["service_time"], fit["service_time_fits"]
        profile["frontend"] = fit["frontend"]
        held_cost(profile)
        if features is not None:
            profile["features"] = fit["features"]
    backlog_fit.fit(profile, requests, slices, fit_levels)  # by_queue: the batch time again, with it
    profile["speed_process"] = fit_run_speed(
        requests, slices, profile["service_time"], fit_levels, client_shares_cores=shares
    )
    server = profile["server"]
    window = fit_window(requests, fit_levels, server["max_queue_delay_ms"], server["max_batch_size"])
    profile.pop("window", None)
    if window is not None:  # the batching window as the server keeps it
        profile["window"] = window
    summary = pd.DataFrame(old["levels"])
    profile.setdefault("levels_rps", [float(r) for r in summary["offered_rps"]])
    slice_gap(profile, requests)
    reads_first(profile, requests, lambda _msg: None)
    drain.fit(profile, requests, fit_levels)  # the loop's work by the count held, from the slices' drain
    table = compare(profile, requests, summary[summary["held_out"]], rng=rng, slices=slices, draws=draws)
    inside = pd.DataFrame(old["compute_inside"])
    return write_run(out, profile, requests, slices, hiccups, summary, table, inside)


def save_measurements(out: Path, requests, slices, hiccups, speed) -> None:
    """What the server and the meters measured, written as soon as the load ends: a run
    cut short in its fit (a device's time limit) still leaves what ``calibrate refit``
    needs, bar the profile."""
    requests.to_csv(out / "measurements.csv.gz", index=False)
    slices.to_csv(out / "slices.csv", index=False)
    hiccups.to_csv(out / "hiccups.csv", index=False)
    speed.to_csv(out / "speed.csv", index=False)


def write_run(out: Path, profile, requests, slices, hiccups, summary, table, inside) -> dict:
    """Write the fit and the report under ``out`` (the measurements are written as the
    load ends); return the report."""
    (out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    write_scenario(profile, out / "scenario.yaml")
    report = {
        "levels": summary.to_dict(orient="records"),
        "validation": table.to_dict(orient="records"),
        "compute_inside": inside.to_dict(orient="records"),
        "slices_repeated": int((~slices["kept"]).sum()),
    }
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "validation.md").write_text(markdown(profile, summary, table, inside, slices, hiccups))
    chart(table, out / "validation.png")
    return report

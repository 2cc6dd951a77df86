"""A whole calibration: start the reference server, find its capacity, measure seven load
levels in interleaved slices, fit a profile on three and validate it on the other four
(held out), write it all.

The design, and why:

* **Interleaved levels.** Rounds of short slices, one per level in a fresh random order
  each round (a randomized block design), so a slow minute of the machine hits every level
  alike; fitting and validation use the same slices.
* **Enough requests.** Slices are long enough that the lightest validated level has at
  least ``min_requests`` after warm-up (2,000 by default, so that its p99 rests on 20 tail
  samples); the report shows each level's count.
* **Platform hiccups.** A jHiccup-style meter on every core (:mod:`calibrate.hiccups`).
  A slice during which some core stalled for more than ``stall_ms`` is run again (up to
  ``retries`` times) and the stall is listed in the report. Repeating rather than
  modelling: the calibration measures the server, and this VM's pauses (host steal,
  noisy neighbours) say nothing about the node the profile will be used for; a fleet's
  own pauses belong in the scenario for that fleet.
* **The front end's CPU.** The server's ``process_cpu_seconds_total`` and this client's
  CPU time around each slice give the CPU per request of the front-end station; with a
  Redis feature store, a closed loop at 32-256 requests in flight (this client off the
  loop's core) gives what the loop pays per request it holds (:mod:`calibrate.held`).
* **The bar.** The forward pass inside the server is compared with the same model's
  microbenchmark, pinned to the instance's core before the server starts.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import backlog_fit, drain, refit
from calibrate.held import in_flight_cost
from calibrate.hiccups import HiccupMeter, platform_speed
from calibrate.loadgen import CONNECTIONS, Slice, run_slices
from calibrate.microbench import feature_fetch_cost, feature_fetch_in_flight
from calibrate.payloads import image_payloads, ranker_payloads
from calibrate.profile import (
    MIN_FULL_BATCHES,
    build_profile,
    capacity,
    client_rps,
    client_shares,
    compute_inside,
    cpu_ticks,
    frontend_cores,
    frontend_servers,
    full_batches,
)
from calibrate.report import over_capacity
from calibrate.servers import get_json, redis_server, server
from calibrate.speed import fit_run_speed
from calibrate.station import fit_frontend
from calibrate.stats import level_summary
from calibrate.validate import compare

FIT_LOADS = (0.3, 0.6, 0.8)
VALIDATE_LOADS = (0.2, 0.5, 0.7, 0.85)


@dataclass(frozen=True)
class Design:
    """How the levels are measured (see the module's docstring)."""

    rounds: int = 10
    slice_s: float = 4.0  # at least: lengthened until the lightest level has min_requests
    warmup_s: float = 0.25  # the start of each slice, excluded (the server starts each slice idle)
    min_requests: int = 2000
    stall_ms: float = 10.0
    retries: int = 2

    def slice_for(self, lightest_rps: float) -> float:
        """The slice length giving the lightest level ``min_requests`` with 10% to spare."""
        need = 1.1 * self.min_requests / (lightest_rps * self.rounds) + self.warmup_s
        return round(max(self.slice_s, need), 2)


def redis_pids(url: str) -> tuple[int, ...]:
    """The redis-server behind ``url``, by its own INFO (its CPU is read around each slice)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return (int(client.info("server")["process_id"]),)
    finally:
        client.close()


WARMUP_S = 6.0  # the warm-up phase, which also measures the front end's CPU per request


def calibrate_run(
    server_args: list[str],
    out: Path,
    *,
    design: Design | None = None,
    seed: int = 0,
    pin: bool = True,
    reps: int = 5,
    draws: int = 200,
    log=print,
) -> dict:
    """The whole calibration (the ranker with a redis-server of its own); writes profile.json,
    scenario.yaml, measurements.csv.gz, slices.csv, hiccups.csv, speed.csv, validation.json, validation.md
    and validation.png under ``out``. Returns the report."""
    design = design or Design()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    before = os.sched_getaffinity(0)
    if not pin:
        server_args = [*server_args, "--instance-cores", "none"]
    model = server_args[server_args.index("--model") + 1] if "--model" in server_args else "resnet"
    cores = os.cpu_count() or 1
    frontend_guess = set(range(cores - 1)) if pin and cores >= 2 else None  # where auto leaves the front end
    try:
        with contextlib.ExitStack() as stack:
            if model == "ranker" and "--redis-url" not in server_args:  # its ids come from a real Redis
                server_args = [*server_args, "--redis-url", stack.enter_context(redis_server(frontend_guess))]
            return _calibrate(
                server_args, out, model, design=design, seed=seed, rng=rng, reps=reps, draws=draws, log=log
            )
    finally:
        os.sched_setaffinity(0, before)


def _microbench(model_cfg: dict, max_batch: int, core: int | None) -> pd.DataFrame:
    """The model alone, one torch thread, on the instance's core: the bar for compute inside."""
    import torch

    from calibrate.microbench import microbench
    from reference_server.models import ModelConfig

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        if core is not None:
            os.sched_setaffinity(0, {core})
        torch.set_num_threads(1)
        cfg = ModelConfig(**model_cfg)
        return microbench(cfg, [cfg.precision], max_batch, repeats=60, warmup=10)
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def _calibrate(
    server_args: list[str], out: Path, model: str, *, design: Design, seed: int, rng, reps: int, draws: int, log
) -> dict:
    """Measure the server ``server_args`` starts, fit, validate, write (see the module)."""
    ticks0 = cpu_ticks()
    cores = os.cpu_count() or 1
    with server(server_args) as url:
        config = get_json(url + f"/v2/models/{model}/config")
        servesim = config["parameters"]["servesim"]
        mcfg = servesim["model"]
        instance_cores = [i["core"] for i in servesim["instances"]]
        if any(c is not None for c in instance_cores):
            os.sched_setaffinity(0, servesim["frontend_cores"])  # this load generator keeps off the instances' cores
        b = config["max_batch_size"]
        bench = _microbench(mcfg, b, instance_cores[0])
        fetch_cost, sidecars = _fetch_alone(server_args, servesim, log)
        if model == "ranker":
            payloads = ranker_payloads(32, mcfg["dense"], 10_000, rng)
        else:
            payloads = image_payloads(32, side=max(64, mcfg["resolution"]), rng=rng)
        probe = _Probe(url, model, payloads, seed, sidecars)
        held = _held(url, model, payloads, servesim, sidecars, log)
        ceiling = max(r["rps"] for r in held["by_in_flight"]) if held is not None else None
        cap_info = _capacity(
            probe, servesim, bench, instances=len(instance_cores), max_batch=b, log=log, ceiling_rps=ceiling
        )
        loads = sorted(FIT_LOADS + VALIDATE_LOADS)
        rates = [round(f * cap_info["rps"], 2) for f in loads]
        slice_s = design.slice_for(min(rates))
        plan = [
            Slice(r, int(k), rates[k], seed=int(np.random.SeedSequence([seed, r, int(k)]).generate_state(1)[0]))
            for r in range(design.rounds)
            for k in rng.permutation(len(rates))
        ]
        log(
            f"levels: {', '.join(f'{f:.0%}={r:g}' for f, r in zip(loads, rates, strict=True))} req/s; "
            f"{design.rounds} rounds of {len(rates)} slices of {slice_s:g} s (~{len(plan) * slice_s / 60:.1f} min)"
        )
        coarse = {c for c in instance_cores if c is not None}  # a 1 ms meter there slows the forward ~11%
        with HiccupMeter(list(range(cores)), coarse=coarse) as meter:
            requests, slices, hiccups, speed = run_slices(
                url,
                model,
                plan,
                payloads,
                slice_s=slice_s,
                warmup_s=design.warmup_s,
                meter=meter,
                stall_ms=design.stall_ms,
                retries=design.retries,
                log=log,
                sidecars=sidecars,
            )
    slices, speed_summary = _speed_per_slice(requests, slices, speed, coarse)
    ticks1 = cpu_ticks()
    refit.save_measurements(out, requests, slices, hiccups, speed)  # kept, should the fit be cut short
    fit_levels = [i for i, f in enumerate(loads) if f in FIT_LOADS]
    profile = build_profile(config, requests, fit_levels, rng=rng, slices=slices, fetch_cost=fetch_cost)
    if fetch_cost is not None:
        profile["feature_fetch_microbench"] = fetch_cost
    if held is not None:
        profile["loop_in_flight"] = held
        refit.held_cost(profile)
    profile["hardware"]["cpu_steal_pct_during_run"] = (
        (ticks1[0] - ticks0[0]) / max(ticks1[1] - ticks0[1], 1) * 100 if ticks0 and ticks1 else None
    )
    profile["platform_speed"] = speed_summary
    profile["capacity_rps"] = cap_info["rps"]
    profile["capacity"] = cap_info
    profile["fit_levels"] = [{"level": i, "load": loads[i], "rate_rps": rates[i]} for i in fit_levels]
    profile["levels_rps"] = rates
    if (warning := over_capacity(profile)) is not None:
        log(f"warning: {warning}")
    profile["design"] = {**asdict(design), "slice_s": slice_s, "levels": len(rates), "connections": CONNECTIONS}
    refit.slice_gap(profile, requests)
    profile["instances"] = servesim["instances"]
    profile["microbench"] = bench.to_dict(orient="records")
    summary = level_summary(requests)
    summary["load"] = loads
    summary["held_out"] = [f in VALIDATE_LOADS for f in loads]
    refit.reads_first(profile, requests, log)
    if backlog_fit.fit(profile, requests, slices, fit_levels) is not None:  # by_queue: the batch time again
        profile["speed_process"] = fit_run_speed(
            requests, slices, profile["service_time"], fit_levels, client_shares_cores=client_shares(servesim)
        )
    drain.fit(profile, requests, fit_levels, log)  # the loop's work by the count held, from the slices' drain
    log("fitted; simulating the held-out levels")
    table = compare(profile, requests, summary[summary["held_out"]], reps=reps, rng=rng, slices=slices, draws=draws)
    inside = compute_inside(requests, loads, bench)
    return refit.write_run(out, profile, requests, slices, hiccups, summary, table, inside)


def _held(url: str, model: str, payloads: list, servesim: dict, sidecars: tuple[int, ...], log) -> dict | None:
    """With a Redis feature store (the ranker's loop, the server's clocks and its
    redis-server on the front end's cores): what the loop pays per request it holds
    (:func:`calibrate.held.in_flight_cost`), this load generator on the instances' cores
    meanwhile so that the front end's cores hold only the server and its sidecars; else
    None (as without instance cores of their own)."""
    inst = {i["core"] for i in servesim.get("instances", []) if i.get("core") is not None}
    if not sidecars or not inst or inst & set(servesim.get("frontend_cores") or []):
        return None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, inst)
    try:
        held = in_flight_cost(url, model, payloads, sidecars=sidecars)
    finally:
        os.sched_setaffinity(0, before)
    rows = held["by_in_flight"]
    share = held["cost_per_in_flight"]
    by = held.get("cost_by_held")
    log(
        "the loop per request held: "
        + ", ".join(
            f"{r['in_flight']}: {r['rps']:.0f} req/s, {r['cpu_ms_per_request']:.3f} ms"
            + (f" ({r['failed']} not answered)" if r["failed"] else "")
            for r in rows
        )
        + (f" of CPU a request; {share:.5f} a request held" if share is not None else "; no share fitted")
        + (f"; factor by held {', '.join(f'{n}: {f:.3f}' for n, f in by.items())}" if by else "")
    )
    return held


def _fetch_alone(server_args: list[str], servesim: dict, log) -> tuple[dict | None, tuple[int, ...]]:
    """With a Redis feature store: the server's Redis client alone on the front end's cores,
    its CPU per round trip, and per fetch against the fetches in flight; and the
    redis-server's pid (its CPU is read around each slice). Else (None, ())."""
    if not (servesim.get("features") and "--redis-url" in server_args):
        return None, ()
    redis_url = server_args[server_args.index("--redis-url") + 1]
    sidecars = redis_pids(redis_url)
    fetch_cost = feature_fetch_cost(redis_url, servesim["features"])
    log(
        f"feature fetch alone: {fetch_cost['cpu_ms_per_trip'] * 1e3:.0f} us of CPU and "
        f"{fetch_cost['wall_ms_per_trip'] * 1e3:.0f} us of wall time per round trip"
    )
    # and under concurrency: what the fixed cost per trip of the model leaves out
    by = feature_fetch_in_flight(redis_url, servesim["features"], sidecars=sidecars)
    fetch_cost["by_in_flight"] = by.to_dict(orient="records")
    log(
        "feature fetch in flight: "
        + ", ".join(f"{int(r.in_flight)}: {r.cpu_ms_per_fetch:.2f} ms" for r in by.itertuples())
        + " of CPU per fetch"
    )
    return fetch_cost, sidecars


@dataclass(frozen=True)
class _Probe:
    """What a warm-up slice needs: the server, its model, the payloads, the seed, the sidecars."""

    url: str
    model: str
    payloads: list
    seed: int
    sidecars: tuple[int, ...]

    def run(self, rates_seeds: list[tuple[float, int]], *, slice_s: float, warmup_s: float):
        slices = [Slice(-1, -1, rate, seed=seed) for rate, seed in rates_seeds]
        return run_slices(
            self.url, self.model, slices, self.payloads, slice_s=slice_s, warmup_s=warmup_s, sidecars=self.sidecars
        )


def _capacity(
    probe: _Probe,
    servesim: dict,
    bench: pd.DataFrame,
    *,
    instances: int,
    max_batch: int,
    log,
    ceiling_rps: float | None = None,
) -> dict:
    """Warm the path and find the capacity (see :func:`calibrate.profile.capacity`); with
    ``ceiling_rps`` (the most the saturated loop answered in a closed loop, this load
    generator off its cores: :func:`_held`), the warm-up rates are set from it instead of
    from a gentle slice's CPU per request."""
    servers = frontend_servers(servesim)  # the front end's event loops (see build_profile)
    # warm the path at a gentle rate; its CPU per request (background included, so an
    # overestimate) bounds what the front end can take, where the model alone would say
    # tens of thousands of req/s for a small ranker
    _, gentle_slices, *_ = probe.run([(20.0, probe.seed)], slice_s=3.0, warmup_s=0)
    per_request_s = float(gentle_slices["frontend_cpu_s"].sum() + gentle_slices["client_cpu_s"].sum()) / max(
        int(gentle_slices["requests"].sum()), 1
    )
    b = max_batch
    guess = instances * b / float(bench["mean_ms"].iloc[-1]) * 1e3
    if ceiling_rps is not None:
        # the gentle slice's CPU per request holds the background, so the warm-up's two
        # rates from it can sit low, where a line through two short slices is fragile: in
        # two MGET ranker runs it read 1.16 and 1.43 ms a request and 0.011 and 0.005 cores
        # of background (the levels spent 0.6-1.1 ms), capacities of 865 and 700 req/s for
        # a loop that answered 2,089-2,255 req/s in a closed loop
        guess = min(guess, ceiling_rps)
    elif per_request_s > 0:
        guess = min(guess, servers / per_request_s)
    # warm-up at 25% and 60% of that: the front end's CPU per request and in the
    # background (a line through two rates), and the hand-off
    first = [(round(f * guess, 2), probe.seed + 100 + k) for k, f in enumerate((0.25, 0.6))]
    warm, warm_slices, *_ = probe.run(first, slice_s=WARMUP_S / 2, warmup_s=0.5)
    # two points: one slice's noise can tilt the line (once 0.14 cores of background and
    # 0.43 ms a request where the run's levels spent 0.66-0.82 ms: the levels went to twice
    # the capacity); the run checks its levels against the front end its levels fit
    # (calibrate.report.over_capacity)
    front = fit_frontend(
        warm_slices,
        servers=servers,
        client_shares_cores=client_shares(servesim),
        cores=frontend_cores(servesim),
    )
    warm = warm[~warm["warmup"]]
    if len(full_batches(warm, b)) < MIN_FULL_BATCHES:
        # the instances' largest batches, timed as the server runs them: offered 90% of what
        # the front end and this load generator can take, a slower instance saturates and
        # every batch is full (503s past its queue are expected). On an H200 host the gentle
        # guess (its CPU per request counts the background: 0.4 cores at 20 req/s) put the
        # warm-up at a few hundred req/s, which ran no batch of 8, and the microbenchmark's
        # 1.30 ms for one set the levels against 5,028 req/s for a server that saturated
        # at about 2,800
        rate = round(0.9 * min(front["capacity_rps"], client_rps(front)), 2)
        sat, *_ = probe.run([(rate, probe.seed + 102)], slice_s=WARMUP_S / 2, warmup_s=0.5)
        warm = pd.concat([warm, sat[~sat["warmup"]]], ignore_index=True)
        log(f"saturation probe at {rate:g} req/s: {len(full_batches(sat[~sat['warmup']], b))} batches of {b}")
    cap_info = capacity(bench, warm, front, instances=instances)
    log(
        f"capacity: {cap_info['rps']:.1f} req/s, set by the {cap_info['bottleneck']} (instances "
        f"{cap_info['instances_rps']:.0f}, front end {cap_info['frontend_rps']:.0f}"
        + (f", load generator {cap_info['client_rps']:.0f}" if cap_info.get("client_rps") else "")
        + f" req/s; batches up to {b}"
        + (
            f", a batch of {b} taking {cap_info['full_batch_ms_inside']:.2f} ms in the server"
            if cap_info.get("full_batch_ms_inside")
            else f", a batch of {b} timed by the microbenchmark"
        )
        + ")"
    )
    return cap_info


def _speed_per_slice(requests: pd.DataFrame, slices: pd.DataFrame, speed: pd.DataFrame, coarse: set[int]):
    """The platform's speed per slice, merged into ``slices``, and its summary."""
    ok = requests[~requests["warmup"] & (requests["status"] == 200)]
    slice_p99 = ok.groupby("slice")["latency_ms"].quantile(0.99)
    level_of = ok.groupby("slice")["level"].first()
    slice_p99 = slice_p99 / slice_p99.groupby(level_of).transform("median")
    per_slice, speed_summary = platform_speed(speed, slice_p99, coarse=coarse)
    return slices.merge(per_slice, on=["slice", "attempt"], how="left"), speed_summary

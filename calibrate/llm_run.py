"""``servesim calibrate llm``: calibrate the simulator's LLM model against the tiny real engine.

1. Start ``servesim serve-llm`` (its own processes, on this machine: the engine on a core
   of its own, polling its pipe when idle (``--idle``, :data:`IDLE`), the front end and
   this process, the load generator, on the others).
2. Profile its step time through the server over a grid of workloads, up to a full KV
   cache (:mod:`calibrate.llm_profile`).
3. Age the engine: overload it for 90 s (``--age-s``) and let it drain, its steps not
   fitted. An engine process minutes into overload runs the same forward 7-12% slower
   than a fresh one (calibrate/experiments/llm_aging.py); measured fresh, a run's first
   minutes ran fast (its first knee slice 15% above the others, in log, over seven runs).
   Then find the knee, the most requests a second the engine sustains, by measurement: offer
   half again what the profile's fit says it can take (doubling the offer until the fit
   saturates: a GPU's engine takes more than a CPU's), open loop, and count completions a
   second once it is full. Once first, and again in every round below, as one more slice
   among the levels: the knee is the mean of those slices, so it takes the host's speed
   over the whole run, as the fit it is predicted with does, and not one minute's
   (measured once, it came out 16% above its prediction when that minute ran fast).
4. Run held-out levels at 30, 50, 70 and 85% of the knee in rounds of short slices, each
   round's slices in a random order (a randomized block design: the host's speed drifts by
   15-20% over minutes on these VMs, and a level run whole would take one minute's luck),
   each round's levels at shares of the knee measured before it (the first slice alone
   came out 4-22% above its run's mean in 8 of 9 runs: a level placed by it ran at up to
   104% of the knee); each slice starts idle and its first seconds are left out. The
   open-loop generator's TTFT and TPOT percentiles, from the scheduled times, pooled over a
   level's slices.
5. Predict each phase (the knee, each level) with the step time fitted on the engine's step
   records of every *other* phase (the profile's and the other loads'): the engine's steps
   under load run slower than alone (the front end's work on the other core), so the fit
   must see loads, but never the one it predicts), the host's speed process fitted on the
   same steps' residuals, and a request's own overhead (HTTP, the hand-offs, the stream)
   measured on lone requests. Each prediction is the median of replications of the same
   design (as many slices, as long, at the rates they ran at, pooled), with their 90%
   prediction interval (:func:`calibrate.stats.replication_interval`: of 20 replications,
   their range).
6. Write ``profile.json`` (the fit on every step: the scenario's), ``validation.md``,
   ``.png`` and ``.csv``, ``steps.csv.gz``, ``requests.csv.gz`` (every held-out request:
   its level, round, scheduled time, lengths and measured times), ``measured.json`` (what
   1-4 measured) and ``scenario.yaml``.

Steps 1-4 are :func:`measure_llm` and 5-6 :func:`predict_llm`: on a lent GPU the first
runs there (``--device cuda --measure-only``) and the second here (``calibrate refit``).
The engine's side of steps 1, 3 and 5 (its arguments, its step records, the overhead, the
knee and the aging, each one call) is :mod:`calibrate.llm_server`; the simulator's side of
step 5 (the scenario, the designs simulated) is :mod:`calibrate.llm_sim`; the table's
verdicts and the report, :mod:`calibrate.llm_report`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_report import cells, chart, device_of, engine_on, instance_type, markdown, verdicts
from calibrate.llm_server import (
    AGE_S,
    ENGINE,
    IDLE,
    OVERHEAD_TIMES,
    age_engine,
    measured_knee,
    measured_overhead,
    server_args,
    step_records,
)
from calibrate.llm_sim import (
    KNEE_SKIP_S,
    WORKLOAD,
    at_speed,
    saturated_rate,
    scenario_dict,
    simulated,
    simulated_knee,
)
from calibrate.servers import beside_llm_front_end, get_json, server
from simulator.scenario.catalog import instance_for_gpu
from simulator.scenario.config import Scenario

LEVELS = (0.3, 0.5, 0.7, 0.85)


def fitted(
    steps: pd.DataFrame,
    speed_bin_s: float | None = llm_profile.SPEED_BIN_S,
    wake_steps: int = llm_profile.WAKE_STEPS,
    minute: bool = True,
) -> dict:
    """The step time fitted on ``steps`` (the host's speed of each ``speed_bin_s`` taken out;
    None: speed-blind; the extra cost of the first ``wake_steps`` steps after an idle), with
    the host's speed process and the white noise left after it
    (:func:`calibrate.llm_profile.fit_speed`), and with ``minute`` one more component of the
    process: the drift between the slices that the fitted components do not hold
    (:func:`calibrate.llm_profile.minute_drift`; none when they hold it all)."""
    fit = llm_profile.fit(steps, speed_bin_s=speed_bin_s, wake_steps=wake_steps)
    got = llm_profile.fit_speed(steps, fit)
    speed = got["speed"]
    out = {**fit, "noise_cv": got["noise_cv"], "log_var": got["log_var"]}
    if minute and "phase" in steps:
        drift = llm_profile.minute_drift(steps, fit, speed)
        out["minute_drift"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in drift.items()}
        if drift["sigma"] >= 1e-3:
            comp = {"sigma": round(drift["sigma"], 5), "correlation_time_s": llm_profile.MINUTE_S}
            speed = {"kind": "log_ar1", "step_ms": 10.0, "components": []} if speed is None else dict(speed)
            speed["components"] = [*speed["components"], comp]
    return {**out, "speed": speed}


def calibrate_llm(out: Path, *, replications: int = 20, log=print, **design) -> dict:
    """The whole calibration (see the module's docstring): :func:`measure_llm` with
    ``design`` (its keywords: slice_s, rounds, warmup_s, knee_s, age_s, seed, device, idle), then
    :func:`predict_llm`; returns the profile written."""
    measure_llm(out, **design, log=log)
    return predict_llm(out, replications=replications, log=log)


def measure_llm(
    out: Path,
    *,
    slice_s: float = 20.0,
    rounds: int = 3,
    warmup_s: float = 3.0,
    knee_s: float = 25.0,
    age_s: float = AGE_S,
    seed: int = 0,
    device: str = "cpu",
    idle: str = IDLE,
    log=print,
) -> dict:
    """Steps 1-4 (the engine on ``device``, idling as ``idle`` says (``serve-llm --idle``),
    aged by ``age_s`` of overload after its profile: :func:`age_engine`): what the engine
    and the load generator measured, written to ``out`` as ``measured.json`` (the design,
    the knee's slices, each level's percentiles, the hardware), ``steps.csv.gz`` and ``requests.csv.gz``, from which
    :func:`predict_llm` predicts on any machine (a lent GPU's time is spent measuring only).
    They are written after every round: a run stopped early keeps the rounds it finished."""
    from calibrate.profile import hardware

    out.mkdir(parents=True, exist_ok=True)
    engine = dict(ENGINE)
    rng = np.random.default_rng(seed)
    phases: dict[str, list[pd.DataFrame]] = {}  # the engine's step records of each phase
    answers: dict[float, list[pd.DataFrame]] = {share: [] for share in LEVELS}
    with (
        server(
            [*server_args(engine), "--device", device, "--idle", idle], command="serve-llm", health="/health"
        ) as url,
        beside_llm_front_end(url),  # the engine keeps its core to itself
    ):
        models = get_json(url + "/v1/models")["data"][0]
        host = hardware()
        t = time.monotonic()
        phases["profile"] = [
            llm_profile.profile(
                url,
                max_num_seqs=engine["max_num_seqs"],
                capacity_tokens=engine["num_blocks"] * engine["block_size"],
                max_model_len=models["max_model_len"],
                seed=seed,
            )
        ]
        first = llm_profile.fit(phases["profile"][0])
        overheads = [measured_overhead(url, seed + k) for k in range(OVERHEAD_TIMES)]
        overhead = float(np.median(overheads))
        log(
            f"step time: {len(phases['profile'][0])} steps profiled in {time.monotonic() - t:.0f} s; "
            f"c0 {first['c0_ms']:.3f} ms, {first['decode_ms_per_seq']:.4f} ms a decode; a request's own "
            f"overhead {overhead:.2f} ms (the median of {', '.join(f'{o:.2f}' for o in overheads)})"
        )
        doc = scenario_dict(first, engine, rate_rps=1.0, duration_s=slice_s, warmup_s=warmup_s)
        # the knee: offer half again what the profile's fit can take, count completions
        offered = 1.5 * saturated_rate(doc, knee_s)
        t = time.monotonic()
        aged = age_engine(url, doc, offered, age_s, seed + 1)
        if age_s > 0:
            rates_seen = ", ".join(f"{x:.1f}" for x in aged["completed_rps"])
            log(f"aged: {time.monotonic() - t:.0f} s overloaded ({offered:.2f} req/s offered), completing {rates_seen}")
        knees = [measured_knee(url, doc, offered, knee_s, KNEE_SKIP_S, seed)]
        phases["knee"] = [step_records(url).assign(slice=1)]
        first_knee = knees[0]["completed_rps"]
        log(f"knee, first slice: measured {first_knee:.2f} req/s, offered {offered:.2f}")
        # the held-out levels and the knee again in rounds of short slices, each round in a
        # random order, so that a slow minute of the host falls on every one alike; each
        # round's levels are shares of the knee measured before it (one slice is the host's
        # minute: the first came out 4-22% above the run's mean in 8 of 9 runs)
        s = Scenario.model_validate(doc)
        rates: dict[float, list[float]] = {share: [] for share in LEVELS}
        for r in range(rounds):
            knee_so_far = float(np.mean([k["completed_rps"] for k in knees]))
            for item in rng.permutation(len(LEVELS) + 1):
                if item == len(LEVELS):
                    knees.append(measured_knee(url, doc, offered, knee_s, KNEE_SKIP_S, int(rng.integers(1 << 31))))
                    phases["knee"].append(step_records(url).assign(slice=len(phases["knee"]) + 1))
                    continue
                share = float(LEVELS[item])
                rates[share].append(share * knee_so_far)
                plan = llm_load.plan_from_scenario(s, share * knee_so_far, slice_s, rng)
                answers[share].append(llm_load.run(url, plan, seed=int(rng.integers(1 << 31))).assign(round=r))
                level = phases.setdefault(f"level {share:g}", [])
                level.append(step_records(url).assign(slice=len(level)))
            # written after every round: a run cut short (a lent GPU's minutes) keeps its whole rounds
            design = {
                "engine": engine,
                "device": device,
                "idle": idle,
                "model": models,
                "hardware": host,
                "workload": WORKLOAD,
                "slice_s": slice_s,
                "rounds": r + 1,
                "rounds_planned": rounds,
                "warmup_s": warmup_s,
                "overhead_ms": overhead,
                "overheads_ms": overheads,
                "age": aged,
            }
            measured = _save_measured(out, design, knee_s, knees, phases, answers, rates)
            log(f"round {r + 1} of {rounds} measured")
    return measured


def _save_measured(
    out: Path, design: dict, knee_s: float, knees: list[dict], phases: dict, answers: dict, rates: dict
) -> dict:
    """What :func:`measure_llm` measured so far (whole rounds), written to ``out``."""
    knee = {
        "offered_rps": knees[0]["offered_rps"],
        "completed_rps": float(np.mean([k["completed_rps"] for k in knees])),
        "slices_rps": [round(k["completed_rps"], 3) for k in knees],
        "slice_s": knee_s,
        "first_rps": knees[0]["completed_rps"],
        "requests": sum(k["requests"] for k in knees),
        "errors": sum(k["errors"] for k in knees),
    }
    # each phase's steps named by it: the drift between slices is measured within phases
    steps = pd.concat([pd.concat(v, ignore_index=True).assign(phase=k) for k, v in phases.items()], ignore_index=True)
    steps.to_csv(out / "steps.csv.gz", index=False)
    # every held-out request as the client measured it, its slice's plan included (a replay's trace)
    requests = pd.concat([pd.concat(v).assign(level=share) for share, v in answers.items()], ignore_index=True)
    requests.drop(columns=["itl_s"], errors="ignore").to_csv(out / "requests.csv.gz", index=False)
    warmup_s = design["warmup_s"]
    measured = {
        **design,
        "knee": knee,
        "levels": list(LEVELS),
        "rates_rps": {f"{share:g}": [round(x, 4) for x in v] for share, v in rates.items()},
        "percentiles": {
            f"{share:g}": llm_load.percentiles(pd.concat(answers[share], ignore_index=True), skip_s=warmup_s)
            for share in LEVELS
        },
    }
    (out / "measured.json").write_text(json.dumps(measured, indent=1) + "\n")
    return measured


def predict_llm(out: Path, *, replications: int = 20, log=print) -> dict:
    """Steps 5-6 from what :func:`measure_llm` wrote to ``out``: each held-out phase
    predicted by the step time fitted on every other phase's steps, judged, and the
    profile, the report and the scenario written. Returns the profile, its table too."""
    measured = json.loads((out / "measured.json").read_text())
    steps = pd.read_csv(out / "steps.csv.gz")
    engine = {k: v for k, v in measured["engine"].items() if k in ENGINE}
    knee, overhead = dict(measured["knee"]), measured["overhead_ms"]
    slice_s, rounds, warmup_s = measured["slice_s"], measured["rounds"], measured["warmup_s"]
    kind = instance_type(measured)

    def held_out(phase: str) -> tuple[dict, list[dict]]:
        """The scenario of the fit of every other phase, and the same on each of the phase's
        slices' own host speed (:func:`calibrate.llm_profile.slice_speeds`), in slice order."""
        got = {**fitted(steps[steps["phase"] != phase]), "overhead_ms": overhead}
        speeds = llm_profile.slice_speeds(steps, got, phase)
        host[phase] = [round(v, 4) for v in speeds.values()]

        def doc(fit: dict) -> dict:
            return scenario_dict(fit, engine, rate_rps=1.0, duration_s=slice_s, warmup_s=warmup_s, instance=kind)

        window = knee["slice_s"] if phase == "knee" else slice_s
        return doc(got), [doc(at_speed(got, v, window)) for v in speeds.values()]

    host: dict[str, list[float]] = {}
    knee_doc, knee_docs = held_out("knee")
    seeds = range(1, 1 + replications // 2)
    knee["simulated_rps"] = simulated_knee(knee_doc, knee["offered_rps"], knee["slice_s"], KNEE_SKIP_S, seeds)
    knee["error"] = knee["simulated_rps"] / knee["completed_rps"] - 1.0
    if len(knee_docs) == len(knee["slices_rps"]):
        knee["at_speed_rps"] = float(
            np.mean([simulated_knee(d, knee["offered_rps"], knee["slice_s"], KNEE_SKIP_S, seeds) for d in knee_docs])
        )
    sim_knee = f"simulated {knee['simulated_rps']:.2f} ({knee['error']:+.1%})"
    log(f"knee: measured {knee['completed_rps']:.2f} req/s, {sim_knee}")
    rows = []
    for share in measured["levels"]:
        rates = level_rates(measured, share)
        m = measured["percentiles"][f"{share:g}"]
        doc, docs = held_out(f"level {share:g}")
        sim = simulated(doc, rates, slice_s, warmup_s, range(1, 1 + replications))
        got = cells(share, rate := float(np.mean(rates)), m, sim, requests=m["requests"], errors=m["errors"])
        if len(docs) == len(rates):  # each slice again on its own host speed: what the model says given the host
            own = simulated(docs, rates, slice_s, warmup_s, range(1, 1 + replications))
            for row in got:
                row["at_speed_ms"] = float(own[f"{row['metric']}_p{row['q']}_ms"].median())
        rows += got
        log(
            f"level {share:.0%} ({rate:.2f} req/s): TTFT p50 {m['ttft_p50_ms']:.1f} ms measured, "
            f"{sim['ttft_p50_ms'].median():.1f} predicted; TPOT p50 {m['tpot_p50_ms']:.2f}, "
            f"{sim['tpot_p50_ms'].median():.2f}"
        )
    fit = {**fitted(steps), "overhead_ms": overhead}
    table = verdicts(pd.DataFrame(rows))
    profile = {
        "engine": engine,  # the scenario's batching fields (the judge's and the target's too)
        "device": device_of(measured),
        "idle": measured.get("idle", "sleep"),  # the calibrations before 2026-11-27 evening: asleep
        "model": measured["model"],
        "hardware": measured.get("hardware"),
        "workload": measured["workload"],
        "step_time": fit,
        "knee": knee,
        "levels": measured["levels"],
        "rates_rps": {f"{share:g}": level_rates(measured, share) for share in measured["levels"]},
        "levels_placed_by": "the knee so far" if measured.get("rates_rps") else "the first knee slice",
        "slice_s": slice_s,
        "rounds": rounds,
        "warmup_s": warmup_s,
        "age": measured.get("age", {"seconds": 0.0}),
        "replications": replications,
        "host_by_slice": host,
    }
    (out / "profile.json").write_text(json.dumps(profile, indent=1) + "\n")
    rate = 0.5 * knee["completed_rps"]
    (out / "scenario.yaml").write_text(
        f"# written by servesim calibrate llm: the tiny engine on {engine_on(measured)}\n"
        + yaml.safe_dump(
            scenario_dict(fit, engine, rate_rps=rate, duration_s=300, warmup_s=warmup_s, instance=kind),
            sort_keys=False,
        )
    )
    table.to_csv(out / "validation.csv", index=False)
    (out / "validation.md").write_text(markdown(profile, table))
    chart(table, out / "validation.png")
    return {**profile, "table": table}


def level_rates(measured: dict, share: float) -> list[float]:
    """The rates a level ran at, a round each (a run measured before the levels followed the
    knee measured so far: every round at ``share`` of the first knee slice)."""
    got = (measured.get("rates_rps") or {}).get(f"{share:g}")
    knee = measured["knee"]
    return list(got) if got else [share * knee.get("first_rps", knee["completed_rps"])] * measured["rounds"]


def default_folder(device: str) -> Path:
    """Where ``calibrate llm`` writes by default: ``calibrate/profiles/cpu-tiny-llm``, or on a
    GPU ``gpu-NAME-llm``, NAME the catalog's for it (``h100``) or its name's last word."""
    if device == "cpu":
        return Path("calibrate/profiles/cpu-tiny-llm")
    from calibrate.profile import hardware

    name = hardware()["gpu"]["name"] or "gpu"
    return Path(f"calibrate/profiles/gpu-{instance_for_gpu(name) or name.lower().split()[-1]}-llm")

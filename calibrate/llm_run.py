"""``servesim calibrate llm``: calibrate the simulator's LLM model against the tiny real engine.

1. Start ``servesim serve-llm`` (its own processes, on this machine).
2. Profile its step time through the server over a grid of workloads and fit the linear
   step model and its noise (:mod:`calibrate.llm_profile`).
3. Write the calibrated scenario: the engine's limits and KV blocks, the fitted step time,
   the workload's token lengths.
4. Find the knee, the most requests a second the engine sustains, by measurement: offer
   more than it can take, open loop, and count completions a second once it is full; the
   simulator's knee is the same count in the same design.
5. Validate on held-out levels at 30, 50, 70 and 85% of the measured knee: the open-loop
   generator's TTFT, TPOT and ITL percentiles against the simulator's, each prediction with
   the 90% interval of its spread over replications of the same design.
6. Write ``profile.json``, ``validation.md``, ``validation.png`` and ``scenario.yaml``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.servers import get_json, server

LEVELS = (0.3, 0.5, 0.7, 0.85)
QUANTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl")
ENGINE = {"num_blocks": 512, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 64}
WORKLOAD = {
    "prompt": {"mean": 256, "cv": 0.6, "min": 8, "max": 1024},
    "output": {"mean": 64, "cv": 0.6, "min": 2, "max": 256},
}


def server_args(engine: dict) -> list[str]:
    return [arg for k, v in engine.items() for arg in (f"--{k.replace('_', '-')}", str(v))]


def scenario_dict(fit: dict, engine: dict, *, rate_rps: float, duration_s: float, warmup_s: float) -> dict:
    """The calibrated scenario: the tiny engine on this machine (one replica), its fitted
    step time and noise, the workload's lengths."""
    coef = {k: round(fit[k], 9) for k in llm_profile.COEFFICIENTS}
    return {
        "name": "calibrated_tiny_llm",
        "description": "servesim serve-llm on this machine, calibrated by servesim calibrate llm",
        "seed": 1,
        "duration_s": float(duration_s),
        "warmup_s": float(warmup_s),
        "sla": {"percentile": 99, "target_ms": 60000, "ttft_ms": 300, "tpot_ms": 50},
        "traffic": {"rate_rps": round(float(rate_rps), 4), "tokens": WORKLOAD},
        "router": {"balancing": "round_robin"},
        "batching": {
            "kind": "continuous",
            "policy": "continuous",
            "model": "servesim-tiny",
            **engine,
            "enable_prefix_caching": True,
            "step_time": {"kind": "linear", **coef},
            "noise_cv": round(fit["noise_cv"], 4),
        },
        "workers": {"count": 1, "instance_type": "cpu"},
        "cost": {"price_per_hour_usd": 0.1},
    }


def at_rate(doc: dict, rate_rps: float, duration_s: float, warmup_s: float) -> dict:
    """The scenario ``doc`` at another rate and length."""
    traffic = {**doc["traffic"], "rate_rps": float(rate_rps)}
    return {**doc, "traffic": traffic, "duration_s": float(duration_s), "warmup_s": float(warmup_s)}


def _load(doc: dict):
    from simulator.scenario.loader import load_scenario

    path = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / f"servesim-llm-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        return load_scenario(path)
    finally:
        path.unlink()


def simulated(doc: dict, rate_rps: float, duration_s: float, warmup_s: float, seeds: range) -> pd.DataFrame:
    """The simulator's percentiles (ms) of the design at ``rate_rps``, one row per seed."""
    from simulator import simulate

    s = _load(at_rate(doc, rate_rps, duration_s, warmup_s))
    rows = []
    for seed in seeds:
        r = simulate(s, seed=seed).records
        keep = (r.arrival >= warmup_s * 1000.0) & (r.arrival < duration_s * 1000.0) & np.isfinite(r.t_response)
        ttft = (r.t_first_token - r.arrival)[keep]
        n_out = r.output_tokens[keep]
        tpot = ((r.t_response - r.t_first_token)[keep] / np.maximum(n_out - 1, 1))[n_out > 1]
        row = {"seed": seed, "requests": int(keep.sum())}
        for name, v in (("ttft", ttft), ("tpot", tpot)):
            for q in QUANTILES:
                row[f"{name}_p{q}_ms"] = float(np.percentile(v, q)) if len(v) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def simulated_knee(doc: dict, rate_rps: float, duration_s: float, skip_s: float, seeds: range) -> float:
    """Completions a second the simulator gives in the knee's design (offered ``rate_rps``,
    counted from ``skip_s`` to ``duration_s``), the median over seeds."""
    from simulator import simulate

    s = _load(at_rate(doc, rate_rps, duration_s * 3, 0.0))  # long enough for the backlog to drain
    got = []
    for seed in seeds:
        r = simulate(s, seed=seed).records
        arrived = r.arrival < duration_s * 1000.0
        done = r.t_response[arrived]
        got.append(np.count_nonzero((done >= skip_s * 1000.0) & (done < duration_s * 1000.0)) / (duration_s - skip_s))
    return float(np.median(got))


def measured_knee(url: str, doc: dict, rate_rps: float, duration_s: float, skip_s: float, seed: int) -> dict:
    """Offer ``rate_rps`` (more than the engine takes) for ``duration_s``; completions a
    second from ``skip_s`` to ``duration_s``."""
    s = _load(doc)
    plan = llm_load.plan_from_scenario(s, rate_rps, duration_s, np.random.default_rng(seed))
    df = llm_load.run(url, plan, seed=seed)
    done = (df["scheduled_s"] + df["e2e_s"]).to_numpy()
    n = np.count_nonzero((done >= skip_s) & (done < duration_s))
    return {
        "offered_rps": rate_rps,
        "completed_rps": n / (duration_s - skip_s),
        "requests": len(df),
        "errors": int(df["error"].notna().sum()),
    }


def calibrate_llm(
    out: Path,
    *,
    level_s: float = 60.0,
    warmup_s: float = 5.0,
    knee_s: float = 40.0,
    replications: int = 20,
    seed: int = 0,
    log=print,
) -> dict:
    """The whole calibration (see the module's docstring); returns the profile written."""
    out.mkdir(parents=True, exist_ok=True)
    engine = dict(ENGINE)
    with server(server_args(engine), command="serve-llm", health="/health") as url:
        models = get_json(url + "/v1/models")["data"][0]
        t = time.monotonic()
        steps = llm_profile.profile(
            url,
            max_num_seqs=engine["max_num_seqs"],
            capacity_tokens=engine["num_blocks"] * engine["block_size"],
            max_model_len=models["max_model_len"],
            seed=seed,
        )
        fit = llm_profile.fit(steps)
        log(
            f"step time: {len(steps)} steps profiled in {time.monotonic() - t:.0f} s; c0 {fit['c0_ms']:.3f} ms, "
            f"{fit['decode_ms_per_seq']:.4f} ms a decode, noise cv {fit['noise_cv']:.3f}, median error "
            f"{fit['median_abs_rel_error']:.1%}"
        )
        doc = scenario_dict(fit, engine, rate_rps=1.0, duration_s=level_s, warmup_s=warmup_s)
        # the knee: offer half again what the fitted model can take
        guess = simulated_knee(doc, 50.0, knee_s, 10.0, range(1, 4))
        offered = 1.5 * guess
        knee = measured_knee(url, doc, offered, knee_s, 10.0, seed)
        knee["simulated_rps"] = simulated_knee(doc, offered, knee_s, 10.0, range(1, 1 + replications // 2))
        knee["error"] = knee["simulated_rps"] / knee["completed_rps"] - 1.0
        log(
            f"knee: measured {knee['completed_rps']:.2f} req/s, simulated {knee['simulated_rps']:.2f} "
            f"({knee['error']:+.1%}), offered {offered:.2f}"
        )
        rows = []
        s = _load(doc)
        for k, share in enumerate(LEVELS):
            rate = share * knee["completed_rps"]
            plan = llm_load.plan_from_scenario(s, rate, level_s, np.random.default_rng(seed + 100 + k))
            measured = llm_load.percentiles(llm_load.run(url, plan, seed=seed + k), skip_s=warmup_s)
            sim = simulated(doc, rate, level_s, warmup_s, range(1, 1 + replications))
            for name in ("ttft", "tpot"):
                for q in QUANTILES:
                    col = f"{name}_p{q}_ms"
                    lo, mid, hi = np.nanpercentile(sim[col], [5, 50, 95])
                    rows.append(
                        {
                            "level": share,
                            "rate_rps": rate,
                            "metric": name,
                            "q": q,
                            "measured_ms": measured[col],
                            "predicted_ms": mid,
                            "lo_ms": lo,
                            "hi_ms": hi,
                            "requests": measured["requests"],
                            "errors": measured["errors"],
                        }
                    )
            log(
                f"level {share:.0%} ({rate:.2f} req/s): TTFT p50 {measured['ttft_p50_ms']:.1f} ms measured, "
                f"{sim['ttft_p50_ms'].median():.1f} predicted; TPOT p50 {measured['tpot_p50_ms']:.2f}, "
                f"{sim['tpot_p50_ms'].median():.2f}"
            )
    table = pd.DataFrame(rows)
    table["error"] = table["predicted_ms"] / table["measured_ms"] - 1.0
    table["inside"] = (table["measured_ms"] >= table["lo_ms"]) & (table["measured_ms"] <= table["hi_ms"])
    table["bound"] = np.where(table["q"] == 99, 0.20, 0.10)
    table["ok"] = (table["error"].abs() <= table["bound"]) | table["inside"]
    profile = {
        "engine": engine,
        "model": models,
        "workload": WORKLOAD,
        "step_time": fit,
        "knee": knee,
        "levels": list(LEVELS),
        "level_s": level_s,
        "warmup_s": warmup_s,
        "replications": replications,
    }
    (out / "profile.json").write_text(json.dumps(profile, indent=1) + "\n")
    (out / "scenario.yaml").write_text(
        "# written by servesim calibrate llm: the tiny engine on the machine that ran it\n"
        + yaml.safe_dump(
            scenario_dict(fit, engine, rate_rps=0.5 * knee["completed_rps"], duration_s=300, warmup_s=warmup_s),
            sort_keys=False,
        )
    )
    table.to_csv(out / "validation.csv", index=False)
    steps.to_csv(out / "steps.csv.gz", index=False)
    (out / "validation.md").write_text(markdown(profile, table))
    return {**profile, "table": table}


def markdown(profile: dict, table: pd.DataFrame) -> str:
    fit, knee = profile["step_time"], profile["knee"]
    lines = [
        "# The tiny LLM engine, calibrated",
        "",
        f"Step time (ms) = {fit['c0_ms']:.4f} + {fit['prefill_ms_per_token']:.5f}·P + "
        f"{fit['attention_ms_per_token2']:.3g}·Σp(ctx+p/2) + {fit['decode_ms_per_seq']:.4f}·D + "
        f"{fit['kv_ms_per_token']:.3g}·Σctx, noise cv {fit['noise_cv']:.3f}; fitted on {fit['steps']} steps "
        f"(median error {fit['median_abs_rel_error']:.1%}, p90 {fit['p90_abs_rel_error']:.1%}).",
        "",
        f"Knee: measured {knee['completed_rps']:.2f} req/s, simulated {knee['simulated_rps']:.2f} req/s "
        f"({knee['error']:+.1%}; target within 5%).",
        "",
        "| level | req/s | metric | measured ms | predicted ms (90% interval) | error | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.level:.0%} | {r.rate_rps:.2f} | {r.metric.upper()} p{r.q} | {r.measured_ms:.2f} | "
            f"{r.predicted_ms:.2f} ({r.lo_ms:.2f}–{r.hi_ms:.2f}) | {r.error:+.1%} | {'yes' if r.ok else 'no'} |"
        )
    return "\n".join(lines) + "\n"

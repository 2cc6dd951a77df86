"""``servesim calibrate judge``: the calibrated LLM scenario against a load generator
nobody here wrote.

GuideLLM (vLLM's project, ``pip install guidellm``) drives ``servesim serve-llm`` open
loop (Poisson arrivals) at two rates, with its own synthetic prompts and output lengths,
its own HTTP client (httpx) and its own clock; its JSON report gives each request's
lengths and timings and its percentiles. The calibrated scenario (``calibrate llm``'s
``profile.json``) then predicts the same run: the rate, the duration, each request's
prompt and output length as GuideLLM sent them (an empirical sample), from an idle start,
the requests GuideLLM completed within its duration, replicated for a 90% interval. The
generator's figures are compared in its own definitions:

- TTFT: its request start to its first token;
- ITL: (last token - first token) / (output tokens - 1), vLLM's TPOT (the simulator's);
- TPOT: (last token - request start) / output tokens, the first token included.

Then GuideLLM's concurrent profile (``--streams``): that many requests in flight, each
sent as the one before it ends, as ``vllm bench serve --max-concurrency`` runs. The
scenario predicts it as that many users of one-turn conversations with no think time
(``traffic.tokens.sessions.users``, ``turn_gap`` 0 ms after the answer): the same three
metrics, and the rate (requests completed within the run a second), which a concurrency
leaves to the server.

Why GuideLLM: it installs from the package index without CUDA (torch is already the CPU
wheel here), speaks OpenAI's API as vLLM's own benchmarks do, streams and times each
token, and runs a Poisson profile open loop. Its other needs are a tokenizer, which it
loads with ``transformers`` (no hub here: the engine's byte tokenizer is written as a
local one, so its token counts are the engine's) and a core: its default of ten worker
processes took both of this VM's cores from the server (TPOT 31.6 ms at 5 req/s against
2.3 with one), so it runs one worker on core 0, where the front end and our own
generator run too. AIPerf (NVIDIA's) would pin pandas 2.3 and pillow 12.3 and brings
Kubernetes and Dash; vLLM's ``bench serve`` needs vLLM (CUDA); inference-perf is not on
the index.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_profile, llm_server, llm_sim
from calibrate.guidellm import METRICS, byte_tokenizer, guidellm_command, requests, run_guidellm
from calibrate.servers import server
from calibrate.stats import replication_interval
from simulator.scenario.config import Scenario

QUANTILES = (50, 90, 99)


def predicted(doc: dict, measured: pd.DataFrame, rate_rps: float, duration_s: float, seeds: range) -> pd.DataFrame:
    """The calibrated scenario's percentiles of GuideLLM's three metrics, for the same run:
    Poisson at ``rate_rps`` from an idle start, the lengths GuideLLM sent, the requests done
    within ``duration_s``; one row per replication."""
    from simulator import simulate
    from simulator.results.tokens import tpot_ms, ttft_ms

    tokens = {
        "prompt": {"values": [int(v) for v in measured["prompt_tokens"]]},
        "output": {"values": [int(v) for v in measured["output_tokens"]]},
    }
    run = llm_sim.at_rate(doc, rate_rps, duration_s, 0.0)  # Poisson arrivals, the scenario's default
    s = Scenario.model_validate({**run, "traffic": {**run["traffic"], "tokens": tokens}})
    rows = []
    for seed in seeds:
        r = simulate(s, seed=seed).records
        keep = np.isfinite(r.t_response) & (r.t_response <= duration_s * 1000.0)
        ttft, itl = ttft_ms(r)[keep], tpot_ms(r)[keep]
        out = r.output_tokens[keep].astype(float)
        e2e = (r.t_response - r.arrival)[keep]
        values = {"ttft": ttft, "itl": itl[np.isfinite(itl)], "tpot": e2e / out}
        rows.append(
            {"seed": seed, **{f"{m}_p{q}_ms": float(np.percentile(v, q)) for m, v in values.items() for q in QUANTILES}}
        )
    return pd.DataFrame(rows)


def predicted_concurrent(doc: dict, measured: pd.DataFrame, streams: int, duration_s: float, seeds: range):
    """The calibrated scenario's percentiles of GuideLLM's three metrics and its rate for a
    concurrent run: ``streams`` users of one-turn conversations with no think time (each
    sends as its answer arrives), the lengths GuideLLM sent, the requests done within
    ``duration_s``; one row per replication."""
    from simulator import simulate
    from simulator.results.tokens import tpot_ms, ttft_ms

    sessions = {
        "users": int(streams),
        "turns": {"fixed": 1},
        "turn_gap": {"kind": "deterministic", "value_ms": 0},
        "turn_gap_from": "answer",
    }
    tokens = {
        "prompt": {"values": [int(v) for v in measured["prompt_tokens"]]},
        "output": {"values": [int(v) for v in measured["output_tokens"]]},
        "sessions": sessions,
    }
    run = {**doc, "duration_s": float(duration_s), "warmup_s": 0.0, "traffic": {"tokens": tokens}}
    s = Scenario.model_validate(run)
    rows = []
    for seed in seeds:
        r = simulate(s, seed=seed).records
        keep = np.isfinite(r.t_response) & (r.t_response <= duration_s * 1000.0)
        ttft, itl = ttft_ms(r)[keep], tpot_ms(r)[keep]
        e2e = (r.t_response - r.arrival)[keep]
        values = {"ttft": ttft, "itl": itl[np.isfinite(itl)], "tpot": e2e / r.output_tokens[keep].astype(float)}
        row = {f"{m}_p{q}_ms": float(np.percentile(v, q)) for m, v in values.items() for q in QUANTILES}
        rows.append({"seed": seed, **row, "rps": float(np.count_nonzero(keep)) / duration_s})
    return pd.DataFrame(rows)


def judge(
    profile_dir: Path,
    out: Path,
    *,
    shares: tuple[float, ...] = (0.3, 0.6),
    duration_s: float = 60.0,
    replications: int = 20,
    seed: int = 0,
    age_s: float | None = None,
    streams: tuple[int, ...] = (),
    log=print,
) -> pd.DataFrame:
    """GuideLLM at ``shares`` of the profile's knee against the scenario's prediction;
    writes ``judge.md``, ``judge.csv`` and GuideLLM's reports to ``out``. The engine is
    first aged as the profile's calibration aged it (``age_s`` seconds of overload; None:
    the profile's, :func:`calibrate.llm_server.age_engine`), so that both see the same engine."""
    guidellm_command()
    profile = json.loads((profile_dir / "profile.json").read_text())
    fit = {**profile["step_time"]}
    doc = llm_sim.scenario_dict(fit, profile["engine"], rate_rps=1.0, duration_s=duration_s, warmup_s=0.0)
    knee = profile["knee"]["completed_rps"]
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # where it was measured, idling as it did
    args = llm_server.profile_server_args(profile)
    with (
        tempfile.TemporaryDirectory(prefix="servesim-judge-") as tmp,
        server(args, command="serve-llm", health="/health") as url,
    ):
        scratch = Path(tmp)
        tokenizer = byte_tokenizer(scratch / "tokenizer")
        age_s = float((profile.get("age") or {}).get("seconds", 0.0)) if age_s is None else float(age_s)
        if age_s > 0:  # at the offer the calibration aged it and measured its knee with
            offered = float(profile["knee"]["offered_rps"])
            aging = llm_server.age_engine(url, doc, offered, age_s, seed + 1000)
            log(f"aged the engine: {age_s:g} s at {offered:.2f} req/s offered, drained after {aging['took_s']:.0f} s")
        for i, share in enumerate(shares):
            rate = share * knee
            llm_server.step_records(url)  # what came before
            report = run_guidellm(url, rate, duration_s, scratch / f"guidellm-{share:g}.json", tokenizer, seed + i)
            got = requests(report)
            # how the host ran against the profile: the engine's steps under this load, in log ratio
            # to the profile's fit (reported, not used: the prediction is the profile's alone)
            steps = llm_server.step_records(url)
            host = float(np.median(np.log(llm_profile.step_ms(steps) / llm_profile.predict_ms(fit, steps))))
            sim = predicted(doc, got, rate, duration_s, range(1, 1 + replications))
            got.to_csv(out / f"guidellm-{share:g}.csv.gz", index=False)
            for m in METRICS:
                for q in QUANTILES:
                    lo, mid, hi = replication_interval(sim[f"{m}_p{q}_ms"])
                    rows.append(
                        {
                            "share": share,
                            "rate_rps": rate,
                            "metric": m,
                            "q": q,
                            "guidellm_ms": float(np.percentile(got[m].dropna(), q)),
                            "guidellm_summary_ms": got.attrs["percentiles"][m][f"p{q}"],
                            "predicted_ms": mid,
                            "lo_ms": lo,
                            "hi_ms": hi,
                            "requests": len(got),
                            "errored": got.attrs["errored"],
                            "steps_vs_profile": np.expm1(host),
                        }
                    )
            log(
                f"{share:.0%} of the knee ({rate:.2f} req/s): GuideLLM completed {len(got)} requests; TTFT p50 "
                f"{got.attrs['percentiles']['ttft']['p50']:.1f} ms, predicted {sim['ttft_p50_ms'].median():.1f}; "
                f"ITL p50 {got.attrs['percentiles']['itl']['p50']:.2f}, predicted {sim['itl_p50_ms'].median():.2f}; "
                f"the engine's steps {np.expm1(host):+.1%} against the profile's fit"
            )
        for i, n in enumerate(streams):  # then a benchmark's concurrency: n in flight, no think time
            llm_server.step_records(url)
            report = run_guidellm(url, 0.0, duration_s, scratch / f"guidellm-c{n}.json", tokenizer, seed + 100 + i, n)
            got = requests(report)
            steps = llm_server.step_records(url)
            host = float(np.median(np.log(llm_profile.step_ms(steps) / llm_profile.predict_ms(fit, steps))))
            sim = predicted_concurrent(doc, got, n, duration_s, range(1, 1 + replications))
            got.to_csv(out / f"guidellm-c{n}.csv.gz", index=False)
            measured_rps = len(got) / duration_s
            common = {"share": np.nan, "streams": n, "rate_rps": measured_rps, "requests": len(got)}
            common |= {"errored": got.attrs["errored"], "steps_vs_profile": np.expm1(host)}
            lo, mid, hi = replication_interval(sim["rps"])
            rows.append(
                {**common, "metric": "rate", "q": 0, "guidellm_ms": measured_rps, "guidellm_summary_ms": np.nan}
                | {"predicted_ms": mid, "lo_ms": lo, "hi_ms": hi}
            )
            for m in METRICS:
                for q in QUANTILES:
                    lo, mid, hi = replication_interval(sim[f"{m}_p{q}_ms"])
                    rows.append(
                        {**common, "metric": m, "q": q, "guidellm_ms": float(np.percentile(got[m].dropna(), q))}
                        | {"guidellm_summary_ms": got.attrs["percentiles"][m][f"p{q}"]}
                        | {"predicted_ms": mid, "lo_ms": lo, "hi_ms": hi}
                    )
            log(
                f"{n} in flight: GuideLLM completed {len(got)} requests ({measured_rps:.2f} req/s, predicted "
                f"{sim['rps'].median():.2f}); TTFT p50 {got.attrs['percentiles']['ttft']['p50']:.1f} ms, predicted "
                f"{sim['ttft_p50_ms'].median():.1f}; the engine's steps {np.expm1(host):+.1%} against the profile's fit"
            )
    table = pd.DataFrame(rows)
    if "streams" not in table:
        table["streams"] = 0
    table["error"] = table["predicted_ms"] / table["guidellm_ms"] - 1.0
    table["inside"] = (table["guidellm_ms"] >= table["lo_ms"]) & (table["guidellm_ms"] <= table["hi_ms"])
    table["bound"] = np.where(table["q"] == 99, 0.20, 0.10)  # a concurrency's rate (q 0): 10%
    table["ok"] = (table["error"].abs() <= table["bound"]) | table["inside"]
    table.to_csv(out / "judge.csv", index=False)
    (out / "judge.md").write_text(markdown(table, profile_dir, duration_s, replications, age_s))
    return table


def markdown(table: pd.DataFrame, profile_dir: Path, duration_s: float, replications: int, aged_s: float = 0.0) -> str:
    aged = f", aged first by {aged_s:g} s of overload as the profile's calibration aged it" if aged_s > 0 else ""
    lines = [
        "# GuideLLM against the calibrated scenario",
        "",
        f"GuideLLM (Poisson, {duration_s:g} s a rate, one worker process on core 0) drove `servesim serve-llm`{aged}; "
        f"the scenario of `{profile_dir}` predicted the same runs (the lengths GuideLLM sent, an idle start), "
        f"median and 90% interval of {replications} replications. GuideLLM's per-request times, in its "
        "definitions: TTFT from its request start; ITL = (last - first token) / (tokens - 1), vLLM's TPOT; "
        "TPOT = (last token - start) / tokens; their percentiles over requests. GuideLLM's own summary "
        "(shown, not judged) weights ITL by tokens less one and TPOT by tokens, and takes "
        "each percentile as the first value whose cumulative share reaches it (no interpolation).",
        "",
        "| share of knee | req/s | metric | GuideLLM ms | its summary | predicted ms (90% interval) | error | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rated = table[table["streams"].fillna(0) == 0]
    for r in rated.itertuples():
        lines.append(
            f"| {r.share:.0%} | {r.rate_rps:.2f} | {r.metric.upper()} p{r.q} | {r.guidellm_ms:.2f} | "
            f"{r.guidellm_summary_ms:.2f} | "
            f"{r.predicted_ms:.2f} ({r.lo_ms:.2f}–{r.hi_ms:.2f}) | {r.error:+.1%} | {'yes' if r.ok else 'no'} |"
        )
    ok = int(rated["ok"].sum())
    lines += ["", f"{ok} of {len(rated)} percentiles within bound (10% at p50/p90, 20% at p99) or interval."]
    host = rated.groupby("share")["steps_vs_profile"].first()
    lines += [
        "",
        "The engine's steps during each run against the profile's fit (median ratio; the host's speed then, "
        "not used by the prediction): " + ", ".join(f"{k:.0%} of the knee {v:+.1%}" for k, v in host.items()) + ".",
    ]
    held = table[table["streams"].fillna(0) > 0]
    if len(held):
        lines += [
            "",
            "## A benchmark's concurrency",
            "",
            f"GuideLLM's concurrent profile ({duration_s:g} s each): that many requests in flight, each sent as the "
            "one before it ends. The scenario predicts it as that many users of one-turn conversations with no "
            "think time (`traffic.tokens.sessions.users`, `turn_gap` 0 ms after the answer), the lengths "
            "GuideLLM sent, from an idle start; the rate is what each completed within the run.",
            "",
            "| in flight | metric | GuideLLM | its summary | predicted (90% interval) | error | ok |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in held.itertuples():
            what = "req/s" if r.metric == "rate" else f"{r.metric.upper()} p{r.q} ms"
            summary = "" if r.metric == "rate" else f"{r.guidellm_summary_ms:.2f}"
            lines.append(
                f"| {r.streams:.0f} | {what} | {r.guidellm_ms:.2f} | {summary} | {r.predicted_ms:.2f} "
                f"({r.lo_ms:.2f}–{r.hi_ms:.2f}) | {r.error:+.1%} | {'yes' if r.ok else 'no'} |"
            )
        ok = int(held["ok"].sum())
        lines += [
            "",
            f"{ok} of {len(held)} within bound (10% at p50/p90 and the rate, 20% at p99) or interval. The engine's "
            "steps against the profile's fit: "
            + ", ".join(
                f"{n:.0f} in flight {v:+.1%}" for n, v in held.groupby("streams")["steps_vs_profile"].first().items()
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"

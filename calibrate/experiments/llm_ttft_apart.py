"""A light level's TTFT taken apart request by request (calibrate/README, "The light
level's TTFT, request by request"): the predicted TTFT p50 at 30% of the knee came out
below the measured in 8 of 9 runs. Is the gap in the steps or outside them?

A calibration folder holds every request of a level (its schedule, lengths and the
client's TTFT) and every step the engine took then. At the held-out levels no prompt is
served from the prefix cache (each slice's prompt tokens equal its steps' prefill
tokens), so each request's prefill is found in the steps by consuming prompt tokens in
arrival order, chunk by chunk. A request's TTFT then splits into *its prefill steps*
(from the cycle start of the step its prefill began in to the end of the step that gave
its first token) and *the rest* (before that step: the way in and the wait for the step
in flight; after it: the token's way back and the stream). The same requests go through
the simulator's replica with the folder's calibrated scenario (fitted step time and its
wake cost, the measured overhead added on the way in; no noise, no speed process), which
splits its TTFT the same way. Printed per folder and level: both splits' p50, p90 and
mean, the rest's difference request by request, by whether the engine had idled just
before the request's first step, and its correlation with how late the load generator
started the request (the ``sent`` column); where the server timed each first token (runs
since ``servesim_timing``), the way in and out and the hand-over's wait as it measured them.

    python calibrate/experiments/llm_ttft_apart.py FOLDER [FOLDER ...] [--level 0.3]   # seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_profile
from simulator.scenario.config import Scenario
from simulator.serving.continuous import LLMService
from simulator.serving.llm_replica import Replica


def measured_split(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` (one slice's, any order) with, from the slice's ``steps``: ``mid_ms``
    (its prefill steps: the first one's cycle start to the token-giving one's end) and
    ``idle_before`` (the engine idled just before its first step)."""
    rq = requests.sort_values("scheduled_s").reset_index(drop=True)
    st = steps.reset_index(drop=True)
    if st["prefill_tokens"].sum() != rq["prompt_tokens"].sum():
        raise ValueError("the slice's prefill tokens are not its prompts' (a prefix-cache hit?): cannot align")
    first, last = np.full(len(rq), -1), np.full(len(rq), -1)
    left = rq["prompt_tokens"].to_numpy().copy()
    j = 0
    for i in np.flatnonzero(st["prefill_tokens"].to_numpy() > 0):
        p = int(st.at[i, "prefill_tokens"])
        while p > 0 and j < len(rq):
            if first[j] < 0:
                first[j] = i
            take = min(p, left[j])
            left[j] -= take
            p -= take
            if left[j] == 0:
                last[j] = i
                j += 1
    gap = (st["begin_ns"].to_numpy()[1:] - st["done_ns"].to_numpy()[:-1]) / 1e6
    gap = np.concatenate([[np.inf], gap])
    rq["mid_ms"] = (st["done_ns"].to_numpy()[last] - st["begin_ns"].to_numpy()[first]) / 1e6
    rq["idle_before"] = gap[first] > llm_profile.WAKE_GAP_MS
    return rq


def replayed(scenario, at_ms: np.ndarray, prompt, output) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests arriving at ``at_ms`` (in order) through one replica of ``scenario`` (no
    noise, no speed process), started empty: when each one's first step began, when its
    first token came and when its last did (ms), in the order given."""
    svc = LLMService.of(scenario.batching, scenario.workers.instance_type, np.random.default_rng(0))
    rep = Replica(svc.policy, svc.step, svc.limits)
    for i, (t, p, o) in enumerate(zip(at_ms, prompt, output, strict=True)):
        rep.push(i, float(t), int(p), int(o))
    rep.advance()
    f = rep.finished()
    o = np.argsort(f.rid)
    return f.start[o], f.first_token[o], f.done[o]


def simulated_split(scenario, overhead_ms: float, rq: pd.DataFrame) -> pd.DataFrame:
    """The same requests through the replica, each arriving ``overhead_ms`` after its
    scheduled time: each one's TTFT and prefill steps (ms), as :func:`measured_split`'s."""
    at = rq["scheduled_s"].to_numpy() * 1000.0
    start, first, _ = replayed(scenario, at + overhead_ms, rq["prompt_tokens"], rq["output_tokens"])
    return pd.DataFrame({"sim_ttft_ms": first - at, "sim_mid_ms": first - start})


def apart(folder: Path, level: float) -> pd.DataFrame:
    """Every request of ``level`` in the calibration ``folder``, measured and simulated."""
    steps = pd.read_csv(folder / "steps.csv.gz")
    requests = pd.read_csv(folder / "requests.csv.gz")
    scenario = Scenario.model_validate(yaml.safe_load((folder / "scenario.yaml").read_text()))
    overhead = json.loads((folder / "measured.json").read_text())["overhead_ms"]
    out = []
    for rnd, g in requests[(requests["level"] == level) & requests["error"].isna()].groupby("round"):
        st = steps[(steps["phase"] == f"level {level:g}") & (steps["slice"] == rnd)]
        rq = measured_split(st, g)
        out.append(pd.concat([rq, simulated_split(scenario, overhead, rq)], axis=1))
    df = pd.concat(out, ignore_index=True)
    df["ttft_ms"] = df["ttft_s"] * 1000.0
    df["rest_ms"] = df["ttft_ms"] - df["mid_ms"]
    df["sim_rest_ms"] = df["sim_ttft_ms"] - df["sim_mid_ms"]
    df.attrs["overhead_ms"] = overhead
    return df


def _row(name: str, a: pd.Series, b: pd.Series) -> str:
    q = np.percentile
    return (
        f"  {name:15s} measured p50 {q(a, 50):6.2f} p90 {q(a, 90):6.2f} mean {a.mean():6.2f} | "
        f"simulated p50 {q(b, 50):6.2f} p90 {q(b, 90):6.2f} mean {b.mean():6.2f}"
    )


def main(folders: list[Path], level: float) -> None:
    for folder in folders:
        df = apart(folder, level)
        d = df["rest_ms"] - df["sim_rest_ms"]
        lines = [
            f"{folder}, level {level:g}: {len(df)} requests (ms)",
            _row("TTFT", df["ttft_ms"], df["sim_ttft_ms"]),
            _row("prefill steps", df["mid_ms"], df["sim_mid_ms"]),
            _row("the rest", df["rest_ms"], df["sim_rest_ms"]),
        ]
        for name, m in (("engine idle before", df["idle_before"]), ("engine busy", ~df["idle_before"])):
            lines.append(
                f"  the rest, measured - simulated, {name}: {m.sum()} requests, mean {d[m].mean():.2f}, "
                f"p50 {np.median(d[m]):.2f}, p90 {np.percentile(d[m], 90):.2f}"
            )
        lines.append(
            f"  the load generator started them late by p50 {df['sent'].median() * 1e3:.2f}, p90 "
            f"{df['sent'].quantile(0.9) * 1e3:.2f}; its lateness and the rest's difference correlate at "
            f"{np.corrcoef(d, df['sent'])[0, 1]:.2f}"
        )
        if "in_ms" in df and df["in_ms"].notna().any():  # runs since the server times each first token
            outside = df[["in_ms", "handler_ms", "back_ms", "out_ms"]].sum(axis=1, min_count=4).dropna()
            lines.append(
                f"  the server's timing: the way in and out (in, handler, back, out) mean {outside.mean():.2f}, "
                f"p90 {outside.quantile(0.9):.2f}, against the overhead {df.attrs['overhead_ms']:.2f}; the pipe and "
                f"the step in flight (to_engine) mean {df['to_engine_ms'].mean():.2f}"
            )
        print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--level", type=float, default=0.3, help="the held-out level (default 0.3)")
    a = p.parse_args()
    main(a.folders, a.level)

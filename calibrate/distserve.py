"""Predict DistServe's published runs of real vLLM from its step-time profile alone.

``../shared/data/distserve/`` holds runs of vLLM 0.1.7 serving OPT-13B on one A100-80GB
(ShareGPT requests, Poisson arrivals at 1-4 req/s; each request's arrival, lengths, first
token and completion), beside the step-time fits DistServe profiled on that GPU. This
replays each run's exact arrivals and lengths through one ``prefill_first`` replica
(:func:`simulator.serving.llm_serve.serve`) with the engine's launch flags, its step
time taken from the profile file and never from the runs, and compares TTFT and TPOT at
p50 and p90, and where the knee lies.

DistServe's own simulator adds terms on top of its fits (1 ms a prefill step, and 2 ms +
1e-4 ms a context token each step, its "Ray overhead"; the data's README). ``--overheads``
adds them, as a sensitivity: they are DistServe's published terms, not fitted here.

    python -m calibrate.distserve                      # the table, profile alone
    python -m calibrate.distserve --overheads          # with DistServe's simulator terms
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.serving.llm_serve import serve
from simulator.serving.llm_types import Limits
from simulator.serving.step_time import StepTime, Work

DATA = Path(__file__).resolve().parents[2] / "shared/data/distserve"
PROFILE = "profile/profiler-a100-80g.vllm.4c68ed9.json"
# the launch flags (--block-size 16 --max-num-batched-tokens 16384 --max-num-seqs 1024);
# the KV block count was not recorded: 80 GB x 0.9 less 26 GB of weights (the data's README)
LIMITS = Limits(num_blocks=3509, block_size=16, max_num_batched_tokens=16384, max_num_seqs=1024)


@dataclass(frozen=True)
class WithOverheads:
    """DistServe's simulator's terms on top of a profile: ``prefill_ms`` a prefill step,
    ``step_ms`` + ``context_ms`` a context token every step."""

    base: StepTime
    prefill_ms: float = 1.0
    step_ms: float = 2.0
    context_ms: float = 1e-4

    def ms(self, work: Work) -> float:
        context = work.decode_context + work.prefill_tokens
        extra = self.step_ms + self.context_ms * context + (self.prefill_ms if work.chunks else 0.0)
        return self.base.ms(work) + extra


@dataclass
class Run:
    name: str
    rate: float
    arrival_ms: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray


def read_run(path: Path) -> Run:
    """One ``vllm-<N>-<rate>.exp`` file: its first line is a Python literal (read with
    ``ast.literal_eval``), rows sorted here by issue time."""
    rows = sorted(ast.literal_eval(path.read_text().splitlines()[0]), key=lambda r: r["issue_time"])
    t0 = rows[0]["issue_time"]
    col = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    out = col["output_len"].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (col["complete_time"] - col["first_token_time"]) * 1000 / (out - 1), np.nan)
    return Run(
        path.stem,
        float(path.stem.split("-")[2]),
        (col["issue_time"] - t0) * 1000,
        col["prompt_len"].astype(np.int64),
        out,
        (col["first_token_time"] - col["issue_time"]) * 1000,
        tpot,
    )


def runs(data: Path = DATA) -> list[Run]:
    files = sorted((data / "ground-truth").glob("vllm-*.exp"), key=lambda p: (float(p.stem.split("-")[2]), p.stem))
    return [read_run(f) for f in files]


def predict(run: Run, step, limits: Limits = LIMITS) -> tuple[np.ndarray, np.ndarray, int]:
    """The replica's TTFT and TPOT for the run's requests (ms), and its preemptions."""
    got = serve(run.arrival_ms, run.prompt, run.output, step, limits, "prefill_first")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(run.output > 1, (got.done - got.first_token) / (run.output - 1), np.nan)
    return got.first_token - run.arrival_ms, tpot, int(got.preemptions.sum())


def table(data: Path = DATA, *, overheads: bool = False, blocks: int = LIMITS.num_blocks) -> list[dict]:
    """One row per run: measured and predicted TTFT and TPOT at p50 and p90 (ms)."""
    step = StepTime.distserve(data / PROFILE, "facebook/opt-13b")
    model = WithOverheads(step) if overheads else step
    limits = Limits(**{**LIMITS.__dict__, "num_blocks": blocks})
    rows = []
    for r in runs(data):
        ttft, tpot, pre = predict(r, model, limits)
        row = {"run": r.name, "rate": r.rate, "requests": len(r.prompt), "preemptions": pre}
        for name, meas, pred in (("ttft", r.ttft_ms, ttft), ("tpot", r.tpot_ms, tpot)):
            for q in (50, 90):
                row[f"{name}_p{q}"] = (float(np.nanpercentile(meas, q)), float(np.nanpercentile(pred, q)))
        rows.append(row)
    return rows


def knee(rows: list[dict], which: int, factor: float = 3.0) -> float | None:
    """The lowest rate whose TTFT p90 is over ``factor`` times the lowest rate's
    (``which``: 0 measured, 1 predicted)."""
    base = rows[0]["ttft_p90"][which]
    for row in rows:
        if row["ttft_p90"][which] > factor * base:
            return row["rate"]
    return None


def markdown(rows: list[dict]) -> str:
    head = "| run | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 |\n|---|---|---|---|---|"
    lines = [head]
    for row in rows:
        cells = []
        for key in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"):
            m, p = row[key]
            cells.append(
                f"{m:,.0f} / {p:,.0f} ({(p - m) / m:+.0%})"
                if key.startswith("ttft")
                else f"{m:.1f} / {p:.1f} ({(p - m) / m:+.0%})"
            )
        lines.append(f"| {row['run']} | " + " | ".join(cells) + " |")
    lines.append(
        f"\nmeasured / predicted, ms. Knee (TTFT p90 over 3x the 1 req/s run's): measured at "
        f"{knee(rows, 0)} req/s, predicted at {knee(rows, 1)} req/s."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the DistServe data folder")
    ap.add_argument("--overheads", action="store_true", help="add DistServe's simulator terms to the profile")
    ap.add_argument("--blocks", type=int, default=LIMITS.num_blocks, help="KV blocks (not recorded; 3,509 default)")
    args = ap.parse_args(argv)
    if not (args.data / PROFILE).exists():
        ap.error(f"no DistServe data at {args.data} (expected {PROFILE} there)")
    sys.stdout.write(markdown(table(args.data, overheads=args.overheads, blocks=args.blocks)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

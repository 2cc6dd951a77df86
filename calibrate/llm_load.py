"""An open-loop load generator for OpenAI-compatible LLM servers, timed token by token.

Requests are scheduled in advance (Poisson or gamma arrivals at a rate, with prompt and
output lengths drawn from a scenario's distributions) and each is sent at its scheduled
time whether or not earlier ones have finished; its times are measured from the
*scheduled* time, so a stalled client or server shows as latency instead of lowering the
offered load (no coordinated omission). A request asks for exactly its output length
(``max_tokens`` with ``ignore_eos``) and streams; the client notes when each token's chunk
arrives: time to first token, every inter-token gap, the end.

Prompts are lists of random token ids (the server's tokens are bytes), so their lengths
are exact and no two share a prefix unless a caller wants them to.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Plan:
    """What to send: offsets from the start (s), prompt and output tokens per request."""

    at_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.at_s)


def arrivals(rate_rps: float, n: int, rng: np.random.Generator, *, cv: float = 1.0) -> np.ndarray:
    """``n`` arrival offsets (s) at ``rate_rps``: Poisson (``cv`` 1) or gamma gaps of that cv."""
    if rate_rps <= 0 or n < 0:
        raise ValueError(f"need a positive rate and a count, not {rate_rps} and {n}")
    if cv == 1.0:
        gaps = rng.exponential(1.0 / rate_rps, n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), n)
    return np.cumsum(gaps)


def plan_from_scenario(scenario, rate_rps: float, duration_s: float, rng: np.random.Generator) -> Plan:
    """Arrivals at ``rate_rps`` over ``duration_s`` with prompt and output lengths drawn from
    the scenario's ``traffic.tokens`` (the same distributions the simulator draws)."""
    t = arrivals(rate_rps, int(rate_rps * duration_s * 1.5) + 10, rng)
    t = t[t < duration_s]
    lengths = scenario.traffic.tokens.lengths()
    prompt = lengths[0].sample(len(t), rng)
    output = lengths[1].sample(len(t), rng)
    return Plan(t, np.asarray(prompt, dtype=np.int64), np.maximum(np.asarray(output, dtype=np.int64), 1))


PARTS = ("in_ms", "handler_ms", "to_engine_ms", "queue_ms", "prefill_ms", "back_ms", "out_ms")


def first_token_parts(timing: dict, scheduled: float, first: float) -> dict[str, float]:
    """A request's TTFT in its parts (ms), from the server's ``servesim_timing`` (servesim
    serve-llm's, CLOCK_MONOTONIC ns) and the client's scheduled and first-token times
    (``time.perf_counter`` s, the same clock on Linux): ``in_ms`` the client's lateness and
    HTTP to the front end's handler; ``handler_ms`` the handler until it hands the request
    to the engine's process (the body, its checks, the response's start); ``to_engine_ms``
    until the engine takes it in (the pipe, and the engine's step in flight); ``queue_ms``
    there until its first forward pass began; ``prefill_ms`` the passes up to its first
    token; ``back_ms`` the token's way to the front end; ``out_ms`` the stream to the
    client. They sum to the TTFT. Empty where the server's clock is not this host's."""
    t = [scheduled * 1e9, *(timing.get(k, 0) for k in ("arrival_ns", "sent_ns", "received_ns", "scheduled_ns",
         "first_ns", "frontend_first_ns")), first * 1e9]  # fmt: skip
    gaps = np.diff(np.asarray(t, dtype=float)) / 1e6
    if not all(t[1:-1]) or gaps.min() < -1.0 or gaps.max() > 3.6e6:  # not this host's clock
        return {}
    return dict(zip(PARTS, gaps.tolist(), strict=True))


class _LateFirstToken(Exception):
    """The first token was read after its deadline: the loop was busy past the timer."""


async def _one(
    session,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    scheduled: float,
    row: dict,
    first_token_timeout_s: float | None = None,
):
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    row["sent"] = time.perf_counter() - scheduled
    stamps, timing = [], None
    loop = asyncio.get_running_loop()
    deadline = None  # on the loop's clock
    if first_token_timeout_s is not None:
        deadline = loop.time() + (scheduled + first_token_timeout_s - time.perf_counter())
    try:
        async with asyncio.timeout_at(deadline) as first_token:
            async with session.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    row["error"] = f"HTTP {r.status}: {(await r.text())[:200]}"
                    return
                async for line in r.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    now = time.perf_counter()
                    chunk = json.loads(line[6:])
                    if chunk.get("choices"):
                        if not stamps:
                            if deadline is not None and now - scheduled > first_token_timeout_s:
                                # read after the deadline on a busy loop, before its timer ran
                                raise _LateFirstToken
                            first_token.reschedule(None)  # the deadline is the first token's only
                        stamps.append(now)
                    elif "error" in chunk:
                        row["error"] = chunk["error"].get("message", "error")
                    elif "servesim_timing" in chunk:
                        timing = chunk["servesim_timing"]
    except (TimeoutError, _LateFirstToken) as err:
        if not (first_token.expired() or isinstance(err, _LateFirstToken)):  # a failure as any other
            row["error"] = f"{type(err).__name__}: {err}"
            return
        row.update(error=f"no first token in {first_token_timeout_s:g} s", timed_out=True, ttft_s=first_token_timeout_s)
        return
    except Exception as err:  # the connection failed: counted, not raised
        row["error"] = f"{type(err).__name__}: {err}"
        return
    row["tokens"] = len(stamps)
    if stamps and timing:
        row.update(first_token_parts(timing, scheduled, stamps[0]))
    if stamps:
        row["ttft_s"] = stamps[0] - scheduled
        row["e2e_s"] = stamps[-1] - scheduled
        itl = np.diff(stamps)
        row["itl_s"] = itl
        row["tpot_s"] = float(itl.mean()) if len(itl) else np.nan


async def _run(
    url: str, plan: Plan, model: str, rng: np.random.Generator, lead_s: float, first_token_timeout_s: float | None
) -> pd.DataFrame:
    import aiohttp

    rows = [
        {"prompt_tokens": int(p), "output_tokens": int(o), "error": None, "timed_out": False}
        for p, o in zip(plan.prompt, plan.output, strict=True)
    ]
    prompts = [rng.integers(1, 256, int(p)).tolist() for p in plan.prompt]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.perf_counter() + lead_s
        tasks = []
        for i, at in enumerate(plan.at_s):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rows[i]["scheduled_s"] = float(at)
            tasks.append(
                asyncio.create_task(
                    _one(
                        session, url, model, prompts[i], int(plan.output[i]), start + at, rows[i], first_token_timeout_s
                    )
                )
            )
        await asyncio.gather(*tasks)
    return pd.DataFrame(rows)


def run(
    url: str,
    plan: Plan,
    *,
    model: str = "servesim-tiny",
    seed: int = 0,
    lead_s: float = 0.2,
    first_token_timeout_s: float | None = None,
) -> pd.DataFrame:
    """Send ``plan`` to ``url`` open loop; one row per request: its lengths, when it was
    scheduled, how late it was sent, its tokens, TTFT, TPOT (vLLM's: the mean gap after
    the first token), E2E (from the scheduled time) and every inter-token gap.

    ``first_token_timeout_s``: a request without its first token this long after its
    scheduled time is cancelled (the server aborts it when the connection closes), its
    ``error`` says so, ``timed_out`` is True and ``ttft_s`` holds the timeout, a lower bound
    of its TTFT. An overload far past the knee then drains in seconds instead of minutes."""
    if first_token_timeout_s is not None and not first_token_timeout_s > 0:
        raise ValueError(f"first_token_timeout_s must be above 0, not {first_token_timeout_s!r}")
    return asyncio.run(_run(url, plan, model, np.random.default_rng(seed), lead_s, first_token_timeout_s))


def percentiles(df: pd.DataFrame, *, skip_s: float = 0.0) -> dict[str, float]:
    """TTFT, TPOT and ITL p50/p90/p99 (ms) of the requests scheduled from ``skip_s`` on."""
    ok = df[(df["error"].isna()) & (df["scheduled_s"] >= skip_s)]
    out: dict[str, float] = {"requests": float(len(ok)), "errors": float(df["error"].notna().sum())}
    itl = np.concatenate([v for v in ok["itl_s"] if isinstance(v, np.ndarray) and len(v)] or [np.zeros(0)])
    for name, values in (("ttft", ok["ttft_s"].to_numpy()), ("tpot", ok["tpot_s"].dropna().to_numpy()), ("itl", itl)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}_ms"] = float(np.percentile(values, q) * 1000.0) if len(values) else np.nan
    return out

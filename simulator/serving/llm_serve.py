"""Serving a whole run's requests on one LLM replica, in one call: what became of each.

:func:`serve` pushes every request into a :class:`~simulator.serving.llm_replica.Replica`,
runs it to the end and hands back per-request columns in request order. It is what the
DistServe check (:mod:`calibrate.distserve`), the tests and the benchmarks call; a pool of
replicas fed chunk by chunk (:mod:`simulator.serving.continuous`) drives replicas itself.
:func:`refuse` decides, before anything runs, which requests a replica can never serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.scenario.llm import Policy
from simulator.serving.llm_replica import Replica
from simulator.serving.llm_types import Limits, Steps
from simulator.serving.replica_scheduler import replica_scheduler
from simulator.serving.step_time import StepModel


@dataclass
class Served:
    """What became of each request (request order): when its first token and its last were
    produced (ms, NaN if never), and how often it was preempted."""

    first_token: np.ndarray
    done: np.ndarray
    preemptions: np.ndarray
    ignored: np.ndarray  # dropped: preempted with more tokens than a prefill may hold (vLLM's "ignored")
    steps: int  # steps the engine ran
    start: np.ndarray | None = None  # when its first step started
    cached_tokens: np.ndarray | None = None
    log: Steps | None = None
    max_itl: np.ndarray | None = None  # its worst inter-token latency (ms)
    gaps: list[tuple[float, float, int]] | None = None  # (when, gap, tokens): every token's gap after its last


def refuse(prompt: np.ndarray, output: np.ndarray, limits: Limits, policy: Policy) -> None:
    """Raise ValueError, naming the first such request, for one a replica can never serve:
    no output token, more tokens than the KV cache holds, or (prefill first, whole prompts)
    a prompt over ``max_num_batched_tokens``."""
    if len(output) and output.min() < 1:
        raise ValueError(f"request {int(np.argmin(output))} asks for {int(output.min())} output tokens; at least 1")
    capacity = limits.num_blocks * limits.block_size
    too_long = np.flatnonzero(prompt + output > capacity)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(
            f"request {i}: {int(prompt[i])} prompt + {int(output[i])} output tokens can never fit the "
            f"KV cache ({limits.num_blocks} blocks of {limits.block_size} = {capacity} tokens)"
        )
    replica_scheduler(policy, limits).refuse(prompt, limits)


def serve(
    arrival_ms: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    step: StepModel,
    limits: Limits,
    policy: Policy = "continuous",
    *,
    groups: np.ndarray | None = None,
    shared_tokens: np.ndarray | None = None,
    noise=None,
    skip: bool = True,
    speed=None,
) -> Served:
    """Serve requests arriving at ``arrival_ms`` (sorted) with ``prompt`` and ``output``
    token counts on one replica under ``policy``; ``groups`` (a prefix group per request,
    -1 for none) with ``shared_tokens`` name shared prompt prefixes; ``skip`` takes
    decode-only stretches in one go (the same steps exactly). Raises ValueError,
    before serving, for a request the replica can never serve (:func:`refuse`)."""
    n = len(arrival_ms)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    refuse(prompt, output, limits, policy)
    rep = Replica(policy, step, limits, noise, skip=skip, speed=speed)
    for i in range(n):
        g = None if groups is None or groups[i] < 0 else int(groups[i])
        rep.push(
            i,
            float(arrival_ms[i]),
            int(prompt[i]),
            int(output[i]),
            g,
            0 if shared_tokens is None else int(shared_tokens[i]),
        )
    rep.advance()
    f = rep.finished()
    out = {k: np.full(n, np.nan) for k in ("first", "done", "start", "itl")}
    pre, cached = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    ign = np.zeros(n, dtype=bool)
    out["first"][f.rid], out["done"][f.rid], out["start"][f.rid] = f.first_token, f.done, f.start
    out["itl"][f.rid] = f.max_itl
    pre[f.rid], cached[f.rid], ign[f.rid] = f.preemptions, f.cached_tokens, f.ignored
    log, gaps = rep.step_log(), rep.token_gaps()
    return Served(out["first"], out["done"], pre, ign, rep.steps, out["start"], cached, log, out["itl"], gaps)


def serve_prefill_first(arrival_ms, prompt, output, step: StepModel, limits: Limits) -> Served:
    """:func:`serve` with vLLM 0.1.7's policy (DistServe's runs)."""
    return serve(arrival_ms, prompt, output, step, limits, "prefill_first")


__all__ = ["Served", "refuse", "serve", "serve_prefill_first"]

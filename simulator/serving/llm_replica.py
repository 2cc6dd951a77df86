"""One LLM replica stepping as vLLM 0.1.7 does (``prefill_first``), over the paged KV cache.

Each iteration of the engine is one *step* on the GPU, of one of two kinds, never mixed:

- **prefill**: waiting requests are admitted first come, first served, whole prompts, while
  their blocks fit above a watermark of free blocks, their prompt tokens fit
  ``max_num_batched_tokens`` and the running sequences fit ``max_num_seqs``; admission
  stops at the first request that does not fit. The step computes their prompts; each
  admitted request has its first output token when the step ends (its TTFT).
- **decode**: when nothing can be admitted, every running sequence computes one more token.
  Going through them in arrival order, each needs a free block (vLLM 0.1.7 asks one per
  sequence); without one, the latest arrival not yet served this step (or the sequence
  itself, if none is left) is preempted by recompute: its blocks are freed and it goes back
  to the front of the waiting queue, to prefill its prompt and the tokens it had generated
  again.

A step's time is a fitted function of its work (:class:`StepTime`, DistServe's form). With
nothing running and nothing waiting, the replica idles until the next arrival. The output
length is not the scheduler's to know: a sequence simply stops when it has produced it.

This is the policy DistServe's runs of vLLM used (``../shared/data/distserve``), kept here
to predict them from the profiles; the ``continuous`` policy of vLLM V1 (chunked prefill,
prefill and decode mixed) builds on the same cache.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.serving.kv_cache import KVCache


@dataclass(frozen=True)
class StepTime:
    """Step time (ms) as DistServe fits it on a GPU: a prefill of prompts ``l`` takes
    ``a + b·Σl + c·Σl²``; a decode of ``B`` sequences with contexts ``ctx`` takes
    ``a + b·Σctx + c·B``, with one row for ``B`` below ``threshold`` and another from it."""

    prefill: tuple[float, float, float]
    decode_small: tuple[float, float, float]
    decode_large: tuple[float, float, float]
    threshold: int

    def prefill_ms(self, lengths: list[int]) -> float:
        a, b, c = self.prefill
        return a + b * sum(lengths) + c * sum(x * x for x in lengths)

    def decode_ms(self, context_tokens: int, batch: int) -> float:
        a, b, c = self.decode_small if batch < self.threshold else self.decode_large
        return a + b * context_tokens + c * batch

    @classmethod
    def distserve(cls, path: str | Path, model: str, tensor_parallel: int = 1) -> StepTime:
        """The fits of a DistServe profile file (``profiler-*.json``) for ``model``."""
        doc = json.loads(Path(path).read_text())
        try:
            row = doc[model][str(tensor_parallel)]
        except KeyError:
            raise ValueError(f"{path}: no profile for {model!r} at tensor parallel {tensor_parallel}") from None
        return cls(
            tuple(row["prefill"]),
            tuple(row["decoding_smallbs"]),
            tuple(row["decoding_largebs"]),
            int(row["decoding_large_small_bs_threshold"]),
        )


@dataclass(frozen=True)
class Limits:
    """The engine's limits (vLLM's flags of the same names)."""

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    watermark: float = 0.01  # of the blocks, kept free at admission


@dataclass
class Served:
    """What became of each request (request order): when its first token and its last were
    produced (ms, NaN if never), and how often it was preempted."""

    first_token: np.ndarray
    done: np.ndarray
    preemptions: np.ndarray
    ignored: np.ndarray  # dropped: preempted with more tokens than a prefill may hold (vLLM's "ignored")
    steps: int  # steps the engine ran


def serve_prefill_first(
    arrival_ms: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    step: StepTime,
    limits: Limits,
) -> Served:
    """Serve requests arriving at ``arrival_ms`` (sorted) with ``prompt`` and ``output``
    token counts on one replica, prefill first. Raises ValueError, before serving, for a
    request the replica can never hold (its prompt and output over the KV cache, or its
    prompt over ``max_num_batched_tokens``) or one with no output token."""
    n = len(arrival_ms)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    if n and output.min() < 1:
        raise ValueError(f"request {int(np.argmin(output))} asks for {int(output.min())} output tokens; at least 1")
    capacity = limits.num_blocks * limits.block_size
    too_long = np.flatnonzero(prompt + output > capacity)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(
            f"request {i}: {int(prompt[i])} prompt + {int(output[i])} output tokens can never fit the "
            f"KV cache ({limits.num_blocks} blocks of {limits.block_size} = {capacity} tokens)"
        )
    over = np.flatnonzero(prompt > limits.max_num_batched_tokens)
    if len(over):
        i = int(over[0])
        raise ValueError(
            f"request {i}: a {int(prompt[i])}-token prompt is over max_num_batched_tokens "
            f"{limits.max_num_batched_tokens}: it can never be prefilled"
        )
    kv = KVCache(limits.num_blocks, limits.block_size, prefix_caching=False)
    keep_free = int(limits.watermark * limits.num_blocks)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    preempted = np.zeros(n, dtype=np.int64)
    ignored = np.zeros(n, dtype=bool)
    made = np.zeros(n, dtype=np.int64)  # output tokens produced so far
    waiting: deque[int] = deque()
    running: list[int] = []  # in admission order
    t, nxt, steps = 0.0, 0, 0
    while nxt < n or waiting or running:
        while nxt < n and arrival_ms[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running:
            t = float(arrival_ms[nxt])
            continue
        # prefill: admit whole prompts (with what they had generated, after a preemption)
        batch, tokens = [], 0
        while waiting:
            i = waiting[0]
            length = int(prompt[i] + made[i])
            if length > limits.max_num_batched_tokens:  # a preempted sequence grown past any prefill
                waiting.popleft()
                ignored[i] = True
                continue
            if tokens + length > limits.max_num_batched_tokens or len(running) + len(batch) >= limits.max_num_seqs:
                break
            if kv.blocks_for(length) > kv.free_blocks - keep_free or kv.allocate(i, length) is None:
                break
            waiting.popleft()
            batch.append(i)
            tokens += length
        if batch:
            t += step.prefill_ms([int(prompt[i] + made[i]) for i in batch])
            steps += 1
            for i in batch:
                if made[i] == 0:
                    first[i] = t
                made[i] += 1
            running.extend(batch)
            running = _finish(running, made, output, done, kv, t)
            continue
        # decode: one token for every running sequence, in arrival order; each needs a free
        # block to go on (vLLM 0.1.7 asks one per sequence, whether or not it opens a block):
        # without one, the latest arrival not yet given its slot is preempted, or itself
        order, running = sorted(running), []
        while order:
            i = order.pop(0)
            while kv.free_blocks < 1:
                victim = order.pop() if order else i
                kv.free(victim)
                waiting.appendleft(victim)
                preempted[victim] += 1
                if victim == i:
                    break
            else:
                kv.allocate(i, int(prompt[i] + made[i]))  # the last token's KV: a block when it opens one
                running.append(i)
        if not running:
            continue
        context = sum(int(prompt[i] + made[i]) for i in running)
        t += step.decode_ms(context, len(running))
        steps += 1
        for i in running:
            made[i] += 1
        running = _finish(running, made, output, done, kv, t)
    return Served(first, done, preempted, ignored, steps)


def _finish(running: list[int], made, output, done, kv: KVCache, t: float) -> list[int]:
    """The running sequences that have not produced their last token; the others end at ``t``."""
    still = []
    for i in running:
        if made[i] >= output[i]:
            done[i] = t
            kv.free(i)
        else:
            still.append(i)
    return still


__all__ = ["Limits", "Served", "StepTime", "serve_prefill_first"]

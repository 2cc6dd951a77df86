"""An LLM engine's step time: what one step on the GPU costs, as a function of its work.

A step (:class:`Work`) computes some prompt tokens in chunks and one token for each
decoding sequence. Its time comes from one of three models, each a :class:`StepModel`
(``ms(work)``), none of which decides who joins a step (the replica's scheduler does,
:mod:`simulator.serving.llm_replica`):

- :class:`LinearStepTime`, the form ``calibrate llm`` fits on an engine's own step timings
  (a fixed cost, prefill tokens, their attention, decodes and their context), with an
  optional second decode slope past a batch size and extra time on the steps after an idle;
- :class:`StepTime`, DistServe's fit on a GPU (prefill and decode rows, two decode regimes);
- :class:`RooflineStepTime`, a model's FLOPs and bytes on a GPU's datasheet at fitted
  utilisations (``batching.step_time.kind: roofline``).

Each also gives the times of a run of decode-only steps at once (``decode_series``, the
same bits as step by step), which the replica's decode stretches take in one go; and a
replica's step-time noise (:class:`Noise`), a multiplicative factor on each step's time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Work:
    """What one step computes: ``prefill_tokens`` prompt (or recomputed) tokens in chunks,
    their attention work Σ p_i·(ctx_i + p_i/2) (a chunk of ``p_i`` tokens after ``ctx_i``
    already computed), ``chunks`` prefill chunks, ``decodes`` sequences decoding one token
    and their ``decode_context`` tokens of context in all."""

    prefill_tokens: int = 0
    attention: float = 0.0
    chunks: int = 0
    decodes: int = 0
    decode_context: int = 0


class StepModel(Protocol):
    def ms(self, work: Work) -> float:
        """The step's time on the GPU, ms."""


@dataclass(frozen=True)
class LinearStepTime:
    """``t = c0 + c_prefill·P + c_attn·Σ p_i(ctx_i + p_i/2) + c_decode·D + c_kv·Σ ctx_j`` (ms):
    a fixed cost per step, prefill tokens' linear work (weights read and multiplied),
    their attention, decoding sequences' per-sequence work and their attention over
    ``Σ ctx_j`` tokens of KV."""

    c0_ms: float
    prefill_ms_per_token: float = 0.0
    attention_ms_per_token2: float = 0.0
    decode_ms_per_seq: float = 0.0
    kv_ms_per_token: float = 0.0
    decode_threshold: int | None = None  # decodes beyond it cost decode_ms_per_seq_above each
    decode_ms_per_seq_above: float = 0.0
    wake_ms: tuple[float, ...] = ()  # added to the first, second, ... step after the replica idled

    def _decodes_ms(self, decodes: int) -> float:
        th = self.decode_threshold
        if th is None or decodes <= th:
            return self.decode_ms_per_seq * decodes
        return self.decode_ms_per_seq * th + self.decode_ms_per_seq_above * (decodes - th)

    def decode_series(self, width: int, context: int, d: int, k: int) -> list[float]:
        """:meth:`ms` of ``k`` decode steps of ``width`` whose context starts at ``context`` and
        grows by ``d`` a step (the same operations in the same order, so the same bits)."""
        fixed = self.c0_ms + self.prefill_ms_per_token * 0 + self.attention_ms_per_token2 * 0.0
        fixed = fixed + self._decodes_ms(width)
        kv = self.kv_ms_per_token
        return [fixed + kv * (context + d * i) for i in range(k)]

    def ms(self, work: Work) -> float:
        return (
            self.c0_ms
            + self.prefill_ms_per_token * work.prefill_tokens
            + self.attention_ms_per_token2 * work.attention
            + self._decodes_ms(work.decodes)
            + self.kv_ms_per_token * work.decode_context
        )


@dataclass(frozen=True)
class RooflineStepTime:
    """A step's time from its FLOPs and bytes: ``overhead + max(FLOPs / flop_rate,
    bytes / byte_rate)``. FLOPs: ``2·params`` a token computed, ``4·layers·hidden`` a
    (query, key) pair of attention; bytes: the weights once a step, and the KV of every
    decode's context and every token computed."""

    flops_per_token: float
    attention_flops_per_pair: float
    weight_bytes: float
    kv_bytes_per_token: float
    flop_rate: float  # FLOP/ms reached
    byte_rate: float  # bytes/ms reached
    overhead_ms: float

    def decode_series(self, width: int, context: int, d: int, k: int) -> list[float]:
        """:meth:`ms` of ``k`` decode steps (see :meth:`LinearStepTime.decode_series`)."""
        tokens = 0 + width
        computed = self.flops_per_token * tokens
        pair, kv, weights = self.attention_flops_per_pair, self.kv_bytes_per_token, self.weight_bytes
        out = []
        for i in range(k):
            ctx = context + d * i
            flops = computed + pair * (0.0 + ctx)
            moved = weights + kv * (ctx + tokens)
            out.append(self.overhead_ms + max(flops / self.flop_rate, moved / self.byte_rate))
        return out

    def ms(self, work: Work) -> float:
        tokens = work.prefill_tokens + work.decodes
        flops = self.flops_per_token * tokens + self.attention_flops_per_pair * (work.attention + work.decode_context)
        moved = self.weight_bytes + self.kv_bytes_per_token * (work.decode_context + tokens)
        return self.overhead_ms + max(flops / self.flop_rate, moved / self.byte_rate)


def step_model(batching, instance_type: str) -> StepModel:
    """The step time of a ``batching.kind: continuous`` section on ``instance_type``: its
    fitted linear form, or the roofline of its model on that GPU's datasheet."""
    from simulator.scenario.llm import LinearStep, gpu_spec

    st = batching.step_time
    if isinstance(st, LinearStep):
        return LinearStepTime(
            st.c0_ms,
            st.prefill_ms_per_token,
            st.attention_ms_per_token2,
            st.decode_ms_per_seq,
            st.kv_ms_per_token,
            st.decode_threshold,
            st.decode_ms_per_seq_above,
            tuple(st.wake_ms),
        )
    m, gpu = batching.spec, gpu_spec(instance_type)
    return RooflineStepTime(
        flops_per_token=2.0 * m.params_b * 1e9,
        attention_flops_per_pair=4.0 * m.layers * m.hidden,
        weight_bytes=m.weights_total_bytes,
        kv_bytes_per_token=m.kv_bytes_per_token,
        flop_rate=gpu.tflops * 1e12 * st.mfu / 1000.0,
        byte_rate=gpu.hbm_tb_s * 1e12 * st.mbu / 1000.0,
        overhead_ms=st.overhead_ms,
    )


@dataclass(frozen=True)
class StepTime:
    """Step time (ms) as DistServe fits it on a GPU: a prefill of prompts ``l`` takes
    ``a + b·Σl + c·Σl²``; a decode of ``B`` sequences with contexts ``ctx`` takes
    ``a + b·Σctx + c·B``, with one row for ``B`` below ``threshold`` and another from it.
    A chunk after ``ctx`` tokens counts ``2·p·(ctx + p/2)`` for its ``l²``; a mixed step
    pays the prefill's row and the decode's terms without a second intercept."""

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

    def decode_series(self, width: int, context: int, d: int, k: int) -> list[float]:
        """:meth:`ms` of ``k`` decode steps (see :meth:`LinearStepTime.decode_series`)."""
        return [0.0 + (self.decode_ms(context + d * i, width) - 0.0) for i in range(k)]

    def ms(self, work: Work) -> float:
        t = 0.0
        if work.chunks:
            a, b, c = self.prefill
            t = a + b * work.prefill_tokens + c * 2.0 * work.attention
        if work.decodes:
            a = (self.decode_small if work.decodes < self.threshold else self.decode_large)[0]
            t += self.decode_ms(work.decode_context, work.decodes) - (a if work.chunks else 0.0)
        return t

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


def token_step_floor_ms(step: StepModel) -> float:
    """The least time of any step that makes a token (a decode of one sequence, or a
    prompt chunk of one token), before noise and the host's speed: every term of the
    linear form and of the roofline grows with the work, so the least work gives it. 0
    where a model's terms may fall (DistServe's fits carry negative coefficients)."""
    if not isinstance(step, LinearStepTime | RooflineStepTime):
        return 0.0
    decode = step.ms(Work(decodes=1, decode_context=1))
    chunk = step.ms(Work(prefill_tokens=1, attention=0.5, chunks=1))
    return max(min(decode, chunk), 0.0)


def decode_series(step: StepModel, width: int, context: int, d: int, k: int) -> list[float]:
    """The times of ``k`` decode-only steps of ``width`` sequences (``d`` of them real,
    the rest a static batch's finished slots) whose context starts at ``context`` and
    grows by ``d`` a step: the step model's own series where it has one, else its
    ``ms`` step by step."""
    series = getattr(step, "decode_series", None)
    if series is not None:
        return series(width, context, d, k)
    return [step.ms(Work(decodes=width, decode_context=context + d * i)) for i in range(k)]


class Noise:
    """A replica's multiplicative step-time noise: log-normal with mean 1 and ``cv``,
    drawn from its own stream in buffers (the same factors whatever the chunks)."""

    def __init__(self, cv: float, rng: np.random.Generator, buffer: int = 4096):
        s2 = math.log1p(cv * cv)
        self.mu, self.sigma = -s2 / 2, math.sqrt(s2)
        self.rng, self.buffer = rng, buffer
        self.values = np.zeros(0)
        self.at = 0  # the next factor's place in values

    def _fill(self, k: int) -> None:
        while len(self.values) - self.at < k:
            self.values = np.concatenate([self.values[self.at :], self.rng.lognormal(self.mu, self.sigma, self.buffer)])
            self.at = 0

    def __call__(self) -> float:
        self._fill(1)
        self.at += 1
        return float(self.values[self.at - 1])

    def peek(self, k: int) -> np.ndarray:
        """The next ``k`` factors, not taken yet."""
        self._fill(k)
        return self.values[self.at : self.at + k]

    def consume(self, k: int) -> None:
        """Take the next ``k`` factors (those :meth:`peek` showed)."""
        self._fill(k)
        self.at += k


__all__ = [
    "LinearStepTime",
    "Noise",
    "RooflineStepTime",
    "StepModel",
    "StepTime",
    "Work",
    "decode_series",
    "step_model",
    "token_step_floor_ms",
]

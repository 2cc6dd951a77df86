"""LLM serving in a scenario: token lengths (``traffic.tokens``), the continuous-batching
section (``batching.kind: continuous``), and the model and GPU presets its step time and
KV memory are derived from.

**What is an estimate.** The model architectures below are the models' published configs
(layers, hidden size, KV heads, head dimension, parameters). The GPUs' dense BF16 peak
FLOP/s, HBM bandwidth and memory are their vendors' datasheet figures. The *efficiencies*
(the share of peak FLOP/s a prefill reaches, the share of bandwidth a decode reaches) and
the fixed cost of a step (the scheduler's and the launch's CPU time) are estimates, typical
of vLLM on those GPUs, not measured here: a step time fitted on the real engine
(``batching.step_time``) replaces the whole roofline.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Literal

import numpy as np
from pydantic import Discriminator, Field, Tag, model_validator

from simulator.scenario.distributions import Distribution
from simulator.scenario.frozen import Frozen

_Z99 = NormalDist().inv_cdf(0.99)


def bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """KV bytes one token takes across the model: a key and a value per layer and head."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def blocks_from_memory(
    gpu_bytes: float,
    utilization: float,
    weights_bytes: float,
    activations_bytes: float,
    block_size: int,
    token_bytes: float,
) -> int:
    """Blocks of KV memory a replica has, as vLLM sizes them: what
    ``gpu_memory_utilization`` of the GPU leaves after the weights and the peak
    activations, in blocks of ``block_size`` tokens of ``token_bytes`` each. Raises
    ValueError when nothing is left for even one block."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu memory utilization must be in (0, 1], not {utilization}")
    left = gpu_bytes * utilization - weights_bytes - activations_bytes
    blocks = int(left // (block_size * token_bytes)) if left > 0 else 0
    if blocks < 1:
        raise ValueError(
            f"no room for the KV cache: {gpu_bytes * utilization / 2**30:.1f} GiB usable, weights "
            f"{weights_bytes / 2**30:.1f} GiB and activations {activations_bytes / 2**30:.1f} GiB"
        )
    return blocks


class ModelSpec(Frozen):
    """A decoder's architecture: what its weights and its KV cache weigh, and its FLOPs."""

    params_b: float = Field(gt=0, description="Parameters, billions.")
    layers: int = Field(ge=1, description="Transformer layers.")
    hidden: int = Field(ge=1, description="Hidden size (query heads x head dim).")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(ge=1, description="Dimension of one head.")
    weight_bytes: float = Field(2.0, gt=0, description="Bytes per weight (2: FP16/BF16; 0.5: INT4).")
    kv_bytes: float = Field(2.0, gt=0, description="Bytes per KV element (2: FP16/BF16; 1: FP8).")

    @property
    def kv_bytes_per_token(self) -> float:
        """2 (key and value) x layers x KV heads x head dim x bytes."""
        return bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.kv_bytes)

    @property
    def weights_total_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes


class GPUSpec(Frozen):
    """A GPU's datasheet: dense BF16 peak, HBM bandwidth, memory."""

    tflops: float = Field(gt=0, description="Dense BF16 tensor peak, TFLOP/s.")
    hbm_tb_s: float = Field(gt=0, description="HBM bandwidth, TB/s.")
    memory_gb: float = Field(gt=0, description="Memory, GB (1e9 bytes).")


MODELS: dict[str, ModelSpec] = {
    # published configs (config.json of each model)
    "llama-3-8b": ModelSpec(params_b=8.03, layers=32, hidden=4096, kv_heads=8, head_dim=128),
    "llama-2-7b": ModelSpec(params_b=6.74, layers=32, hidden=4096, kv_heads=32, head_dim=128),  # no GQA
    "llama-3-70b": ModelSpec(params_b=70.6, layers=80, hidden=8192, kv_heads=8, head_dim=128),
    "mistral-7b": ModelSpec(params_b=7.24, layers=32, hidden=4096, kv_heads=8, head_dim=128),
    "qwen2.5-7b": ModelSpec(params_b=7.62, layers=28, hidden=3584, kv_heads=4, head_dim=128),
    "opt-13b": ModelSpec(params_b=12.9, layers=40, hidden=5120, kv_heads=40, head_dim=128),
    # the reference server's tiny engine at its defaults (servesim serve-llm: float32)
    "servesim-tiny": ModelSpec(
        params_b=0.00069, layers=2, hidden=128, kv_heads=4, head_dim=32, weight_bytes=4.0, kv_bytes=4.0
    ),
}

GPUS: dict[str, GPUSpec] = {
    # vendors' datasheets: dense BF16 (FP16 on T4) tensor peak, HBM bandwidth, memory
    "t4": GPUSpec(tflops=65, hbm_tb_s=0.32, memory_gb=16),
    "l4": GPUSpec(tflops=121, hbm_tb_s=0.30, memory_gb=24),
    "a100": GPUSpec(tflops=312, hbm_tb_s=1.555, memory_gb=40),  # the catalog's a100 is the 40 GB part
    "a100-80g": GPUSpec(tflops=312, hbm_tb_s=2.039, memory_gb=80),
    "h100": GPUSpec(tflops=989, hbm_tb_s=3.35, memory_gb=80),
    "h200": GPUSpec(tflops=989, hbm_tb_s=4.8, memory_gb=141),
}


class TokenLengths(Frozen):
    """A length in tokens: ``fixed``; log-normal by ``mean`` and ``p99`` (as traces publish
    them) or by ``mean`` and ``cv``; or ``values`` drawn uniformly (an empirical sample).
    Draws are rounded and clipped to ``[min, max]``."""

    fixed: int | None = Field(None, ge=0, description="Every request has this many tokens.")
    mean: float | None = Field(None, gt=0, description="Mean tokens (log-normal, with p99 or cv).")
    p99: float | None = Field(None, gt=0, description="99th percentile, tokens (log-normal, with mean).")
    cv: float | None = Field(None, gt=0, description="Coefficient of variation (log-normal, with mean).")
    values: tuple[int, ...] | None = Field(None, min_length=1, description="An empirical sample, drawn uniformly.")
    min: int = Field(1, ge=0, description="Fewest tokens (draws below are raised to it).")
    max: int | None = Field(None, ge=1, description="Most tokens (draws above are cut to it; none: no cap).")

    @model_validator(mode="after")
    def _one_form(self) -> TokenLengths:
        forms = [
            self.fixed is not None,
            self.values is not None,
            self.mean is not None and (self.p99 is not None or self.cv is not None),
        ]
        if sum(forms) != 1 or (self.p99 is not None and self.cv is not None):
            raise ValueError("give exactly one of: fixed; values; mean with p99; mean with cv")
        if self.p99 is not None and self.p99 <= self.mean:
            raise ValueError(f"p99 ({self.p99:g}) must exceed the mean ({self.mean:g}) of a log-normal")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """The log-normal's parameters: from mean and cv, or from mean and p99
        (ln p99 - ln mean = z99·σ - σ²/2, the smaller root)."""
        if self.cv is not None:
            s2 = math.log1p(self.cv**2)
            return math.log(self.mean) - s2 / 2, math.sqrt(s2)
        gap = math.log(self.p99 / self.mean)
        disc = _Z99**2 - 2 * gap
        if disc < 0:
            raise ValueError(f"no log-normal has mean {self.mean:g} and p99 {self.p99:g}")
        sigma = _Z99 - math.sqrt(disc)
        return math.log(self.mean) - sigma**2 / 2, sigma

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.fixed is not None:
            x = np.full(n, self.fixed, dtype=np.int64)
        elif self.values is not None:
            x = np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), n)]
        else:
            mu, sigma = self.mu_sigma()
            x = np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)
        return np.clip(x, self.min, self.max if self.max is not None else np.iinfo(np.int64).max)

    def expected(self) -> float:
        """The exact mean of a draw (rounded and clipped as :meth:`sample` does); a
        log-normal needs its ``max``."""
        top = self.max if self.max is not None else math.inf
        if self.fixed is not None:
            return float(min(max(self.fixed, self.min), top))
        if self.values is not None:
            return float(np.clip(np.asarray(self.values, dtype=float), self.min, top).mean())
        if math.isinf(top):
            raise ValueError("the mean of an uncapped log-normal count is not computed: give it a max")
        mu, sigma = self.mu_sigma()
        dist = NormalDist(mu, sigma)
        k = np.arange(self.min, self.max + 1, dtype=float)

        def cdf(x: float) -> float:  # P(X < x)
            return dist.cdf(math.log(x)) if x > 0 else 0.0

        edges = np.array([cdf(x) for x in (k[:-1] + 0.5)])
        mass = np.diff(np.concatenate(([0.0], edges, [1.0])))  # min takes all below, max all above
        return float((k * mass).sum())

    @property
    def upper(self) -> float:
        """The most tokens a draw can have (inf for an uncapped log-normal)."""
        if self.fixed is not None:
            return float(max(self.fixed, self.min))
        if self.values is not None:
            top = max(max(self.values), self.min)
            return float(top if self.max is None else min(top, self.max))
        return math.inf if self.max is None else float(self.max)


PRESETS: dict[str, tuple[TokenLengths, TokenLengths]] = {
    # Azure's LLM inference traces (2023), their published shapes: means and p99s
    "azure_conversation": (TokenLengths(mean=1155, p99=4142, max=16384), TokenLengths(mean=211, p99=601, max=4096)),
    "azure_code": (TokenLengths(mean=2048, p99=7436, max=16384), TokenLengths(mean=28, p99=249, max=4096)),
    # ShareGPT as DistServe sampled it for its vLLM runs (prompt mean ~780, p99 ~1,890;
    # output mean ~175, p99 ~830), cut as vLLM's benchmark filters it: prompt <= 1024,
    # prompt + output <= 2048, at least 4 of each
    "sharegpt": (TokenLengths(mean=780, p99=1890, min=4, max=1024), TokenLengths(mean=175, p99=830, min=4, max=1024)),
}


class PrefixGroups(Frozen):
    """Shared prompt prefixes (a system prompt, a RAG corpus's documents): a share of the
    requests begin with one of ``groups`` prefixes of ``tokens`` tokens, picked by Zipf
    popularity."""

    share: float = Field(1.0, ge=0, le=1, description="Share of requests that begin with a shared prefix.")
    groups: int = Field(1, ge=1, description="Distinct prefixes.")
    tokens: int = Field(ge=1, description="Tokens of a prefix (of the prompt; a shorter prompt shares all of it).")
    zipf_s: float = Field(1.0, ge=0, description="Zipf exponent of the prefixes' popularity (0: uniform).")


class Sessions(Frozen):
    """Multi-turn conversations: each session is ``turns`` requests, the prompt of each turn
    the whole conversation so far (the earlier turns' prompts and answers, which a prefix
    cache may still hold) followed by the turn's new input (``traffic.tokens.prompt``).
    Sessions start as the traffic's arrival process at ``rate_rps`` divided by the mean
    turns, so ``rate_rps`` stays the rate of requests; a session's next turn arrives
    ``turn_gap`` after the turn before it *arrived*, as a trace records turns (the
    simulator does not wait for the answer: give gaps longer than answers take)."""

    turns: TokenLengths = Field(
        description="Turns per session (a count: fixed; values; mean with cv or p99, with max)."
    )
    turn_gap: Distribution = Field(
        description="From one turn's arrival to the next's, ms (the answer's time and the user's think time)."
    )
    max_context_tokens: int | None = Field(
        None,
        ge=1,
        description="The model's context window: a session ends before a turn whose prompt and answer would "
        "exceed it (none: no limit, so the longest session must fit a replica's KV cache).",
    )

    @model_validator(mode="after")
    def _counted(self) -> Sessions:
        if math.isinf(self.turns.upper):
            raise ValueError("traffic.tokens.sessions.turns has no max: set traffic.tokens.sessions.turns.max")
        if self.turns.min < 1 or self.turns.fixed == 0:
            raise ValueError("traffic.tokens.sessions.turns must be at least 1: a session has a first turn")
        return self

    def mean_turns(self) -> float:
        """The exact mean of the turns per session: its rounding and clipping included."""
        return self.turns.expected()


class Tokens(Frozen):
    """Each request's prompt and output lengths; the output length is hidden from the
    scheduler (the sequence simply stops when it has produced it)."""

    preset: Literal["azure_conversation", "azure_code", "sharegpt"] | None = Field(
        None, description="Published length shapes: azure_conversation, azure_code, sharegpt (prompt and output)."
    )
    from_trace: bool = Field(
        False,
        description="Replay the lengths of traffic.arrivals_file, a CSV of arrival_s, prompt_tokens, "
        "output_tokens (one request a row; its arrivals are replayed too).",
    )
    prompt: TokenLengths | None = Field(None, description="Prompt tokens (replaces the preset's).")
    output: TokenLengths | None = Field(None, description="Output tokens (replaces the preset's).")
    prefix: PrefixGroups | None = Field(None, description="Shared prompt prefixes (none: every prompt its own).")
    sessions: Sessions | None = Field(
        None, description="Multi-turn conversations (none: every request a conversation of its own)."
    )

    @model_validator(mode="after")
    def _complete(self) -> Tokens:
        if self.from_trace:
            if self.preset is not None or self.prompt is not None or self.output is not None:
                raise ValueError("traffic.tokens.from_trace replays the trace's lengths: drop preset, prompt, output")
            if self.sessions is not None:
                raise ValueError("traffic.tokens.from_trace replays requests, not sessions: drop sessions")
            return self
        if self.preset is None and (self.prompt is None or self.output is None):
            raise ValueError("traffic.tokens needs a preset, or both prompt and output (or from_trace)")
        out = self.lengths()[1]
        if out.fixed == 0 or out.min < 1 or out.max == 0:
            raise ValueError("traffic.tokens.output must be at least 1 token: a request produces at least one")
        return self

    def lengths(self) -> tuple[TokenLengths, TokenLengths]:
        """The prompt's and the output's lengths, the preset's where not given (a trace's:
        :func:`read_trace`)."""
        if self.from_trace:
            raise ValueError("traffic.tokens.from_trace: the lengths are the trace's (read_trace)")
        p, o = PRESETS[self.preset] if self.preset is not None else (None, None)
        return self.prompt or p, self.output or o


class LinearStep(Frozen):
    """A fitted step time: ``c0 + c_prefill·P + c_attn·Σ p(ctx + p/2) + c_decode·D + c_kv·Σ ctx`` ms;
    with ``decode_threshold`` the decoding sequences beyond it cost ``decode_ms_per_seq_above``
    each (a batch's per-sequence cost falls as it grows on a CPU); the k-th step after the
    replica idled costs ``wake_ms[k]`` more."""

    kind: Literal["linear"] = "linear"
    c0_ms: float = Field(gt=0, description="Fixed cost of a step, ms (a step always takes some: scheduling, launch).")
    prefill_ms_per_token: float = Field(0.0, ge=0, description="Per prompt token computed, ms.")
    attention_ms_per_token2: float = Field(0.0, ge=0, description="Per unit of prefill attention work, ms.")
    decode_ms_per_seq: float = Field(0.0, ge=0, description="Per decoding sequence, ms.")
    kv_ms_per_token: float = Field(0.0, ge=0, description="Per token of decode context read, ms.")
    decode_threshold: int | None = Field(
        None,
        ge=1,
        description="Decoding sequences beyond this many cost decode_ms_per_seq_above each instead (DistServe's "
        "two rows, small and large batches; none: one rate).",
    )
    decode_ms_per_seq_above: float = Field(0.0, ge=0, description="Per decoding sequence beyond decode_threshold, ms.")
    wake_ms: tuple[Annotated[float, Field(ge=0)], ...] = Field(
        (),
        max_length=8,
        description="Added to the first, second, ... step after the replica idled, ms (a host's caches and "
        "clocks waking up: fitted on the tiny CPU engine 1.4-1.9, 0.4-0.5, 0.2 ms; none: no wake cost).",
    )


class Roofline(Frozen):
    """The step time from the model's FLOPs and bytes on the GPU's datasheet:
    ``overhead + max(FLOPs / (peak x mfu), bytes / (bandwidth x mbu))``. The
    efficiencies and the overhead are estimates."""

    kind: Literal["roofline"] = "roofline"
    mfu: float = Field(0.5, gt=0, le=1, description="Share of peak FLOP/s a step reaches (estimate).")
    mbu: float = Field(0.75, gt=0, le=1, description="Share of HBM bandwidth a step reaches (estimate).")
    overhead_ms: float = Field(2.0, ge=0, description="Fixed CPU cost of a step: scheduling, launch (estimate), ms.")


def step_kind(value) -> str:
    """The ``kind`` of a step_time section: as given, else ``linear`` when it has the fitted
    form's ``c0_ms``, else ``roofline``."""
    if isinstance(value, dict):
        kind = value.get("kind", "linear" if "c0_ms" in value else "roofline")
        return kind if isinstance(kind, str) else repr(kind)
    return getattr(value, "kind", "roofline")


StepTimeSection = Annotated[
    Annotated[LinearStep, Tag("linear")] | Annotated[Roofline, Tag("roofline")],
    Discriminator(
        step_kind,
        custom_error_type="step_time_kind",
        custom_error_message="batching.step_time.kind must be one of: linear, roofline",
    ),
]


class Disaggregation(Frozen):
    """Prefill and decode on separate replicas, as DistServe and Splitwise serve: the first
    ``prefill_replicas`` of ``workers.count`` compute prompts and the first token, then each
    request's prompt KV crosses to the decode replica with the fewest sequences, which
    produces the rest of its answer. A prefill replica's link carries one prompt's KV at a
    time (``kv_link``); ``kv_transfer_ms`` is a latency on top that does not hold the link."""

    prefill_replicas: int = Field(ge=1, description="Replicas that only prefill (the rest of workers.count decode).")
    kv_transfer_gb_s: float = Field(
        gt=0,
        description="Bandwidth a prompt's KV crosses from its prefill replica to its decode replica, GB/s "
        "(1e9 bytes; NVLink within a node ~450, 400 Gb/s InfiniBand ~50).",
    )
    kv_transfer_ms: float = Field(0.0, ge=0, description="Fixed cost of one transfer (setup, first byte), ms.")
    kv_link: Literal["per_prefill_replica", "unlimited"] = Field(
        "per_prefill_replica",
        description="per_prefill_replica: each prefill replica sends one prompt's KV at a time at the full "
        "bandwidth, in the order their first tokens came; unlimited: every transfer at once at the full bandwidth.",
    )


class ContinuousBatching(Frozen):
    """An LLM engine's iteration-level scheduler (``kind: continuous``), with vLLM's flags.

    Each worker is one replica of ``model`` on one ``workers.instance_type`` GPU; the
    router picks its replica. ``policy`` picks the scheduler: ``continuous`` (vLLM V1:
    chunked prefill, prefill and decode mixed), ``prefill_first`` (vLLM v0: whole prompts
    first, never mixed with decodes) or ``static`` (request-level batches, as
    FasterTransformer serves).
    """

    kind: Literal["continuous"] = Field(description="continuous: an LLM engine stepping token by token.")
    policy: Literal["continuous", "prefill_first", "static"] = Field(
        "continuous", description="continuous (vLLM V1), prefill_first (vLLM v0) or static (request-level)."
    )
    model: str = Field(description=f"The model served, a preset: {', '.join(MODELS)}.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Tokens one step may compute.")
    max_num_seqs: int = Field(256, ge=1, description="Sequences running at once.")
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="Most tokens of one prompt per step (continuous; 0: no cap but the step's budget)."
    )
    weight_bytes: float | None = Field(
        None, gt=0, description="Bytes per weight of a quantized model (1: FP8/INT8; 0.5: INT4; none: the preset's)."
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV block.")
    num_blocks: int | None = Field(
        None, ge=1, description="KV blocks per replica (none: from the GPU's memory, as vLLM sizes them)."
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Share of the GPU's memory vLLM may use.")
    activations_gb: float = Field(
        2.0, ge=0, description="Peak activation memory at max_num_batched_tokens, GB (an estimate)."
    )
    enable_prefix_caching: bool = Field(True, description="Keep freed blocks' content for later hits (vLLM V1: on).")
    step_time: StepTimeSection = Field(
        Roofline(), description="The step time: kind linear (fitted coefficients) or roofline (the default)."
    )
    noise_cv: float = Field(0.0, ge=0, description="Multiplicative log-normal noise of each step's time (its cv).")
    disaggregation: Disaggregation | None = Field(
        None, description="Prefill and decode on separate replicas (none: every replica does both)."
    )

    @model_validator(mode="after")
    def _known(self) -> ContinuousBatching:
        if self.model not in MODELS:
            raise ValueError(f"batching.model {self.model!r} is not a preset ({', '.join(MODELS)})")
        if self.disaggregation is not None and self.policy != "continuous":
            raise ValueError("batching.disaggregation needs policy continuous (chunked prefill on its own replicas)")
        return self

    def front(self, count: int) -> int:
        """The replicas a new request is routed among, of ``count``: the prefill replicas
        where prefill and decode are apart."""
        return count if self.disaggregation is None else self.disaggregation.prefill_replicas

    # what the rest of the model reads off any batching section
    @property
    def max_batch_size(self) -> int:
        return self.max_num_seqs

    @property
    def deadline_ms(self) -> None:
        return None

    @property
    def timeout_ms(self) -> None:
        return None

    @property
    def max_queue_size(self) -> None:
        return None

    @property
    def max_queue_delay_ms(self) -> float:
        return 0.0

    @property
    def preferred_batch_sizes(self) -> tuple[int, ...]:
        return ()

    @property
    def spec(self) -> ModelSpec:
        m = MODELS[self.model]
        return m if self.weight_bytes is None else m.model_copy(update={"weight_bytes": self.weight_bytes})

    def blocks(self, instance_type: str) -> int:
        """KV blocks per replica: ``num_blocks``, or what the GPU's memory leaves after the
        weights and the activations (ValueError when nothing is left, or the GPU has no preset)."""
        if self.num_blocks is not None:
            return self.num_blocks
        gpu = gpu_spec(instance_type)
        m = self.spec
        return blocks_from_memory(
            gpu.memory_gb * 1e9,
            self.gpu_memory_utilization,
            m.weights_total_bytes,
            self.activations_gb * 1e9,
            self.block_size,
            m.kv_bytes_per_token,
        )


def read_trace(path: str | Path, duration_ms: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An LLM trace (CSV: arrival_s, prompt_tokens, output_tokens; a header line and '#'
    comments skipped): arrival times (ms), prompt and output tokens, in time order (ties
    as in the file), those arriving before ``duration_ms``. ValueError names the file and
    what is wrong."""
    from simulator.scenario.distributions import read_rows

    rows = read_rows(Path(path))
    if rows.shape[1] < 3:
        raise ValueError(f"{path}: an LLM trace needs three columns: arrival_s, prompt_tokens, output_tokens")
    t, prompt, output = rows[:, 0], rows[:, 1], rows[:, 2]
    if not np.isfinite(rows[:, :3]).all() or (t < 0).any():
        raise ValueError(f"{path}: arrival_s must be finite and >= 0")
    for name, col, low in (("prompt_tokens", prompt, 0), ("output_tokens", output, 1)):
        bad = np.flatnonzero((col != np.round(col)) | (col < low))
        if len(bad):
            raise ValueError(
                f"{path}: row {int(bad[0]) + 1}: {name} must be a whole number >= {low}, not {col[bad[0]]:g}"
            )
    order = np.argsort(t, kind="stable")
    t, prompt, output = t[order] * 1000.0, prompt[order].astype(np.int64), output[order].astype(np.int64)
    keep = t < duration_ms
    return t[keep], prompt[keep], output[keep]


def gpu_spec(instance_type: str) -> GPUSpec:
    if instance_type not in GPUS:
        raise ValueError(f"workers.instance_type {instance_type!r} has no GPU preset ({', '.join(GPUS)})")
    return GPUS[instance_type]


__all__ = [
    "GPUS",
    "MODELS",
    "PRESETS",
    "ContinuousBatching",
    "Disaggregation",
    "GPUSpec",
    "LinearStep",
    "ModelSpec",
    "PrefixGroups",
    "Roofline",
    "Sessions",
    "TokenLengths",
    "Tokens",
    "blocks_from_memory",
    "bytes_per_token",
    "gpu_spec",
    "read_trace",
]

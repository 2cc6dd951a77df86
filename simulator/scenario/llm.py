"""LLM serving in a scenario: the continuous-batching section (``batching.kind:
continuous``), and the model and GPU presets its step time and KV memory are derived from.
The requests' token lengths (``traffic.tokens``) are :mod:`simulator.scenario.tokens`.

**What is an estimate.** The model architectures below are the models' published configs
(layers, hidden size, KV heads, head dimension, parameters). The GPUs' dense BF16 peak
FLOP/s, HBM bandwidth and memory are their vendors' datasheet figures. The *efficiencies*
(the share of peak FLOP/s a prefill reaches, the share of bandwidth a decode reaches) and
the fixed cost of a step (the scheduler's and the launch's CPU time) are estimates, typical
of vLLM on those GPUs, not measured here: a step time fitted on the real engine
(``batching.step_time``) replaces the whole roofline.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from simulator.scenario.autoscaling import Autoscaler
from simulator.scenario.frozen import Frozen


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


Policy = Literal["continuous", "prefill_first", "static"]  # batching.policy: one replica scheduler each


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
    time (``kv_link``); ``kv_transfer_ms`` is a latency on top that does not hold the link.
    Each pool may scale on its own (``prefill_autoscaler``, ``decode_autoscaler``: a pool
    without one stays as it starts), as Dynamo's planner and llm-d scale prefill and decode
    apart; both pools' new replicas go through ``workers.cold_start``."""

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
    prefill_autoscaler: Autoscaler | None = Field(
        None,
        description="Scale the prefill replicas (prefill_replicas is the start) on their own metric: "
        "queue_depth or in_flight per prefill replica, say.",
    )
    decode_autoscaler: Autoscaler | None = Field(
        None,
        description="Scale the decode replicas (workers.count - prefill_replicas is the start) on their own "
        "metric: utilization (the share of KV blocks in use) or in_flight, say.",
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
    policy: Policy = Field(
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

    def autoscalers(self, workers) -> list[tuple[str, Autoscaler | None]]:
        """Each pool's autoscaler by its field's path: ``workers.autoscaler`` for replicas
        doing both, or the prefill pool's and the decode pool's."""
        d = self.disaggregation
        if d is None:
            return [("workers.autoscaler", workers.autoscaler)]
        at = "batching.disaggregation."
        return [(at + "prefill_autoscaler", d.prefill_autoscaler), (at + "decode_autoscaler", d.decode_autoscaler)]

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

    def least_step_ms(self, instance_type: str) -> float:
        """What every step takes at least on ``instance_type``, before noise: the fitted
        form's fixed cost, or the roofline's overhead and the weights read once."""
        st = self.step_time
        if isinstance(st, LinearStep):
            return st.c0_ms
        return st.overhead_ms + self.spec.weights_total_bytes / (gpu_spec(instance_type).hbm_tb_s * 1e12 * st.mbu) * 1e3

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


def gpu_spec(instance_type: str) -> GPUSpec:
    if instance_type not in GPUS:
        raise ValueError(f"workers.instance_type {instance_type!r} has no GPU preset ({', '.join(GPUS)})")
    return GPUS[instance_type]


__all__ = [
    "GPUS",
    "MODELS",
    "ContinuousBatching",
    "Disaggregation",
    "GPUSpec",
    "LinearStep",
    "ModelSpec",
    "Policy",
    "Roofline",
    "blocks_from_memory",
    "bytes_per_token",
    "gpu_spec",
]

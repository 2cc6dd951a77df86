"""The interview trainer's situations and steps: the seed articles' systems, the numbers
drawn for each attempt, and the napkin steps a candidate estimates (data only, so the
command line can list them without loading the simulator; :mod:`simulator.planning.practice`
asks, checks and reveals)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@dataclass(frozen=True)
class Knob:
    """A number drawn for each attempt: uniform in [lo, hi], rounded to ``step``."""

    path: str
    lo: float
    hi: float
    step: float

    def draw(self, rng: np.random.Generator) -> float:
        x = round(rng.uniform(self.lo, self.hi) / self.step) * self.step
        return float(round(x, 6))


@dataclass(frozen=True)
class Step:
    """One napkin step the candidate estimates: the napkin line it is checked against
    (``quantity``), its unit and the relative tolerance."""

    key: str
    prompt: str
    quantity: str
    unit: str
    tolerance: float = 0.1


@dataclass(frozen=True)
class Situation:
    """A seed system: its scenario file, the story (a template over the givens), the
    numbers drawn afresh each attempt, the napkin steps asked (none: :data:`STEPS`), whether
    the candidate names the stage the tail lives in, and the step whose answer is the fleet
    the simulation runs (none: the scenario's own)."""

    file: str
    title: str
    story: str
    knobs: tuple[Knob, ...]
    steps: tuple[Step, ...] | None = None
    kind: str = "image"  # image: the request path's napkin; llm: an LLM engine's
    fleet_step: str | None = "workers_headroom"

    @property
    def asked(self) -> tuple[Step, ...]:
        return self.steps if self.steps is not None else STEPS

    @property
    def asks_stage(self) -> bool:
        return self.kind == "image"


STEPS: tuple[Step, ...] = (
    Step("peak_rps", "peak request rate", "peak request rate", "req/s"),
    Step("ingress_gbps", "bandwidth in", "ingress bandwidth", "Gbit/s"),
    Step("egress_gbps", "bandwidth out", "egress bandwidth", "Gbit/s"),
    Step("batches_per_s", "batches per second (at the batch given)", "batches per second", "batches/s"),
    Step("per_worker_rps", "per-worker throughput", "per-worker throughput", "req/s"),
    Step("workers", "workers, bare", "workers", "workers"),
    Step("workers_headroom", "workers with the headroom", "workers with headroom", "workers"),
    Step("cost_per_hour", "cost per hour, with headroom", "cost with headroom", "USD/h"),
)

# the LLM situations' steps: ``quantity`` names a line of the situation's napkin
# (:mod:`simulator.planning.llm_practice`)
LLM_CHAT_STEPS: tuple[Step, ...] = (
    Step("weights_gb", "the weights' memory", "weights", "GB"),
    Step("kv_kb_per_token", "KV cache bytes per token", "KV bytes per token", "KB"),
    Step("kv_tokens", "tokens the KV cache holds per replica", "KV cache per replica", "tokens"),
    Step("max_seqs", "sequences that fit at once", "max concurrent sequences", "sequences"),
    Step("tokens_per_gpu", "output tokens a second per GPU, at the batch given", "output tokens per GPU", "tokens/s"),
    Step("per_replica_rps", "per-replica throughput", "per-replica throughput", "req/s"),
    Step("replicas", "replicas, bare", "replicas", "replicas"),
    Step("replicas_headroom", "replicas with the headroom", "replicas with headroom", "replicas"),
    Step("cost_per_hour", "cost per hour, with headroom", "cost with headroom", "USD/h"),
    Step("cost_per_m_output", "cost per million output tokens", "cost per million output tokens", "USD"),
)
KV_MEMORY_STEPS: tuple[Step, ...] = (
    Step("weights_fp16_gb", "FP16 weights", "FP16 weights", "GB"),
    Step("kv_kb_per_token", "KV cache bytes per token", "KV bytes per token", "KB"),
    Step("kv_gb_per_seq", "KV cache of one whole sequence", "KV per sequence", "GB"),
    Step("kv_fp16_gb", "memory left for the KV cache, FP16 weights", "KV memory, FP16 weights", "GB"),
    Step("seqs_fp16", "sequences that fit, FP16 weights", "sequences, FP16 weights", "sequences"),
    Step("weights_int4_gb", "INT4 weights", "INT4 weights", "GB"),
    Step("seqs_int4", "sequences that fit, INT4 weights", "sequences, INT4 weights", "sequences"),
)
STATIC_STEPS: tuple[Step, ...] = (
    Step("per_replica_rps", "continuous batching: per-replica throughput", "per-replica throughput", "req/s"),
    Step("replicas", "continuous batching: replicas, bare", "replicas", "replicas"),
    Step("static_batch_s", "static batching: a batch's time (prefills, longest answer)", "static batch time", "s"),
    Step("static_rps", "static batching: per-replica throughput", "static per-replica throughput", "req/s"),
    Step("static_replicas", "static batching: replicas, bare", "static replicas", "replicas"),
)
CHUNKED_STEPS: tuple[Step, ...] = (
    Step("doc_prefill_ms", "the long document's prefill", "document prefill", "ms"),
    Step("gap_whole_ms", "the gap a running answer sees when the document shares its step, whole", "gap, whole", "ms"),
    Step("gap_chunked_ms", "that gap with chunked prefill", "gap, chunked", "ms"),
    Step("chunk_steps", "steps the document's prefill takes in chunks", "chunked steps", "steps"),
    Step("doc_ttft_chunked_ms", "the document's prefill time, chunked", "document prefill, chunked", "ms"),
)
RAG_STEPS: tuple[Step, ...] = (
    Step("prompt_tokens", "prompt tokens a request (document and question)", "prompt tokens", "tokens"),
    Step("kv_tokens", "tokens the KV cache holds per replica", "KV cache per replica", "tokens"),
    Step("docs_per_replica", "documents one replica's KV cache could hold", "documents per replica", "documents"),
    Step("computed_on_hit", "prompt tokens computed when the document is cached", "computed on a hit", "tokens"),
    Step("saved_ms", "prefill time a hit saves", "prefill saved", "ms"),
)

SITUATIONS: dict[str, Situation] = {
    "platform": Situation(
        "inference_platform.yaml",
        "A shared inference platform",
        "A shared inference platform takes {rate} at peak. Each request sends {payload_kb} KB and gets "
        "{response_kb} KB back. On one {gpu} worker the model runs a batch of {batch} in {batch_ms} ms. "
        "Requests must come back within {target} at p{percentile}. A worker costs {price} an hour, and "
        "the fleet keeps {headroom} headroom over the bare need.",
        (
            Knob("traffic.rate_rps", 120_000, 300_000, 10_000),
            Knob("traffic.payload_kb", 4, 16, 1),
            Knob("traffic.response_kb", 0.5, 2, 0.5),
            Knob("workers.service_time.base_ms", 3, 6, 0.5),
            Knob("workers.service_time.per_item_ms", 0.15, 0.35, 0.05),
            Knob("sla.target_ms", 100, 200, 10),
        ),
    ),
    "recsys_feature_fetch": Situation(
        "recsys_feature_fetch.yaml",
        "A recommendation ranker's feature fetch",
        "A recommendation ranker serves {rate}. Before scoring, each request reads {lookups} features "
        "from a key-value store, {per_trip} keys per round trip with {parallel} round trips in flight; "
        "a round trip takes about {trip_ms} ms (median). On one {gpu} worker the ranker scores a batch of "
        "{batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. A worker costs {price} an hour; "
        "keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 100, 400, 20),
            Knob("features.lookups_per_request", 200, 1000, 100),
            Knob("features.batch_size", 1, 10, 1),
            Knob("workers.service_time.base_ms", 12, 24, 2),
            Knob("sla.target_ms", 150, 300, 25),
        ),
    ),
    "vision_preprocessing": Situation(
        "vision_preprocessing.yaml",
        "An image model behind CPU decoding",
        "An image classifier receives {rate} of {payload_kb} KB JPEGs over a {bandwidth} link. Each image is "
        "decoded and resized on the CPU in about {pre_ms} ms, on {cpu_workers} CPU workers. On one {gpu} the "
        "model runs a batch of {batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. A GPU worker "
        "costs {price} an hour; keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 20, 45, 5),
            Knob("traffic.payload_kb", 100, 200, 25),
            Knob("preprocess.service.mean_ms", 25, 50, 5),
            Knob("preprocess.cpu_workers", 3, 6, 1),
            Knob("workers.service_time.base_ms", 10, 20, 2),
            Knob("sla.target_ms", 150, 300, 25),
        ),
    ),
    "cv_degradation": Situation(
        "cv_degradation.yaml",
        "A CV classifier near its limit",
        "A CV classifier gets {rate_per_min} requests a minute ({rate}) of {payload_kb} KB images. On one "
        "{gpu} worker the model runs a batch of {batch} in {batch_ms} ms. The SLA is p{percentile} ≤ {target}. "
        "A worker costs {price} an hour; keep {headroom} headroom. Traffic is about to grow by 15%: what "
        "fleet do you want before it does?",
        (
            Knob("traffic.rate_rps", 120, 240, 10),
            Knob("workers.service_time.base_ms", 18, 30, 2),
            Knob("workers.service_time.per_item_ms", 5, 9, 0.5),
            Knob("sla.target_ms", 200, 400, 25),
        ),
    ),
    "recsys_under_load": Situation(
        "recsys_under_load.yaml",
        "A ranking service under load",
        "A ranking service has {users} concurrent users, each sending a request every {think_s} s on "
        "average ({rate} by Little's law). Each request reads {lookups} features in round trips of "
        "{per_trip} keys. On one {gpu} worker the ranker scores a batch of {batch} in {batch_ms} ms. The SLA "
        "is p{percentile} ≤ {target}. A worker costs {price} an hour; keep {headroom} headroom.",
        (
            Knob("traffic.rate_rps", 5_000, 20_000, 1_000),
            Knob("workers.service_time.base_ms", 8, 16, 1),
            Knob("workers.service_time.per_item_ms", 0.4, 1.0, 0.1),
            Knob("sla.target_ms", 100, 200, 10),
        ),
    ),
    "llm_chat": Situation(
        "llm_chat.yaml",
        "A chat assistant with a 300 ms first token",
        "A chat assistant on {model} ({params} B parameters in FP16; {layers} layers, {kv_heads} KV heads of "
        "{head_dim}, an FP16 KV cache) takes {rate} at peak, with prompts of about {prompt_tokens} tokens and "
        "answers of about {output_tokens}. Each replica is one {gpu} with {gpu_gb} GB; vLLM may use {util} of it "
        "and keeps {activations} GB for activations. A decode step of {batch} sequences takes {step_ms} ms, "
        "and a mean prompt's prefill adds {prefill_ms} ms to its step. The first token must come within "
        "{ttft} and each next one within {tpot}, at p{percentile}. A replica costs {price} an hour; keep "
        "{headroom} headroom.",
        (
            Knob("traffic.rate_rps", 20, 80, 5),
            Knob("traffic.tokens.prompt.mean", 600, 1400, 100),
            Knob("traffic.tokens.output.mean", 100, 300, 25),
        ),
        LLM_CHAT_STEPS,
        "llm",
        "replicas_headroom",
    ),
    "llm_kv_memory": Situation(
        "llm_kv_memory.yaml",
        "KV memory: how many sequences fit on one GPU",
        "A 7B model ({model}: {params} B parameters, {layers} layers, {kv_heads} KV heads of {head_dim}, "
        "no grouped-query attention) serves conversations of {seq_tokens} tokens, prompt and answer together, "
        "on one {gpu} with {gpu_gb} GB. vLLM may use {util} of the memory and keeps {activations} GB for "
        "activations; the KV cache is FP16. How many such sequences fit at once with FP16 weights, and with "
        "INT4 weights?",
        (
            Knob("traffic.tokens.prompt.fixed", 2560, 7680, 512),
            Knob("batching.gpu_memory_utilization", 0.85, 0.95, 0.01),
            Knob("batching.activations_gb", 1, 4, 0.5),
        ),
        KV_MEMORY_STEPS,
        "llm",
        None,
    ),
    "llm_static_batching": Situation(
        "llm_chat.yaml",
        "Continuous against static batching",
        "A chat assistant on {model} takes {rate}, with prompts of about {prompt_tokens} tokens and answers of "
        "about {output_tokens}. On one {gpu} a decode step of {batch} sequences takes {step_ms} ms and a mean "
        "prompt's prefill adds {prefill_ms} ms. With continuous batching a finished answer's place is taken at "
        "the next step. With static batching (request-level, as FasterTransformer serves) a batch of {batch} "
        "is prefilled together and runs until its longest answer is done; the longest of {batch} answers "
        "averages {longest} tokens. How many replicas does each need?",
        (
            Knob("traffic.rate_rps", 20, 80, 5),
            Knob("traffic.tokens.output.mean", 100, 300, 25),
        ),
        STATIC_STEPS,
        "llm",
        "static_replicas",
    ),
    "llm_chunked_prefill": Situation(
        "llm_chunked_prefill.yaml",
        "Chunked prefill and the TPOT tail",
        "A chat assistant on {model} ({rate}, one {gpu}) also takes long documents: about one request in a "
        "hundred brings {doc_tokens} tokens or more. The GPU prefills about {tokens_per_ms} tokens a ms; "
        "about {running} answers are being generated at any time, and a decode step of them takes {step_ms} ms. "
        "Without chunked prefill a document is computed in one step; with it, a step computes at most "
        "{chunk} tokens, the decodes included. What does a running answer see, and what does the document?",
        (
            Knob("traffic.rate_rps", 8, 16, 1),
            Knob("traffic.tokens.prompt.p99", 8000, 14000, 1000),
        ),
        CHUNKED_STEPS,
        "llm",
        None,
    ),
    "llm_rag_prefix": Situation(
        "llm_rag_prefix.yaml",
        "Prefix caching for RAG",
        "A RAG assistant on {model} takes {rate}. Each request is one of {groups} retrieved documents of "
        "{doc_tokens} tokens (the popular ones asked about most) and a question of about {question_tokens} "
        "tokens. Each of {replicas} replicas is one {gpu} with {gpu_gb} GB; vLLM may use {util} of it, keeps "
        "{activations} GB for activations, and the KV cache takes {kv_kb} KB a token. The GPU prefills about "
        "{tokens_per_ms} tokens a ms. With prefix caching, a replica that holds a document's blocks computes "
        "only the rest of the prompt.",
        (
            Knob("traffic.rate_rps", 40, 80, 5),
            Knob("traffic.tokens.prefix.tokens", 2000, 4000, 500),
            Knob("traffic.tokens.prefix.groups", 100, 300, 50),
        ),
        RAG_STEPS,
        "llm",
        None,
    ),
}

"""vLLM's metrics for the tiny engine's front end (``GET /metrics``): its names, labels
(``model_name``, ``engine``) and histogram buckets, so a dashboard or
:mod:`calibrate.watch_llm` built for vLLM reads this server as it reads vLLM.

The histograms and counters are observed as requests finish (:meth:`Metrics.finished`);
the gauges (running, waiting, KV usage), the engine's totals (preemptions, prefix-cache
hits and queries) and ``vllm:cache_config_info`` are read from the engine's latest step
when scraped.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from reference_server.llm.engine import EngineConfig
from reference_server.llm.worker import EngineClient

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py)
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
# fmt: on


def buckets_1_2_5(largest: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``largest`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > largest:
                return out
            out.append(float(m * scale))
        scale *= 10


class Metrics:
    """vLLM's metrics: histograms and counters observed here as requests finish, gauges and
    engine totals read from the engine's latest step."""

    def __init__(self, served: str, cfg: EngineConfig, client: EngineClient):
        self.registry = r = CollectorRegistry()
        self.labels = {"model_name": served, "engine": "0"}
        names = list(self.labels)

        def hist(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**self.labels)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_BUCKETS
        )
        tokens = buckets_1_2_5(cfg.max_model_len)
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.prompt_total = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r)
        self.generation_total = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"], registry=r
        )
        r.register(_EngineCollector(self.labels, cfg, client))

    def finished(self, arrival_ns: int, first_ns: int, last_ns: int, info: dict) -> None:
        s = 1e-9
        self.ttft.observe((first_ns - arrival_ns) * s)
        self.e2e.observe((last_ns - arrival_ns) * s)
        self.queue.observe((info["scheduled_ns"] - info["arrival_ns"]) * s)
        self.inference.observe((info["last_ns"] - info["scheduled_ns"]) * s)
        self.prefill.observe((info["first_ns"] - info["scheduled_ns"]) * s)
        self.decode.observe((info["last_ns"] - info["first_ns"]) * s)
        n_out = info["generation_tokens"]
        if n_out > 1:
            self.tpot.observe((last_ns - first_ns) * s / (n_out - 1))
        self.prompt_tokens.observe(info["prompt_tokens"])
        self.generation_tokens.observe(n_out)
        self.prompt_total.labels(**self.labels).inc(info["prompt_tokens"])
        self.generation_total.labels(**self.labels).inc(n_out)
        self.success.labels(**self.labels, finished_reason="length").inc()


class _EngineCollector:
    """The engine's gauges and running totals, as of its latest step."""

    def __init__(self, labels: dict, cfg: EngineConfig, client: EngineClient):
        self.labels, self.cfg, self.client = labels, cfg, client

    def collect(self):
        g, names, values = self.client.gauges, list(self.labels), list(self.labels.values())
        for name, doc, key in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
        ):
            m = GaugeMetricFamily(name, doc, labels=names)
            m.add_metric(values, float(g[key]))
            yield m
        for name, doc, key in (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions"),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_hits"),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                "prefix_queries",
            ),
        ):
            m = CounterMetricFamily(name, doc, labels=names)
            m.add_metric(values, float(g[key]))
            yield m
        c = self.cfg
        info = {
            "block_size": str(c.block_size),
            "num_gpu_blocks": str(c.num_blocks),
            "enable_prefix_caching": str(c.enable_prefix_caching),
            "max_num_batched_tokens": str(c.max_num_batched_tokens),
            "max_num_seqs": str(c.max_num_seqs),
            "kv_bytes_per_token": str(c.model.kv_bytes_per_token()),
        }
        m = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info))
        m.add_metric(list(info.values()), 1.0)
        yield m


__all__ = ["ITL_BUCKETS", "REQUEST_BUCKETS", "TTFT_BUCKETS", "Metrics", "buckets_1_2_5"]

"""Observability: Prometheus metrics with Triton's names, Triton-style statistics, GPU sampling.

Triton exports cumulative counters (``nv_inference_request_success``,
``nv_inference_queue_duration_us``, ``nv_inference_compute_infer_duration_us``, …); the
same names are kept here, and per-stage histograms are added so a scrape shows the
distribution, not only the mean. ``/v2/models/{m}/stats`` answers Triton's statistics
JSON, batch statistics included, so calibration can read this server as it reads Triton.
"""

from __future__ import annotations

import gc
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")
BATCH_STAGES = (*STAGES[1:], "handoff")  # handoff: to a model instance's process and back (servesim's own)
BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class GPU:
    """pynvml sampling of the first GPU, or a notice when there is none."""

    def __init__(self):
        self.handle = None
        self.name = None
        self.notice = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self.handle)
            self._nvml = pynvml
        except Exception as err:  # no driver, no GPU, or no pynvml: the server runs on the CPU
            self.notice = f"no NVIDIA GPU visible ({type(err).__name__}); GPU metrics are off"

    def sample(self) -> tuple[float, float] | None:
        """(utilization 0..1, memory used in bytes), or None without a GPU."""
        if self.handle is None:
            return None
        util = self._nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0
        mem = self._nvml.nvmlDeviceGetMemoryInfo(self.handle).used
        return util, float(mem)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FrontEndCPU:
    """``process_cpu_seconds_total`` of this process and its front-end workers together.

    A worker that exits takes its CPU out of the sum, so the counter can fall at a shutdown;
    calibration reads it while every worker serves."""

    def __init__(self, extra_pids: Callable[[], list[int]]):
        self.extra_pids = extra_pids

    def collect(self):
        hub = cpu_seconds(os.getpid())
        total = hub + sum(cpu_seconds(p) for p in self.extra_pids())
        yield CounterMetricFamily(
            "process_cpu_seconds_total", "CPU seconds of the front end's processes (hub and workers)", value=total
        )
        # the hub is one process in series with every request: its own share, to fit it apart
        yield CounterMetricFamily(
            "servesim_hub_cpu_seconds", "CPU seconds of the hub (the batcher's process) alone", value=hub
        )


class ServerMetrics:
    """Counters, histograms and statistics of one model."""

    def __init__(self, model: str, version: str = "1", extra_pids: Callable[[], list[int]] | None = None):
        self.model, self.version = model, version
        self.registry = CollectorRegistry()
        labels = ["model", "version"]
        r = self.registry
        # process_cpu_seconds_total: the front end's CPU (the instances are other processes),
        # which calibration divides by the requests served to get its CPU per request; with
        # several front ends (extra_pids: the workers), theirs and this process's together
        if extra_pids is None:
            ProcessCollector(registry=r)
        else:
            r.register(FrontEndCPU(extra_pids))
        self.success = Counter("nv_inference_request_success", "Successful requests", labels, registry=r)
        self.failure = Counter("nv_inference_request_failure", "Failed requests", [*labels, "reason"], registry=r)
        self.count = Counter("nv_inference_count", "Inferences (items) performed", labels, registry=r)
        self.exec_count = Counter("nv_inference_exec_count", "Batches executed", labels, registry=r)
        self.durations = {
            name: Counter(f"nv_inference_{name}_duration_us", f"Cumulative {name} time, us", labels, registry=r)
            for name in ("request", *STAGES)
        }
        self.pending = Gauge("nv_inference_pending_request_count", "Requests queued", labels, registry=r)
        self.hist = Histogram(
            "servesim_stage_duration_seconds",
            "Per-request stage time",
            [*labels, "stage"],
            buckets=BUCKETS_S,
            registry=r,
        )
        # the front end's garbage collections: a full one over torch's objects took ~100 ms, every
        # request waiting; gc.freeze() at start-up leaves the ones over what was made since
        self.gc_pause = Histogram(
            "servesim_gc_pause_seconds",
            "Garbage-collection pauses of the front end's process",
            ["generation"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2),
            registry=r,
        )
        self._gc_t0 = 0
        gc.callbacks.append(self._gc)
        self.gpu = GPU()
        self.gpu_util = Gauge("nv_gpu_utilization", "GPU utilization (0..1)", ["gpu"], registry=r)
        self.gpu_mem = Gauge("nv_gpu_memory_used_bytes", "GPU memory used", ["gpu"], registry=r)
        self.stats = {k: [0, 0] for k in ("success", "fail", *STAGES)}  # count, ns
        self.items = 0  # inferences (Triton's inference_count counts items, not requests)
        self.batch_stats: dict[int, dict[str, list[int]]] = defaultdict(lambda: {s: [0, 0] for s in BATCH_STAGES})
        self.last_inference_ms = 0

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter_ns()
        elif self._gc_t0:
            self.gc_pause.labels(str(info["generation"])).observe((time.perf_counter_ns() - self._gc_t0) / 1e9)

    def close(self) -> None:
        """Stop timing collections (the process goes on without this registry)."""
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def observe(self, timing_us: dict[str, float], items: int) -> None:
        """One successful request: its stage times (us) and item count."""
        lab = (self.model, self.version)
        self.success.labels(*lab).inc()
        self.count.labels(*lab).inc(items)
        for name, us in timing_us.items():
            stage = name.removesuffix("_us")
            if stage in self.durations:
                self.durations[stage].labels(*lab).inc(us)
            self.hist.labels(*lab, stage).observe(us / 1e6)
            if stage in self.stats:
                self.stats[stage][0] += 1
                self.stats[stage][1] += int(us * 1e3)
        self.stats["success"][0] += 1
        self.stats["success"][1] += int(timing_us.get("request_us", 0) * 1e3)
        self.items += items
        self.last_inference_ms = int(time.time() * 1000)

    def observe_batch(self, size: int, timing_ns: dict[str, int]) -> None:
        self.exec_count.labels(self.model, self.version).inc()
        for stage in BATCH_STAGES:
            s = self.batch_stats[size][stage]
            s[0] += 1
            s[1] += int(timing_ns.get(stage, 0))

    def fail(self, reason: str) -> None:
        self.failure.labels(self.model, self.version, reason).inc()
        self.stats["fail"][0] += 1

    def scrape(self, pending: int) -> bytes:
        self.pending.labels(self.model, self.version).set(pending)
        g = self.gpu.sample()
        if g is not None:
            self.gpu_util.labels("0").set(g[0])
            self.gpu_mem.labels("0").set(g[1])
        return generate_latest(self.registry)

    def triton_stats(self) -> dict:
        """Triton's ``/v2/models/{m}/stats`` document."""

        def pair(c):
            return {"count": c[0], "ns": c[1]}

        return {
            "model_stats": [
                {
                    "name": self.model,
                    "version": self.version,
                    "last_inference": self.last_inference_ms,
                    "inference_count": int(self.items),
                    "execution_count": int(sum(v["compute_infer"][0] for v in self.batch_stats.values())),
                    "inference_stats": {k: pair(v) for k, v in self.stats.items()},
                    "batch_stats": [
                        {"batch_size": size, **{k: pair(v) for k, v in st.items()}}
                        for size, st in sorted(self.batch_stats.items())
                    ],
                }
            ]
        }

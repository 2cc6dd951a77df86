"""A pool's autoscaler in a scenario (``workers.autoscaler``, and each pool's of a
disaggregated LLM fleet): Kubernetes HPA's or Knative's settings, with their defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.scenario.frozen import Frozen

Metric = Literal["in_flight", "queue_depth", "utilization", "p99_ms", "ttft_ms"]


class Autoscaler(Frozen):
    """Autoscaler settings (Kubernetes defaults where Kubernetes has them)."""

    policy: Literal["hpa", "knative"] = Field("hpa", description="hpa (Kubernetes HPA) or knative (KPA).")
    metric: Metric = Field(
        "in_flight",
        description="in_flight (queued + in service, per worker), queue_depth (per worker), "
        "utilization (busy instances / instances; an LLM replica's: its share of KV blocks in use), p99_ms "
        "(server latency over metric_window_s), or ttft_ms (LLM replicas: the p99 time to first token of "
        "the pool's first tokens over metric_window_s).",
    )
    target: float = Field(gt=0, description="Target value of the metric per worker (Knative: concurrency per pod).")
    min_replicas: int = Field(1, ge=0, description="Fewest workers.")
    max_replicas: int = Field(1000, ge=1, description="Most workers.")
    sync_period_s: float = Field(15.0, gt=0, description="Evaluation period, s (HPA 15 s; Knative ticks every 2 s).")
    scrape_delay_s: float = Field(0.0, ge=0, description="Age of the metric when the autoscaler reads it, s.")
    metric_window_s: float = Field(30.0, gt=0, description="Window of the p99_ms and ttft_ms metrics, s.")
    tolerance: float = Field(0.1, ge=0, description="HPA: no change while |metric/target - 1| <= tolerance.")
    scale_down_stabilization_s: float = Field(300.0, ge=0, description="HPA: scale-down stabilization window, s.")
    scale_up_percent: float = Field(100.0, ge=0, description="HPA: scale-up policy, percent per period.")
    scale_up_pods: int = Field(4, ge=0, description="HPA: scale-up policy, pods per period.")
    scale_up_period_s: float = Field(15.0, gt=0, description="HPA: period of the scale-up policies, s.")
    stable_window_s: float = Field(60.0, gt=0, description="Knative: stable window, s.")
    panic_window_s: float = Field(6.0, gt=0, description="Knative: panic window, s.")
    panic_threshold: float = Field(2.0, gt=1, description="Knative: panic when the panic window asks for this x ready.")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaler:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaler.min_replicas must not exceed max_replicas")
        if self.policy == "knative" and self.metric != "in_flight":
            raise ValueError("the knative policy scales on concurrency: metric must be in_flight")
        return self


__all__ = ["Autoscaler", "Metric"]

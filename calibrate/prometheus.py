"""A server's ``/metrics`` page (Prometheus text), read with prometheus_client's parser:
the exposition format's escapes, label values with commas, timestamps and ``_created``
samples as the format means them. Read by the image twin (:func:`calibrate.watch.parse_metrics`),
the LLM twin (:func:`calibrate.vllm_metrics.parse`) and the load generator, around each
slice (:func:`frontend_counters`)."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class NotMetrics(ValueError):
    """A page that is not Prometheus text (an HTML error page, a truncated body)."""


def samples(text: str) -> list[Sample]:
    """Every sample of the page, in order; :class:`NotMetrics` for a page the parser refuses."""
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError as err:
        raise NotMetrics(f"not Prometheus text: {err}") from None


def frontend_counters(text: str) -> dict[str, float]:
    """servesim's server, from its page: its process's CPU seconds (``cpu_s``; with several
    front ends, their hub's own in ``hub_cpu_s``), and its garbage collections so far
    (``gc_s`` in all, and ``gc_over_10ms``: how many took over 10 ms); nan for what it
    does not export."""
    out = {"cpu_s": math.nan, "gc_s": math.nan, "gc_over_10ms": math.nan, "hub_cpu_s": math.nan}
    total = quick = 0.0
    for s in samples(text):
        if s.name == "process_cpu_seconds_total":
            out["cpu_s"] = s.value
        elif s.name == "servesim_hub_cpu_seconds_total":  # --frontends: the batcher's process alone
            out["hub_cpu_s"] = s.value
        elif s.name == "servesim_gc_pause_seconds_sum":
            out["gc_s"] = (0.0 if math.isnan(out["gc_s"]) else out["gc_s"]) + s.value
        elif s.name == "servesim_gc_pause_seconds_count":
            total += s.value
        elif s.name == "servesim_gc_pause_seconds_bucket" and float(s.labels.get("le", "nan")) == 0.01:
            quick += s.value
    if not math.isnan(out["gc_s"]):
        out["gc_over_10ms"] = total - quick
    return out

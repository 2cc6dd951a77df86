"""The one reader of a server's /metrics page (calibrate/prometheus.py): prometheus_client's
own exposition read back, label values the old hand-split parsers broke on, and a page that
is not metrics refused by name."""

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from calibrate.prometheus import NotMetrics, frontend_counters, samples
from calibrate.watch import WatchError, parse_metrics


def page(gc_pauses_s, cpu_s=None, hub_s=None) -> str:
    r = CollectorRegistry()
    gc = Histogram("servesim_gc_pause_seconds", "pauses", ["generation"], buckets=(0.005, 0.01, 0.05), registry=r)
    for gen, s in gc_pauses_s:
        gc.labels(generation=gen).observe(s)
    if cpu_s is not None:
        Counter("process_cpu_seconds", "cpu", registry=r).inc(cpu_s)
    if hub_s is not None:
        Counter("servesim_hub_cpu_seconds", "hub", registry=r).inc(hub_s)
    return generate_latest(r).decode()


def test_the_front_ends_cpu_and_pauses_are_read_off_its_page():
    got = frontend_counters(page([("0", 0.002), ("2", 0.05), ("2", 0.2), ("1", 0.01)], cpu_s=12.5, hub_s=3.0))
    assert got["cpu_s"] == 12.5
    assert got["hub_cpu_s"] == 3.0
    assert got["gc_s"] == pytest.approx(0.262)
    assert got["gc_over_10ms"] == 2  # 10 ms itself is in the le="0.01" bucket


def test_what_a_page_lacks_is_nan():
    got = frontend_counters(page([]))  # a labelled histogram shows nothing before its first pause
    assert all(math.isnan(v) for v in got.values())


def test_a_label_value_with_a_comma_or_a_quote_stays_whole():
    text = (
        'nv_inference_request_success_total{model="a,b",version="1"} 7\n'
        'nv_inference_request_success_total{model="c\\"d",version="1"} 5\n'
    )
    assert [(s.labels["model"], s.value) for s in samples(text)] == [("a,b", 7.0), ('c"d', 5.0)]
    assert parse_metrics(text, "a,b")["counters"] == {"nv_inference_request_success": 7.0}


def test_a_page_that_is_not_metrics_is_refused_by_name():
    html = "<html><body>502 Bad Gateway</body></html>"
    with pytest.raises(NotMetrics, match="not Prometheus text"):
        samples(html)
    with pytest.raises(WatchError, match="/metrics: not Prometheus text"):
        parse_metrics(html, "resnet")
    with pytest.raises(NotMetrics):  # the load generator then keeps the slice, without these figures
        frontend_counters(html)

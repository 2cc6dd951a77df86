"""A fleet of LLM replicas on more than one GPU type (``workers.mix``): each replica steps
by its own GPU's roofline and holds its own GPU's KV blocks, the fleet is priced type by
type, routing by state spreads the load by speed where round robin overloads the slow
replicas, a fleet of another size keeps each type's share, and bad input is refused before
the run with the field and its line."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario
from simulator.engine import simulate
from simulator.results.reduce import summarize
from simulator.results.tokens import ttft_ms
from simulator.serving.continuous import LLMService
from simulator.serving.llm_serve import serve
from simulator.serving.llm_types import Limits
from simulator.serving.step_time import step_model
from tests.test_bad_input import ROOT, cli, one_error

CHAT = ROOT / "scenarios/llm_chat.yaml"
MIXED = ["workers.count=3", "workers.mix={a100: 1, l4: 1}", "traffic.tokens.output.max=512"]


def test_each_replica_steps_and_holds_kv_as_its_gpu_does():
    """Requests far apart, round robin over an H100, an A100 and an L4: each request takes
    exactly what a lone replica of its GPU gives it (its prefill and every decode on that
    GPU's roofline), and each replica has its GPU's KV blocks."""
    s = load_scenario(
        CHAT,
        [
            *MIXED,
            "duration_s=120",
            "warmup_s=0",
            "traffic.rate_rps=0.1",
            "batching.noise_cv=0",
            "traffic.tokens.prompt.max=2000",
            "network.client_to_api=null",
            "network.api_to_client=null",
        ],
    )
    assert s.workers.types() == ["h100", "a100", "l4"]
    service = LLMService.of(s.batching, "h100", np.random.default_rng(0), s.router, None, s.workers)
    for k, gpu in enumerate(s.workers.types()):
        assert service.replica(k).kv.num_blocks == s.batching.blocks(gpu)
    r = simulate(s).records
    assert len(r) > 5
    b = s.batching
    for i in range(len(r)):
        gpu = s.workers.types()[int(r.instance[i])]
        lim = Limits(num_blocks=b.blocks(gpu), block_size=b.block_size, max_num_batched_tokens=8192)
        alone = serve(np.zeros(1), r.prompt_tokens[i : i + 1], r.output_tokens[i : i + 1], step_model(b, gpu), lim)
        assert r.t_first_token[i] - r.t_dispatch[i] == pytest.approx(alone.first_token[0], rel=1e-9)
        assert r.t_inferred[i] - r.t_dispatch[i] == pytest.approx(alone.done[0], rel=1e-9)
    assert set(r.instance.tolist()) == {0, 1, 2}


def test_a_mixed_fleet_is_priced_type_by_type():
    s = load_scenario(CHAT, ["workers.count=5", "workers.mix={a100: 2}", "duration_s=5", "warmup_s=1"])
    per_hour = summarize(simulate(s))["cost"]["per_hour_usd"]
    h100 = load_scenario(CHAT, []).price_per_worker_hour_usd
    a100 = load_scenario(CHAT, ["workers.instance_type=a100", "traffic.tokens.prompt.max=4000"])
    assert per_hour == pytest.approx(3 * h100 + 2 * a100.price_per_worker_hour_usd, rel=1e-12)


def test_routing_by_state_spreads_a_mixed_fleet_by_speed():
    """Three H100s and two A100s (half the bandwidth, half the KV): round robin sends the
    A100s as many requests as the H100s and their queues grow; least loaded sends them
    fewer, and the TTFT tail is far lower on the same requests."""
    base = ["workers.count=5", "workers.mix={a100: 2}", "duration_s=40", "warmup_s=10"]
    got = {}
    for balancing in ("round_robin", "least_loaded"):
        r = simulate(load_scenario(CHAT, [*base, f"router.balancing={balancing}"])).records
        done = r.completed & (r.arrival >= 10_000)
        got[balancing] = (np.bincount(r.instance[done], minlength=5), np.nanpercentile(ttft_ms(r)[done], 99))
    per_replica = got["least_loaded"][0]
    assert per_replica[3:].mean() < 0.8 * per_replica[:3].mean()
    assert got["least_loaded"][1] < got["round_robin"][1] / 5


def test_a_fleet_of_another_size_keeps_each_types_share():
    from simulator.planning.plan import with_workers

    s = load_scenario(CHAT, ["workers.count=5", "workers.mix={a100: 2}"])
    shares = {n: with_workers(s, n).workers.mix for n in (1, 2, 5, 8)}
    assert shares == {1: {}, 2: {"a100": 1}, 5: {"a100": 2}, 8: {"a100": 3}}
    h100 = load_scenario(CHAT, []).price_per_worker_hour_usd
    a100 = load_scenario(CHAT, ["workers.instance_type=a100", "traffic.tokens.prompt.max=4000"])
    mean = (5 * h100 + 3 * a100.price_per_worker_hour_usd) / 8  # repriced: 5 H100s and 3 A100s
    assert with_workers(s, 8).price_per_worker_hour_usd == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "workers.mix={a100: 4}"], ["workers.mix", "leaves none of workers.instance_type"]),
        (["--set", "workers.mix={a100: 0}"], ["workers.mix.a100", "at least 1"]),
        (["--set", "workers.mix={h100: 1}"], ["workers.mix.h100", "count it there"]),
        (["--set", "workers.mix={tpu: 1}"], ["workers.mix.tpu", "no GPU preset"]),
        (
            ["--set", "workers.mix={a100: 1}", "--set", "batching.step_time={c0_ms: 5}"],
            ["workers.mix", "fitted on one GPU"],
        ),
    ],
)
def test_bad_mixes_are_refused_before_the_run(args, needles):
    text = one_error(cli("run", CHAT, *args), *needles)
    assert "line " in text


def test_a_mix_needs_llm_replicas():
    res = cli("run", ROOT / "scenarios/inference_platform.yaml", "--set", "workers.mix={t4: 10}")
    one_error(res, "workers.mix", "LLM replicas")


def test_an_autoscaled_mixed_fleet_adds_its_main_type_and_bills_each_type_its_price():
    """A fleet of an H100 and an A100 under an HPA on a rising then falling rate: the
    replicas it adds are H100s (workers.instance_type), with an H100's step time and KV
    blocks, and the cost is each replica's billed time at its own type's price."""
    from simulator.results.stats import overlap
    from simulator.serving.lives import WorkerState

    s = load_scenario(
        CHAT,
        [
            "workers.count=2",
            "workers.mix={a100: 1}",
            "duration_s=120",
            "warmup_s=0",
            "traffic.rate_rps=12",
            "traffic.shape={kind: diurnal, peak_to_mean: 1.8, period_s: 120, peak_at_s: 60}",
            "traffic.tokens.prompt.max=3000",
            "router.balancing=least_loaded",
            "workers.autoscaler={metric: in_flight, target: 8, max_replicas: 6, sync_period_s: 5, "
            "scale_down_stabilization_s: 10}",
            "workers.cold_start={model_load: {kind: lognormal, mean_ms: 5000, cv: 0.3}}",
        ],
    )
    run = simulate(s)
    fleet = run.fleet
    gpus = [w.gpu for w in fleet.workers]
    assert gpus[:2] == ["h100", "a100"]
    assert len(gpus) > 2
    assert set(gpus[2:]) == {"h100"}
    assert any(str(e[1]) == "scale_down" for e in fleet.events)
    h100 = load_scenario(CHAT, []).price_per_worker_hour_usd
    a100 = load_scenario(
        CHAT, ["workers.instance_type=a100", "traffic.tokens.prompt.max=4000"]
    ).price_per_worker_hour_usd
    b0, b1 = fleet.intervals(WorkerState.BILLED)
    billed = overlap(b0, b1, 0.0, 120_000.0) / 120_000.0
    want = sum(n * (a100 if g == "a100" else h100) for n, g in zip(billed, gpus, strict=True))
    out = summarize(run)
    assert out["cost"]["per_hour_usd"] == pytest.approx(want, rel=1e-9)
    by_type = out["fleet"]["billed_by_type"]
    assert set(by_type) == {"h100", "a100"}
    assert sum(by_type.values()) == pytest.approx(out["fleet"]["billed_mean"])
    assert want != pytest.approx(billed.sum() * s.price_per_worker_hour_usd, rel=1e-3)  # not the start's mean price
    from simulator.serving.step_time import Work

    service = LLMService.of(s.batching, "h100", np.random.default_rng(0), s.router, None, s.workers)
    one = Work(decodes=1, decode_context=1000)
    for k, gpu in ((2, "h100"), (1, "a100")):  # an added replica, and the A100 it started with
        assert service.replica(k).kv.num_blocks == s.batching.blocks(gpu)
        assert service.replica(k).step.ms(one) == step_model(s.batching, gpu).ms(one)
    assert step_model(s.batching, "h100").ms(one) != step_model(s.batching, "a100").ms(one)


def test_a_mixed_fleet_is_not_sampled():
    """Sampling 2 of 3 H100s and 2 A100s kept the mix and simulated two A100s for the whole
    fleet (TTFT p99 5.7 s); the replicas are not alike, so sampling is refused."""
    args = ["--set", "workers.count=5", "--set", "workers.mix={a100: 2}", "--set", "router.balancing=random"]
    one_error(cli("run", CHAT, *args, "--sample-workers", "2", "--duration-s", "20"), "workers.mix", "not alike")

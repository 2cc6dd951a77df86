"""LLM serving in a scenario (``batching.kind: continuous``, ``traffic.tokens``): the
command line answers the chat question with TTFT and TPOT verdicts, tokens and cost; the
records carry each request's tokens; bad input is refused before the run with the field
and its line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simulator import load_scenario
from simulator.engine import simulate
from simulator.results.tokens import tpot_ms, ttft_ms
from tests.test_bad_input import ROOT, cli, one_error

CHAT = ROOT / "scenarios/llm_chat.yaml"


def test_the_chat_scenario_runs_on_the_command_line(tmp_path):
    out, rec = tmp_path / "s.json", tmp_path / "r.parquet"
    res = cli("run", CHAT, "--duration-s", "20", "--set", "warmup_s=5", "--json", out, "--records", rec, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())  # as wrapped to the terminal's width
    assert "time to first token" in text
    assert "TTFT p99 ≤ 300 ms" in text
    assert "per million output tokens" in text
    llm = json.loads(out.read_text())["llm"]
    assert 0 < llm["ttft_ms"]["p50"] <= llm["ttft_ms"]["p99"]
    assert 0 < llm["tpot_ms"]["p50"] <= llm["tpot_ms"]["p99"]
    assert llm["sla"]["ttft"]["target_ms"] == 300
    assert llm["tokens"]["output_per_s"] > 0
    cost, tok = llm["cost"], llm["tokens"]  # the split adds back up to the fleet's cost
    hourly = json.loads(out.read_text())["cost"]["per_hour_usd"]
    split = (
        (
            cost["per_million_input_tokens_usd"] * tok["prompt_per_s"]
            + cost["per_million_output_tokens_usd"] * tok["output_per_s"]
        )
        * 3600
        / 1e6
    )
    assert split == pytest.approx(hourly, rel=1e-9)
    assert 0 < cost["prefill_share_of_gpu_time"] < 1
    frame = pd.read_parquet(rec)
    for column in ("t_first_token_ms", "prompt_tokens", "output_tokens", "preemptions", "cached_tokens"):
        assert column in frame.columns
    done = frame[frame.outcome == "completed"]
    assert (done.t_first_token_ms >= done.t_dispatch_ms).all()
    assert (done.t_inferred_ms >= done.t_first_token_ms).all()


def test_ttft_and_tpot_follow_their_definitions():
    """TTFT as the client sees it (send to the first token's arrival), TPOT after the
    first token; a one-token answer has no TPOT."""
    s = load_scenario(CHAT, ["duration_s=5", "warmup_s=0", "workers.count=2", "traffic.rate_rps=8"])
    r = simulate(s).records
    ttft, tpot = ttft_ms(r), tpot_ms(r)
    done = r.completed
    back = r.t_response - r.t_postprocessed
    assert np.allclose(ttft[done], (r.t_first_token - r.arrival + back)[done])
    many = done & (r.output_tokens > 1)
    assert np.allclose(tpot[many], ((r.t_inferred - r.t_first_token) / (r.output_tokens - 1))[many])
    assert np.isnan(tpot[r.output_tokens == 1]).all()
    assert (ttft[done] > 0).all()


def test_prefix_groups_are_served_from_the_cache():
    s = load_scenario(
        CHAT,
        ["duration_s=10", "warmup_s=0", "workers.count=2", "traffic.rate_rps=10",
         "traffic.tokens.prefix={share: 0.8, groups: 2, tokens: 1024}"],
    )  # fmt: skip
    r = simulate(s).records
    grouped = r.cached_tokens > 0
    assert grouped.mean() > 0.5
    assert (r.cached_tokens <= r.prompt_tokens - 1).all()  # the last prompt token is always computed
    off = simulate(s.model_copy(update={"batching": s.batching.model_copy(update={"enable_prefix_caching": False})}))
    assert off.records.cached_tokens.sum() == 0


def test_policies_differ_as_they_should_on_the_same_traffic():
    """Common random numbers: the same requests under continuous and static batching;
    static's TTFT is far worse (a request waits for the batch before it to finish)."""
    base = ["duration_s=20", "warmup_s=2", "workers.count=2", "traffic.rate_rps=12"]
    cont = simulate(load_scenario(CHAT, base)).records
    static = simulate(load_scenario(CHAT, [*base, "batching.policy=static"])).records
    assert np.array_equal(cont.output_tokens, static.output_tokens)
    assert np.nanmedian(ttft_ms(static)) > 3 * np.nanmedian(ttft_ms(cont))


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "batching.num_blocks=300"], ["traffic.tokens.prompt", "can never fit the KV cache"]),
        (["--set", "traffic.tokens.output={fixed: 0}"], ["traffic.tokens.output", "at least 1"]),
        (["--set", "batching.block_size=0"], ["batching.block_size", "greater than or equal to 1"]),
        (
            ["--set", "batching.num_blocks=600", "--set", "batching.max_num_seqs=1024"],
            ["batching.max_num_seqs", "exceeds the 600 KV blocks"],
        ),
        (["--set", "workers.instance_type=tpu-v5"], ["workers.instance_type", "no GPU preset"]),
        (["--set", "batching.model=gpt-5"], ["batching.model", "not a preset"]),
        (["--set", "traffic.tokens.prompt.max=null"], ["traffic.tokens.prompt", "has no max"]),
        (
            ["--set", "batching.step_time={c0_ms: 0, decode_ms_per_seq: 0.1}"],
            ["batching.step_time.c0_ms", "greater than 0"],
        ),
    ],
)
def test_bad_llm_input_is_refused_before_the_run(args, needles):
    text = one_error(cli("run", CHAT, *args), *needles)
    assert "line " in text


def test_explain_writes_the_llm_napkin_and_checks_it(tmp_path):
    """The napkin of the chat question: weights, KV bytes per token (Llama-3-8B's 128 KiB),
    concurrent sequences, a decode step, Little's law, replicas and cost; then the
    simulator's TTFT and TPOT at the napkin's counts and the minimum."""
    doc = tmp_path / "explain.json"
    res = cli("explain", CHAT, "--set", "duration_s=15", "--set", "warmup_s=3", "--json", doc, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    for words in ("KV bytes per token", "max concurrent sequences", "Little", "replicas with headroom", "TTFT p99"):
        assert words in res.stdout, words
    got = json.loads(doc.read_text())
    lines = {ln["quantity"]: ln["value"] for ln in got["napkin"]}
    assert lines["KV bytes per token"] == pytest.approx(131.072)  # KB: 2 x 32 x 8 x 128 x 2 bytes
    assert lines["weights"] == pytest.approx(16.06)
    assert 1 <= lines["replicas"] <= lines["replicas with headroom"]
    assert got["minimum_workers"] is not None


RAG = ROOT / "scenarios/llm_rag_prefix.yaml"
SHORT = ["duration_s=30", "warmup_s=5"]


def test_routing_by_prefix_keeps_documents_where_they_are_cached():
    """The RAG scenario: 200 shared documents overflow one replica's KV cache. Round robin
    makes every replica cache every document; prefix affinity (and llm-d's weighted score)
    send a document's questions where it is cached: more of the prompts served from the
    cache, and lower TTFT and TPOT tails, on the same requests."""
    got = {}
    for balancing in ("round_robin", "prefix_affinity", "scored", "least_loaded"):
        r = simulate(load_scenario(RAG, [*SHORT, f"router.balancing={balancing}"])).records
        done = r.completed & (r.arrival >= 5000)
        got[balancing] = (
            r.cached_tokens[done].sum() / r.prompt_tokens[done].sum(),
            np.nanpercentile(ttft_ms(r)[done], 99),
            np.nanpercentile(tpot_ms(r)[done], 99),
        )
    assert got["prefix_affinity"][0] > got["round_robin"][0] + 0.05
    assert got["scored"][0] > got["round_robin"][0] + 0.05
    for better in ("prefix_affinity", "scored"):
        assert got[better][1] < got["round_robin"][1]
        assert got[better][2] < got["round_robin"][2]


def test_least_loaded_balances_the_replicas():
    """Least loaded spreads the requests over the replicas at least as evenly as round
    robin (its picks follow the load, not the turn)."""
    s = load_scenario(CHAT, ["duration_s=20", "warmup_s=0", "router.balancing=least_loaded"])
    r = simulate(s).records
    counts = np.bincount(r.instance[r.completed], minlength=s.workers.count)
    assert counts.min() > 0.8 * counts.mean()


def test_routing_by_state_needs_llm_replicas():
    res = cli("run", ROOT / "scenarios/inference_platform.yaml", "--set", "router.balancing=prefix_affinity")
    one_error(res, "router.balancing", "needs batching.kind continuous")


def test_the_highest_rate_one_replica_serves_is_distserves_goodput(tmp_path):
    """``plan --max-rate`` on one replica: the highest rate at which the percentile of
    requests meets both TTFT and TPOT, DistServe's goodput per GPU; below the napkin's
    ceiling, and met there while twice it is not."""
    table = tmp_path / "points.csv"
    res = cli(
        "plan", CHAT, "--max-rate", "--set", "workers.count=1", "--set", "duration_s=40", "--set", "warmup_s=5",
        "--table", table, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    points = pd.read_csv(table)
    best = points[points.met].rate_rps.max()
    assert 1 < best < points.rate_rps.max()
    assert not points[points.rate_rps > 2 * best].met.any()


def _trace(tmp_path, rows: str):
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    text = CHAT.read_text().replace("  rate_rps: 50\n", "  arrivals_file: trace.csv\n")
    lengths = "    prompt: {mean: 1000, p99: 3500, max: 8192}\n    output: {mean: 200, p99: 600, max: 2048}\n"
    text = text.replace(lengths, "    from_trace: true\n")
    (tmp_path / "chat_trace.yaml").write_text(text)
    return tmp_path / "chat_trace.yaml"


def test_a_trace_of_token_counts_is_replayed_request_by_request(tmp_path):
    """``traffic.tokens.from_trace``: each row's arrival, prompt and output tokens, in time
    order (the file's rows need not be), become a request."""
    rng = np.random.default_rng(2)
    n = 400
    t = np.sort(rng.uniform(0, 19, n))
    prompt, output = rng.integers(1, 3000, n), rng.integers(1, 500, n)
    order = rng.permutation(n)  # shuffled rows
    rows = "".join(f"{t[i]:.6f},{prompt[i]},{output[i]}\n" for i in order)
    s = load_scenario(_trace(tmp_path, rows), ["duration_s=20", "warmup_s=0"])
    r = simulate(s).records
    assert np.allclose(r.arrival, t * 1000.0)
    assert np.array_equal(r.prompt_tokens, prompt)
    assert np.array_equal(r.output_tokens, output)
    assert r.completed.all()


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ("0.1,100\n", "three columns"),
        ("0.1,100,0\n", "output_tokens must be a whole number >= 1"),
        ("0.1,100.5,3\n", "prompt_tokens must be a whole number"),
        ("0.1,900000,10\n", "can never fit the KV cache"),
    ],
)
def test_a_bad_trace_is_refused_before_the_run(tmp_path, rows, words):
    one_error(cli("run", _trace(tmp_path, rows)), "traffic.arrivals_file", words)


def test_the_budget_counts_an_llm_fleets_steps_and_kv():
    """``check`` says what an LLM run will cost before it starts: its steps (at most one a
    shortest step on every replica) and the KV blocks the prefix cache may keep."""
    from simulator.planning.budget import estimate

    small = estimate(load_scenario(CHAT))
    big = estimate(load_scenario(CHAT, ["workers.count=100", "traffic.rate_rps=1250", "duration_s=3600"]))
    assert small.wall_s < 30
    assert big.wall_s > 600  # an hour of 100 replicas is not quick, and check says so
    assert big.parts["kv"] == pytest.approx(100 * 25_720 * 200)


def test_the_kv_in_use_and_the_running_agree_with_the_records():
    """Self-consistency on a run: the KV tokens the replicas' steps say they hold,
    integrated over time, equal what the records imply (each request holds its prompt from
    its first step to its last token, and its answer growing from its first token), within
    the blocks' rounding; the timeline's running sequences integrate to the requests'
    residences (Little's law), and its output tokens add up to the records'."""
    s = load_scenario(CHAT, ["duration_s=60", "warmup_s=0"])
    run = simulate(s)
    r, b = run.records, run.batches
    room = s.batching.blocks(s.workers.instance_type) * s.batching.block_size
    steps = (b.kv_usage * (b.end - b.start)).sum() * room
    implied = (
        r.prompt_tokens * (r.t_inferred - r.t_dispatch) + r.output_tokens * (r.t_inferred - r.t_first_token) / 2
    ).sum()
    assert steps == pytest.approx(implied, rel=0.02)
    from simulator.results.reduce import summarize

    timeline = pd.DataFrame(summarize(run)["timeline"])
    assert timeline.running.sum() * 1000.0 == pytest.approx((r.t_inferred - r.t_dispatch).sum(), rel=1e-9)
    assert timeline.output_tokens_per_s.sum() == r.output_tokens[r.completed].sum()
    assert timeline.kv_usage.between(0, 1).all()


def test_other_runs_keep_their_timeline_columns():
    from simulator.results.reduce import summarize
    from simulator.results.timeline import LLM_COLUMNS

    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=1", "warmup_s=0"])
    row = summarize(simulate(s))["timeline"][0]
    assert not set(LLM_COLUMNS) & set(row)


def test_smaller_prefill_chunks_shorten_the_worst_pause_in_a_stream():
    """The chat question on its 4 H100s, the step's token budget 8,192 against 512: a long
    prompt prefilled in one step stalls every decode sharing it, so the p99 of each
    request's worst gap between tokens (and of TPOT) falls with smaller chunks, while
    TTFT's p99 rises a little (a prompt takes more steps): Sarathi-Serve's trade."""
    got = {}
    for budget in (512, 8192):
        r = simulate(load_scenario(CHAT, ["duration_s=60", f"batching.max_num_batched_tokens={budget}"])).records
        done = r.completed & (r.arrival >= s_warm(CHAT)) & (r.output_tokens > 1)
        got[budget] = [np.percentile(x[done], 99) for x in (r.max_itl_ms, tpot_ms(r), ttft_ms(r))]
    assert got[512][0] < 0.3 * got[8192][0]
    assert got[512][1] < got[8192][1]
    assert got[512][2] > got[8192][2]


def s_warm(path) -> float:
    return load_scenario(path).warmup_s * 1000.0


AUTOSCALED = ROOT / "scenarios/llm_autoscaling.yaml"
QUICK_DAY = [
    "duration_s=120",
    "warmup_s=0",
    "traffic.rate_rps=12",
    "traffic.shape={kind: diurnal, peak_to_mean: 1.8, period_s: 120, peak_at_s: 60}",
    "workers.autoscaler.sync_period_s=5",
    "workers.autoscaler.target=8",
    "workers.autoscaler.scale_down_stabilization_s=10",
    "workers.cold_start={model_load: {kind: lognormal, mean_ms: 8000, cv: 0.3}}",
]


def test_an_llm_fleet_follows_its_traffic_through_cold_starts():
    """HPA on requests in flight per serving replica: it scales up on the ramp and down
    after the peak; a new replica serves only once its cold start is over, and a request
    reaches only a replica serving at that moment (none still starting, none draining)."""
    run = simulate(load_scenario(AUTOSCALED, QUICK_DAY))
    fleet, r = run.fleet, run.records
    kinds = [str(e[1]) for e in fleet.events]
    assert "scale_up" in kinds
    assert "scale_down" in kinds
    assert kinds.index("scale_up") < len(kinds) - 1 - kinds[::-1].index("scale_down")
    new = [w for w in fleet.workers if w.requested_at > 0]
    assert new
    assert all(w.ready_at - w.requested_at > 1000.0 for w in new)
    ready = np.array([w.ready_at for w in fleet.workers])
    drain = np.array([w.drain_at for w in fleet.workers])
    k = r.instance[r.completed]
    routed = r.t_preprocessed[r.completed]
    assert (ready[k] <= routed).all()
    assert (routed < drain[k]).all()
    assert r.completed.all()


def test_an_llm_pool_scales_on_the_p99_of_its_first_tokens():
    """metric ttft_ms: the p99 time to first token (from a request's arrival at its replica)
    of the first tokens the pool's serving replicas made in the last metric_window_s. Each
    decision's event says what it read, and that is the p99 of the records' first tokens in
    its window, on the replicas serving then."""
    sets = [
        "workers.autoscaler.metric=ttft_ms",
        "workers.autoscaler.target=150",
        "workers.autoscaler.metric_window_s=10",
    ]
    run = simulate(load_scenario(AUTOSCALED, [*QUICK_DAY, *sets]))
    r, fleet = run.records, run.fleet
    ready = np.array([w.ready_at for w in fleet.workers])
    drain = np.array([w.drain_at for w in fleet.workers])
    decisions = [(t, d) for t, _, d in fleet.events if "(ttft_ms " in d]
    assert len(decisions) >= 2
    assert any(str(k) == "scale_up" for _, k, _ in fleet.events)
    for t, detail in decisions:
        read = float(detail.split("(ttft_ms ")[1].rstrip(")").replace(",", ""))
        there = (ready[r.instance] <= t) & (drain[r.instance] >= t)  # counted and serving at the decision
        window = (r.t_first_token > t - 10_000.0) & (r.t_first_token <= t) & there
        ttft = (r.t_first_token - r.t_preprocessed)[window]
        assert read == pytest.approx(np.percentile(ttft, 99), abs=0.5), (t, detail)


def test_an_autoscaled_fleets_kv_usage_is_over_the_replicas_there():
    """The timeline's kv_usage is the share of KV blocks in use over the replicas there in
    each interval (serving or draining), not over the fleet it started with (one replica
    here: divided by it, eight replicas' use read as eight times one's)."""
    from simulator.results.reduce import summarize

    run = simulate(load_scenario(AUTOSCALED, QUICK_DAY))
    rows = summarize(run, interval_s=5.0)["timeline"]
    b = run.batches
    checked = 0
    for row in rows:
        present = row["active_workers"] + row["draining_workers"]
        assert row["kv_usage"] <= 1.0
        if present < 1.5:
            continue
        k = (b.start >= row["t_s"] * 1000.0) & (b.start < row["t_s"] * 1000.0 + 5000.0)
        direct = float(np.sum(b.kv_usage[k] * (b.end[k] - b.start[k]))) / (5000.0 * present)
        assert row["kv_usage"] == pytest.approx(direct, rel=1e-9)
        checked += 1
    assert checked > 5


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["workers.autoscaler.metric=p99_ms"], "workers.autoscaler.metric p99_ms"),
        (["workers.failures={mtbf_s: 100}"], "workers.failures"),
        (["workers.autoscaler.min_replicas=0"], "min_replicas 0"),
    ],
)
def test_what_an_llm_fleet_cannot_scale_on_is_refused(sets, words):
    args = [a for x in sets for a in ("--set", x)]
    one_error(cli("run", AUTOSCALED, *args), "batching.kind continuous does not combine with", words)


def test_every_tokens_gap_is_summarized_whole_or_streamed():
    """The summary's inter-token latency over every token made in the window: the same read
    whole (exact) or streamed (a sketch within its 0.5%; the mean exact), its median below
    the median request's worst gap, its mean near the requests' mean TPOT (the same gaps,
    weighted by tokens rather than by requests)."""
    from simulator.results.reduce import summarize
    from simulator.streaming import summarize_stream

    s = load_scenario(CHAT, ["duration_s=20", "warmup_s=5", "workers.count=2", "traffic.rate_rps=20"])
    whole = summarize(simulate(s))["llm"]
    streamed = summarize_stream(s, chunk_s=1.3)["llm"]
    for key in ("p50", "p95", "p99"):
        assert streamed["itl_ms"][key] == pytest.approx(whole["itl_ms"][key], rel=0.01)
    assert streamed["itl_ms"]["mean"] == pytest.approx(whole["itl_ms"]["mean"], rel=1e-9)
    assert whole["itl_ms"]["p50"] < whole["max_itl_ms"]["p50"]
    assert whole["itl_ms"]["mean"] == pytest.approx(whole["tpot_ms"]["mean"], rel=0.25)


def test_a_linear_step_with_a_decode_threshold():
    """``decode_threshold``: decodes beyond it cost ``decode_ms_per_seq_above`` each; the
    scenario's section reaches the replica's step model."""
    from simulator.serving.step_time import LinearStepTime, Work

    step = LinearStepTime(1.0, decode_ms_per_seq=0.4, decode_threshold=4, decode_ms_per_seq_above=0.1)
    assert step.ms(Work(decodes=3)) == pytest.approx(1.0 + 1.2)
    assert step.ms(Work(decodes=10)) == pytest.approx(1.0 + 1.6 + 0.6)
    assert step.decode_series(10, 0, 10, 2) == [step.ms(Work(decodes=10))] * 2
    s = load_scenario(
        ROOT / "scenarios/llm_chat.yaml",
        ["batching.step_time={c0_ms: 2.0, decode_ms_per_seq: 0.3, decode_threshold: 8, decode_ms_per_seq_above: 0.1}"],
    )
    assert s.batching.step_time.decode_threshold == 8


def test_a_batch_queues_autoscaler_cannot_read_first_tokens():
    res = cli("run", ROOT / "scenarios/autoscaling.yaml", "--set", "workers.autoscaler.metric=ttft_ms")
    text = one_error(res, "workers.autoscaler.metric ttft_ms", "batching.kind continuous")
    assert "line " in text

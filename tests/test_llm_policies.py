"""The LLM replica's three policies against theory and published behaviour: exact chunked
steps on a small trace, M/G/1 at one sequence at a time for each policy, the saturated
throughput bound of Li, Dai and Peng, the KV-bound capacity of Nie, Si and Zhou, the
directions (chunked prefill and the TPOT tail, prefix caching and capacity, continuous
against static batching), and BLIS's bug classes (a preemption livelock, a prefix cache
with preemptions inflating throughput, a request that never finishes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from simulator.serving.llm_replica import Replica
from simulator.serving.llm_serve import serve
from simulator.serving.llm_types import Limits
from simulator.serving.step_time import LinearStepTime, RooflineStepTime, StepTime, Work
from tests.test_theory import check

FLAT = LinearStepTime(10.0)
# an 8B model on an H100 (the roofline: FLOPs and bytes on the datasheet's peak and bandwidth)
H100_8B = RooflineStepTime(2 * 8e9, 4 * 32 * 4096, 16e9, 131072, 989e12 * 0.5 / 1e3, 3.35e12 * 0.75 / 1e3, 2.0)


@dataclass(frozen=True)
class Knee:
    """Li, Dai and Peng's step time: ``t(b) = c + a·max(0, b - b0)`` for a step of ``b`` tokens."""

    c: float
    a: float
    b0: int

    def ms(self, w: Work) -> float:
        return self.c + self.a * max(0, w.prefill_tokens + w.decodes - self.b0)


def test_chunked_prefill_steps_exactly():
    """Budget 4 tokens a step, 10 ms a step. Request 0 (6 prompt, 2 output) arrives at 0,
    request 1 (2 prompt, 1 output) at 5 ms. Step 1 (0-10): 4 of 0's prompt. Step 2
    (10-20): 0's last 2 (first token at 20) and, admitted in what is left, 1's whole prompt
    (its one token at 20). Step 3 (20-30): 0's decode, done at 30."""
    got = serve(
        np.array([0.0, 5.0]), np.array([6, 2]), np.array([2, 1]), FLAT, Limits(num_blocks=8, max_num_batched_tokens=4)
    )
    assert got.first_token.tolist() == [20.0, 20.0]
    assert got.done.tolist() == [30.0, 20.0]
    assert got.start.tolist() == [0.0, 10.0]
    assert got.steps == 3
    assert got.log.prefill_tokens.tolist() == [4, 4, 0]
    assert got.log.decodes.tolist() == [0, 0, 1]


def test_a_long_prefill_is_capped_per_step():
    """``long_prefill_token_threshold`` 3: a 7-token prompt takes three steps (3, 3, 1)
    even though the budget would take it whole."""
    lim = Limits(num_blocks=8, max_num_batched_tokens=64, long_prefill_token_threshold=3)
    got = serve(np.array([0.0]), np.array([7]), np.array([1]), FLAT, lim)
    assert got.log.prefill_tokens.tolist() == [3, 3, 1]
    assert got.first_token.tolist() == [30.0]


@pytest.mark.parametrize("policy", ["continuous", "prefill_first", "static"])
def test_one_sequence_at_a_time_is_mg1_for_every_policy(policy):
    """``max_num_seqs: 1`` serves a request whole (a prefill, then a decode per further
    token) before the next, whatever the policy: an M/G/1 queue with Pollaczek-Khinchine's
    mean wait before the prefill."""
    prefill_ms, decode_ms = 20.0, 4.0
    step = StepTime((prefill_ms, 0.0, 0.0), (decode_ms, 0.0, 0.0), (decode_ms, 0.0, 0.0), 95)
    service = prefill_ms + (np.arange(1, 21) - 1) * decode_ms
    es, es2 = service.mean(), (service**2).mean()
    lam = 0.7 / es
    expected = lam * es2 / (2 * (1 - lam * es))
    waits = []
    for seed in range(8):
        rng = np.random.default_rng(7100 + seed)
        n = 8_000
        arrival = np.cumsum(rng.exponential(1 / lam, n))
        out = rng.integers(1, 21, n)
        got = serve(arrival, np.full(n, 32), out, step, Limits(num_blocks=64, max_num_seqs=1), policy)
        waits.append((got.first_token - prefill_ms - arrival)[n // 10 :].mean())
    check(np.array(waits), expected, f"M/G/1 wait before the prefill ({policy})")


def test_static_batches_are_a_take_all_bulk_service_queue():
    """``static`` with fixed lengths is a bulk-service queue: a free replica takes every
    waiting request, up to ``max_num_seqs``, prefills them in one step and decodes them all
    at the batch's width until they finish together, so a batch of ``b`` takes ``S(b) = t(b
    prompts) + (O - 1)·t(b decodes)``. The mean time from arrival to the last token against
    the embedded Markov chain's (``tests/theory.py``), at 69% of the full batches' rate."""
    from tests.theory import take_all_batch_mean_sojourn

    prompt, output, k = 100, 20, 8
    step = LinearStepTime(5.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.5)

    def service(b: int) -> float:
        return step.ms(Work(prefill_tokens=b * prompt, chunks=b)) + (output - 1) * step.ms(Work(decodes=b))

    lam = 0.03  # a ms; full batches serve k / S(k) = 0.0435
    expected = take_all_batch_mean_sojourn(lam, service, k)
    lim = Limits(num_blocks=10_000, max_num_seqs=k, max_num_batched_tokens=k * prompt)
    got = []
    for seed in range(6):
        rng = np.random.default_rng(9100 + seed)
        n = 8_000
        arrival = np.cumsum(rng.exponential(1 / lam, n))
        r = serve(arrival, np.full(n, prompt), np.full(n, output), step, lim, "static")
        got.append((r.done - arrival)[n // 10 :].mean())
    check(np.array(got), expected, "static batches against the take-all bulk-service chain")


def _saturated_rate(policy: str, max_num_seqs: int, step) -> float:
    """Tokens a ms over the steps after which requests still wait, under a sustained
    overload (an arrival every 5 ms, each asking about 700 tokens of work)."""
    rng = np.random.default_rng(0)
    n = 1500
    prompt, output = rng.integers(100, 1000, n), rng.integers(50, 300, n)
    arrival = np.cumsum(rng.exponential(5.0, n))
    lim = Limits(num_blocks=100_000, max_num_batched_tokens=2048, max_num_seqs=max_num_seqs)
    log = serve(arrival, prompt, output, step, lim, policy).log
    busy = log.waiting > 0
    return (log.prefill_tokens + log.decodes)[busy].sum() / (log.end - log.start)[busy].sum()


def test_saturated_throughput_is_the_budget_over_its_step_time():
    """Li, Dai and Peng: with ``t(b) = c + a·max(0, b - b0)`` and a token budget ``b``, a
    chunked, mixed policy kept saturated computes ``b / t(b)`` tokens a ms (within 2%).
    Prefill first saturates lower: whole prompts leave the budget part empty, and once
    ``max_num_seqs`` are running its decode-only steps carry one token a sequence."""
    step = Knee(10.0, 0.02, 256)
    bound = 2048 / step.ms(Work(prefill_tokens=2048))
    assert _saturated_rate("continuous", 4096, step) == pytest.approx(bound, rel=0.02)
    assert _saturated_rate("prefill_first", 4096, step) < _saturated_rate("continuous", 4096, step)
    assert _saturated_rate("prefill_first", 128, step) < 0.9 * _saturated_rate("continuous", 128, step)


def test_the_kv_cache_bounds_capacity():
    """Nie, Si and Zhou: with a fixed step time ``b̄`` and ``M`` tokens of KV, requests of
    ``s`` prompt and ``o`` output tokens hold ``g = s·o + o(o+1)/2`` token-steps each, so
    at most ``μ = M / (b̄·g)`` complete a ms. Below it (0.8 μ) the queue stays short; above
    it (1.2 μ) it grows with the run."""
    s, o, m, bbar = 200, 100, 16_000, 10.0
    g = s * o + o * (o + 1) / 2
    mu = m / (bbar * g)
    lim = Limits(num_blocks=m, block_size=1, max_num_batched_tokens=100_000, max_num_seqs=10_000)
    rng = np.random.default_rng(11)
    n = 3000
    waits = {}
    for load in (0.8, 1.2):
        arrival = np.cumsum(rng.exponential(1 / (load * mu), n))
        got = serve(arrival, np.full(n, s), np.full(n, o), LinearStepTime(bbar), lim)
        wait = got.start - arrival
        waits[load] = (wait[: n // 2].mean(), wait[n // 2 :].mean())
    assert waits[0.8][1] < 5 * bbar * o  # a stable queue: waits of a few answers at most
    assert waits[1.2][1] > 2 * waits[1.2][0] > 0  # an unstable one: the second half waits far longer


def test_chunked_prefill_lowers_the_tpot_tail_at_equal_load():
    """On a roofline step (decodes are memory-bound, so prompt tokens ride along nearly
    free), long prompts prefilled whole stall every running decode for a whole prompt;
    chunked into 512-token pieces they share steps with the decodes, and the p99 TPOT
    falls."""
    step = H100_8B
    rng = np.random.default_rng(5)
    n = 3000
    prompt = np.clip(rng.lognormal(np.log(3000), 0.6, n).astype(int), 64, 8000)
    output = np.clip(rng.lognormal(np.log(200), 0.6, n).astype(int), 2, 1000)
    arrival = np.cumsum(rng.exponential(1000 / 6.0, n))
    tpot = {}
    for policy, budget in (("continuous", 512), ("prefill_first", 8192)):
        got = serve(arrival, prompt, output, step, Limits(num_blocks=30_000, max_num_batched_tokens=budget), policy)
        tpot[policy] = np.percentile((got.done - got.first_token) / (output - 1), 99)
    assert tpot["continuous"] < 0.8 * tpot["prefill_first"]


def test_prefix_caching_raises_capacity_with_the_hit_rate():
    """A backlog whose prompts begin with one of a few shared prefixes: the more of each
    prompt is shared, the more tokens the cache serves and the sooner the backlog is done;
    with caching off, nothing is served from it."""
    step = Knee(5.0, 0.02, 256)
    rng = np.random.default_rng(9)
    n = 300
    own = rng.integers(50, 200, n)
    output = rng.integers(20, 80, n)
    groups = rng.integers(0, 4, n)
    ends, hits = [], []
    for shared in (0, 512, 2048):
        prompt = own + shared
        lim = Limits(num_blocks=50_000, max_num_batched_tokens=2048, max_num_seqs=64, prefix_caching=True)
        got = serve(np.zeros(n), prompt, output, step, lim, groups=groups, shared_tokens=np.full(n, shared))
        ends.append(np.nanmax(got.done) / (prompt.sum() + output.sum()))  # ms per token of work
        hits.append(got.cached_tokens.sum() / prompt.sum())
    assert hits[0] == 0
    assert hits[1] > 0.5
    assert hits[2] > hits[1]
    assert ends[2] < ends[1] < ends[0]
    off = serve(np.zeros(n), own + 2048, output, step, Limits(num_blocks=50_000, max_num_batched_tokens=2048))
    assert off.cached_tokens.sum() == 0


def test_continuous_batching_outserves_static():
    """The same backlog of chat-like requests: continuous batching finishes it well before
    request-level batching, which holds every slot of a batch until its longest answer is
    done (the model's ratio here is about 2x; published ones, 10-24x, also count the
    memory static batching reserves for the longest possible answer, which this static
    policy does not)."""
    step = H100_8B
    rng = np.random.default_rng(3)
    n = 1000
    prompt = np.clip(rng.lognormal(np.log(800), 0.8, n).astype(int), 16, 4000)
    output = np.clip(rng.lognormal(np.log(150), 1.0, n).astype(int), 1, 2000)
    lim = Limits(num_blocks=30_000, max_num_batched_tokens=8192, max_num_seqs=64)
    cont = serve(np.zeros(n), prompt, output, step, lim, "continuous")
    static = serve(np.zeros(n), prompt, output, step, lim, "static")
    assert np.nanmax(static.done) > 1.5 * np.nanmax(cont.done)


@pytest.mark.parametrize("policy", ["continuous", "prefill_first", "static"])
@pytest.mark.parametrize("caching", [False, True])
def test_heavy_preemption_neither_livelocks_nor_inflates_throughput(policy, caching):
    """BLIS's bug classes: long answers on a cache that holds few of them are preempted
    again and again; every request still finishes (none lost, none stuck), each produces
    exactly its output tokens, and a prefix cache that lets a recomputed sequence reuse
    its surviving blocks computes no more tokens than the work needs again."""
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.sort(rng.uniform(0, 2000, n))
    prompt, output = rng.integers(8, 64, n), rng.integers(20, 200, n)
    step = LinearStepTime(3.0, 0.01, 0.0, 0.01, 1e-4)
    lim = Limits(num_blocks=40, block_size=16, max_num_batched_tokens=512, prefix_caching=caching)
    rep = Replica(policy, step, lim)
    for i in range(n):
        rep.push(i, float(arrival[i]), int(prompt[i]), int(output[i]))
    rep.advance()
    f = rep.finished()
    assert sorted(f.rid.tolist()) == list(range(n))
    assert not f.ignored.any()
    assert np.isfinite(f.done).all()
    assert f.preemptions.sum() > 20
    assert (f.first_token[np.argsort(f.rid)] >= arrival).all()
    assert (f.done >= f.first_token).all()
    assert rep.tokens_out == output.sum()  # each token counted once, however often recomputed
    assert rep.tokens_computed >= prompt.sum() + output.sum() - n  # the work, and what recompute adds
    assert not rep.kv.tables  # every block handed back
    rep.kv.check()


def test_a_replica_in_chunks_takes_the_steps_of_one_run():
    """Pushed and advanced to horizons chunk by chunk, a replica steps exactly as it does
    given everything at once."""
    rng = np.random.default_rng(4)
    n = 500
    arrival = np.cumsum(rng.exponential(20.0, n))
    prompt, output = rng.integers(16, 900, n), rng.integers(1, 300, n)
    step = LinearStepTime(4.0, 0.01, 1e-6, 0.05, 1e-4)
    lim = Limits(num_blocks=600, max_num_batched_tokens=512, prefix_caching=True)
    whole = serve(arrival, prompt, output, step, lim)
    rep = Replica("continuous", step, lim)
    firsts = np.full(n, np.nan)
    pushed = 0
    for horizon in np.arange(0.0, arrival[-1] + 700.0, 700.0):
        while pushed < n and arrival[pushed] < horizon:
            rep.push(pushed, float(arrival[pushed]), int(prompt[pushed]), int(output[pushed]))
            pushed += 1
        rep.advance(horizon)
        f = rep.finished()
        firsts[f.rid] = f.first_token
    for i in range(pushed, n):
        rep.push(i, float(arrival[i]), int(prompt[i]), int(output[i]))
    rep.advance()
    f = rep.finished()
    firsts[f.rid] = f.first_token
    assert np.array_equal(firsts, whole.first_token)


@pytest.mark.parametrize("policy", ["continuous", "prefill_first", "static"])
def test_littles_law_holds_on_every_run(policy):
    """Self-consistency (Little's law on the sample path): the sequences the scheduler had
    running, integrated over its steps, equal the sum of the requests' residences (first
    step's start to last token), so mean running = throughput x mean residence."""
    rng = np.random.default_rng(8)
    n = 2000
    arrival = np.cumsum(rng.exponential(40.0, n))
    prompt, output = rng.integers(16, 900, n), rng.integers(1, 300, n)
    step = LinearStepTime(4.0, 0.01, 1e-6, 0.05, 1e-4)
    got = serve(arrival, prompt, output, step, Limits(num_blocks=20_000, max_num_batched_tokens=1024), policy)
    assert got.preemptions.sum() == 0
    log = got.log
    area = (log.running * (log.end - log.start)).sum()
    residence = got.done - got.start
    assert area == pytest.approx(residence.sum(), rel=1e-9)


def _gap_counts(rows) -> dict[tuple[float, float], int]:
    out: dict[tuple[float, float], int] = {}
    for end, ms, n in rows:
        out[end, ms] = out.get((end, ms), 0) + n
    return out


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_the_gaps_between_tokens_add_up_to_every_stream(policy):
    """Every output token after a sequence's first is counted once with its gap after the
    one before: the gaps' count is the tokens after the first tokens, their sum every
    request's time from first token to last (preemptions included), their largest the
    worst request's worst gap; with a fixed step and room for everyone, every gap is one
    step."""
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.cumsum(rng.exponential(40.0, n))
    prompt, output = rng.integers(16, 700, n), rng.integers(1, 300, n)
    lim = Limits(num_blocks=300, max_num_batched_tokens=1024)
    got = serve(arrival, prompt, output, LinearStepTime(4.0, 0.01, 0.0, 0.05, 1e-4), lim, policy)
    assert not got.ignored.any()
    if policy == "continuous":
        assert got.preemptions.sum() > 0
    _, ms, tokens = (np.array(c) for c in zip(*got.gaps, strict=True))
    assert tokens.sum() == (output - 1).sum()
    assert (ms * tokens).sum() == pytest.approx((got.done - got.first_token).sum(), rel=1e-9)
    assert ms.max() == pytest.approx(np.nanmax(got.max_itl), rel=1e-12)
    flat = serve(arrival, prompt, output, FLAT, Limits(num_blocks=100_000, max_num_batched_tokens=100_000), policy)
    assert np.allclose([ms for _, ms, _ in flat.gaps], 10.0, rtol=1e-12)  # differences of summed clocks


@pytest.mark.parametrize("policy", ["continuous", "prefill_first", "static"])
@pytest.mark.parametrize("model", ["linear", "linear_threshold", "roofline", "distserve", "linear_slowed"])
def test_decode_stretches_in_one_go_take_exactly_the_single_steps(policy, model):
    """The closed-form skip of decode-only stretches: with step noise, shared prefixes, a
    cache small enough to preempt, each policy and step model, and the host's speed
    changing under the steps, every request's times and every step equal those of the
    replica stepping one step at a time, to the bit."""
    from simulator.serving.step_time import Noise
    from simulator.stages.speed import SpeedPath

    speed = None
    if model == "linear_slowed":  # the host slows by 1.5-3x in spells of about 0.5 s
        t = np.arange(0.0, 60_000.0, 500.0)
        speed, model = SpeedPath(t, np.random.default_rng(1).choice([1.0, 1.5, 3.0], len(t))), "linear"

    steps = {
        "linear": LinearStepTime(4.0, 0.01, 1e-6, 0.05, 1e-4),
        "linear_threshold": LinearStepTime(4.0, 0.01, 1e-6, 0.05, 1e-4, 6, 0.02),  # decodes past 6 cheaper
        "roofline": H100_8B,
        "distserve": StepTime((22.05, 0.1405, 8.08e-6), (23.48, 5.93e-4, 0.0607), (20.21, 4.91e-4, 0.12), 95),
    }
    rng = np.random.default_rng(12)
    n = 400
    arrival = np.cumsum(rng.exponential(60.0, n))
    prompt, output = rng.integers(16, 700, n), rng.integers(1, 400, n)
    groups = np.where(rng.random(n) < 0.5, rng.integers(0, 3, n), -1)
    lim = Limits(num_blocks=400, max_num_batched_tokens=1024, prefix_caching=True)
    got = {}
    for skip in (False, True):
        noise = Noise(0.1, np.random.default_rng(5))
        got[skip] = serve(
            arrival, prompt, output, steps[model], lim, policy,
            groups=groups, shared_tokens=np.where(groups >= 0, 64, 0), noise=noise, skip=skip, speed=speed,
        )  # fmt: skip
    slow, fast = got[False], got[True]
    assert slow.preemptions.sum() > 0  # the cache is tight enough to preempt
    assert _gap_counts(slow.gaps) == _gap_counts(fast.gaps)  # every token's gap after the one before
    for name in ("first_token", "done", "start", "preemptions", "cached_tokens", "max_itl"):
        assert np.array_equal(getattr(slow, name), getattr(fast, name), equal_nan=True), name
    assert slow.steps == fast.steps
    for name in ("start", "end", "prefill_tokens", "decodes", "seqs", "running", "waiting", "kv_usage"):
        assert np.array_equal(getattr(slow.log, name), getattr(fast.log, name)), name


@pytest.mark.parametrize("policy", ["continuous", "prefill_first", "static"])
@pytest.mark.parametrize("slowed", [False, True])
def test_a_replicas_load_read_without_stepping_is_the_load_after_stepping(policy, slowed):
    """A least-loaded router reads each replica's load at every arrival to the pool
    (``Replica.load_at``): where a decode stretch cut short by the horizon knows that no
    request settles before its first finish or block shortage, the replica is not stepped.
    The load it gives equals the count after stepping to that time, at every read, and the
    replica then takes the same steps to the bit (step noise, a cache tight enough to
    preempt, the host's speed changing under the steps)."""
    from simulator.serving.step_time import Noise
    from simulator.stages.speed import SpeedPath

    speed = None
    if slowed:
        t = np.arange(0.0, 120_000.0, 500.0)
        speed = SpeedPath(t, np.random.default_rng(1).choice([1.0, 1.5, 3.0], len(t)))
    rng = np.random.default_rng(21)
    n = 400
    pool = np.cumsum(rng.exponential(15.0, 4 * n))  # arrivals to a pool of four
    mine = np.sort(rng.choice(len(pool), n, replace=False))  # those sent to this replica
    prompt, output = rng.integers(16, 700, n), rng.integers(1, 400, n)
    lim = Limits(num_blocks=1000, max_num_batched_tokens=1024)
    step = LinearStepTime(4.0, 0.01, 1e-6, 0.05, 1e-4)
    lazy, eager = (Replica(policy, step, lim, Noise(0.1, np.random.default_rng(5)), speed=speed) for _ in range(2))
    skipped = 0
    nxt = 0
    for i, t in enumerate(pool.tolist()):
        steps = (lazy.steps, eager.steps)
        eager.advance(t)
        assert lazy.load_at(t) == len(eager.pending) + len(eager.waiting) + len(eager.running), i
        skipped += lazy.steps == steps[0] and eager.steps > steps[1]  # steps it did not take (yet)
        if nxt < n and mine[nxt] == i:
            for rep in (lazy, eager):
                rep.push(nxt, t, int(prompt[nxt]), int(output[nxt]))
            nxt += 1
    assert skipped >= 25, skipped  # the lazy path was taken (41-438 times in these six cases)
    for rep in (lazy, eager):
        rep.advance()
    a, b = lazy.finished(), eager.finished()
    assert sum(b.preemptions) > 0
    for name in ("rid", "first_token", "done", "start", "preemptions", "max_itl"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert lazy.steps == eager.steps
    la, lb = lazy.step_log(), eager.step_log()
    for name in ("start", "end", "prefill_tokens", "decodes", "seqs", "running", "waiting", "kv_usage"):
        assert np.array_equal(getattr(la, name), getattr(lb, name)), name


def test_each_policy_is_one_scheduler_behind_the_protocol_and_an_unknown_one_is_refused():
    """The replica's seam (Vidur's layout): every policy name gives a scheduler with the
    Protocol's members, a fresh one for each replica (static batching keeps its batch's
    width); a name that is none of them is refused, naming the ones there are."""
    import inspect

    from simulator.serving.replica_scheduler import POLICIES, ReplicaScheduler, replica_scheduler

    lim = Limits(num_blocks=64, block_size=16)
    members = {name for name, _ in inspect.getmembers(ReplicaScheduler) if not name.startswith("_")}
    members |= set(ReplicaScheduler.__annotations__)
    for policy in POLICIES:
        a, b = replica_scheduler(policy, lim), replica_scheduler(policy, lim)
        assert a is not b
        missing = {m for m in members if not hasattr(a, m)}
        assert not missing, f"{policy}: {sorted(missing)}"
        assert Replica(policy, FLAT, lim).scheduler.__class__ is a.__class__
    with pytest.raises(ValueError, match="continuous, prefill_first, static, not 'orca'"):
        Replica("orca", FLAT, lim)

"""Multi-turn sessions (``traffic.tokens.sessions``): each turn carries its conversation so
far, the turns arrive at the requests' rate from the first second (the run starts in the
steady state), a later turn finds its history in the prefix cache of the replica that
served the turn before it, prefix-aware routing keeps a conversation on its replica, the
summary counts the turns that came before their previous answer, and bad input is refused
before the run with the field and its line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator import load_scenario
from simulator.engine import simulate
from simulator.rng import streams
from simulator.stages.tokens import TokenDraws
from tests.test_bad_input import ROOT, cli, one_error

MULTI = ROOT / "scenarios/llm_multiturn.yaml"
SHORT = ["duration_s=40", "warmup_s=10", "workers.count=2", "traffic.rate_rps=12"]


def _turns(overrides: list[str], until_s: float, seed: int = 1):
    s = load_scenario(MULTI, overrides)
    draws = TokenDraws(s, streams(seed))
    t, _ = draws.take(until_s * 1000.0)
    return s, t, draws.draw(len(t))


def test_each_turn_carries_its_conversation_so_far():
    """Per session, in turn order: the turns arrive in order, each turn's history is the
    turns before it (their prompts' new input and their answers), its prompt the system
    prompt, that history and its own input, and none outgrows the context window."""
    s, t, w = _turns(["traffic.tokens.sessions.max_context_tokens=6000"], 600.0)
    assert np.all(np.diff(t) >= 0)
    shared = s.traffic.tokens.prefix.tokens
    assert np.all(w.shared == shared)
    assert np.all(w.group == 0)
    assert np.all(w.prompt + w.output <= 6000)
    order = np.lexsort((w.turn, w.session))
    session, turn, hist = w.session[order], w.turn[order], w.history[order]
    new_input = (w.prompt - w.shared - w.history)[order]
    out, arrival = w.output[order], t[order]
    assert np.all(new_input >= 1)
    same = session[1:] == session[:-1]
    # a session's turns are consecutive from where the run caught it, one more each time
    assert np.all(turn[1:][same] == turn[:-1][same] + 1)
    assert np.all(hist[1:][same] == hist[:-1][same] + new_input[:-1][same] + out[:-1][same])
    assert np.all(arrival[1:][same] >= arrival[:-1][same])
    first = np.append(True, ~same)
    assert np.all(hist[first & (turn == 0)] == 0)
    # sessions under way when the run starts: their first turn seen here is a later one
    assert np.count_nonzero(first & (turn > 0)) > 10


def test_turns_arrive_at_the_requests_rate_from_the_start():
    """Sessions start at rate / E[turns], so turns arrive at ``rate_rps``; in the steady
    state from the first second (sessions under way at time 0 send their later turns), not
    after a ramp. A compound-Poisson count: the variance of the turns in a window is about
    the session rate x window x E[T^2] (a session's turns mostly fall in one window)."""
    rate = 12.0
    s, t, _ = _turns([f"traffic.rate_rps={rate}", "traffic.tokens.sessions.max_context_tokens=null"], 3000.0)
    turns = s.traffic.tokens.sessions.turns
    x = turns.sample(1_000_000, np.random.default_rng(0)).astype(float)
    assert turns.expected() == pytest.approx(x.mean(), rel=0.005)  # the exact mean of the clipped draws
    for lo, hi in ((0.0, 300.0), (0.0, 3000.0), (1500.0, 3000.0)):
        n = np.count_nonzero((t >= lo * 1000) & (t < hi * 1000))
        mean = rate * (hi - lo)
        sd = math.sqrt(rate / turns.expected() * (hi - lo) * (x**2).mean())
        assert abs(n - mean) < 4 * sd, (lo, hi, n, mean, sd)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "traffic.tokens.sessions.turns.max=null"], ["traffic.tokens.sessions", "turns has no max"]),
        (["--set", "traffic.tokens.sessions.turns={fixed: 0}"], ["traffic.tokens.sessions", "at least 1"]),
        (["--set", "traffic.tokens.sessions.max_context_tokens=1000"], ["max_context_tokens", "first turn"]),
        (["--set", "traffic.tokens.sessions.turn_gap={kind: exponential}"], ["turn_gap", "mean_ms"]),
        (["--set", "traffic.tokens.sessions.turns={mean: 4}"], ["traffic.tokens.sessions.turns", "exactly one"]),
        (  # a context window the KV cache cannot hold
            ["--set", "batching.num_blocks=400"],
            ["traffic.tokens.sessions", "max_context_tokens (8192) is more than the KV cache"],
        ),
        (  # no window, and a session that can outgrow the KV cache
            ["--set", "batching.num_blocks=3000", "--set", "traffic.tokens.sessions.max_context_tokens=null"],
            ["traffic.tokens.sessions", "a session of 16 turns", "set a smaller"],
        ),
        (["--set", "traffic.arrivals_file=x.csv", "--set", "traffic.rate_rps=null"], ["arrivals_file"]),
        (["--set", "traffic.tokens.sessions.turn_gap_from=reply"], ["turn_gap_from", "'arrival' or 'answer'"]),
        (  # no think time, and answers that need no step: a client would send again at the same instant
            [
                "--set",
                "traffic.tokens.sessions.turn_gap={kind: deterministic, value_ms: 0}",
                "--set",
                "traffic.tokens.sessions.turn_gap_from=answer",
                "--set",
                "caches={result: {keys: 100}}",
            ],
            ["traffic.tokens.sessions.turn_gap", "caches.result", "think time above 0"],
        ),
    ],
)
def test_bad_sessions_are_refused_before_the_run(args, needles):
    """Sessions that cannot be drawn or cannot fit a replica: one message naming the field
    and its line, exit 2, before the run."""
    text = one_error(cli("run", MULTI, *args), *needles)
    assert "line " in text


def test_a_later_turn_finds_its_history_in_the_cache():
    """One replica with room for every conversation: a turn whose previous turn was done
    before it arrived is served its system prompt and history from the cache, all but the
    block the previous turn's last token left unfull (the last sampled token's KV is never
    computed): at least the whole blocks of history less one token, never more."""
    gap = "traffic.tokens.sessions.turn_gap={kind: lognormal, p50_ms: 6000, p99_ms: 20000}"
    s = load_scenario(MULTI, [*SHORT, "workers.count=1", "traffic.rate_rps=6", "batching.num_blocks=200000", gap])
    r = simulate(s).records
    bs = s.batching.block_size
    order = np.lexsort((r.turn, r.session))
    ses, turn, arrival, done = (x[order] for x in (r.session, r.turn, r.arrival, r.t_inferred))
    cached, prompt, output = (x[order] for x in (r.cached_tokens, r.prompt_tokens, r.output_tokens))
    follows = (ses[1:] == ses[:-1]) & (turn[1:] == turn[:-1] + 1) & (done[:-1] <= arrival[1:])
    assert np.count_nonzero(follows) > 50
    known = (prompt[:-1] + output[:-1])[follows]  # the turn before, prompt and answer: this one's prefix
    got, asked = cached[1:][follows], prompt[1:][follows]
    assert np.all(got >= np.minimum(known - 1, asked - 1) // bs * bs)
    assert np.all(got <= known)


def _same_replica(balancing: str) -> tuple[float, int]:
    s = load_scenario(
        MULTI,
        [
            *SHORT,
            "workers.count=4",
            f"router.balancing={balancing}",
            "traffic.tokens.prefix=null",
            "traffic.tokens.sessions.turn_gap={kind: lognormal, p50_ms: 6000, p99_ms: 20000}",
        ],
    )
    r = simulate(s).records
    order = np.lexsort((r.turn, r.session))
    ses, turn, inst = r.session[order], r.turn[order], r.instance[order]
    follows = (ses[1:] == ses[:-1]) & (turn[1:] == turn[:-1] + 1)
    return float(np.mean(inst[1:][follows] == inst[:-1][follows])), int(np.count_nonzero(follows))


def test_prefix_aware_routing_keeps_a_conversation_on_its_replica():
    """Without a shared system prompt, prefix affinity sends a later turn where its history
    is cached or in flight: to its previous turn's replica, but where the cache has let it
    go; round robin does so one time in four on four replicas (within four standard
    errors of the share)."""
    assert _same_replica("prefix_affinity")[0] > 0.95
    share, n = _same_replica("round_robin")
    assert n > 200
    assert abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)


def test_the_summary_counts_the_turns_that_came_before_their_answer():
    """The summary's early share equals the count from the whole run's records (a turn
    after the window's start whose previous turn's response came after it arrived), read
    piece by piece."""
    from simulator.results.reduce import summarize
    from simulator.streaming import summarize_stream

    s = load_scenario(MULTI, [*SHORT, "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 3000}"])
    run = simulate(s)
    r = run.records
    order = np.lexsort((r.turn, r.session))
    ses, turn, arrival, resp = (x[order] for x in (r.session, r.turn, r.arrival, r.t_response))
    window = (arrival >= s.warmup_s * 1000) & (arrival < s.duration_s * 1000) & r.completed[order]
    follows = np.zeros(len(order), dtype=bool)
    follows[1:] = (ses[1:] == ses[:-1]) & (turn[1:] == turn[:-1] + 1)
    before = np.full(len(order), np.nan)
    before[1:][follows[1:]] = resp[:-1][follows[1:]]
    later = window & (turn > 0)
    with np.errstate(invalid="ignore"):
        early = np.count_nonzero(later & (arrival < before))
    assert early > 20  # gaps of 3 s: answers often take longer
    want = early / np.count_nonzero(later)
    assert summarize(run)["llm"]["sessions"]["early_turns_share"] == pytest.approx(want, abs=1e-12)
    streamed = summarize_stream(s, chunk_s=0.9)
    assert streamed["llm"]["sessions"]["early_turns_share"] == pytest.approx(want, abs=1e-12)


def test_the_scenario_answers_its_question():
    """The shipped scenario's claims, on a shorter run: the prefix cache serves a large
    share of the prompts, prefix-aware routing (scored) more of them than round robin and
    with a lower TTFT tail, and without the cache the replicas fall behind."""
    got = {}
    for name, extra in (
        ("scored", []),
        ("round_robin", ["router.balancing=round_robin"]),
        ("no_cache", ["batching.enable_prefix_caching=false"]),
    ):
        r = simulate(load_scenario(MULTI, ["duration_s=50", "warmup_s=15", *extra])).records
        done = r.completed & (r.arrival >= 15000)
        ttft = r.t_first_token - r.arrival
        got[name] = (r.cached_tokens[done].sum() / r.prompt_tokens[done].sum(), np.nanpercentile(ttft[done], 99))
    assert got["scored"][0] > 0.4
    assert got["scored"][0] > got["round_robin"][0] + 0.1
    assert got["scored"][1] < got["round_robin"][1]
    assert got["no_cache"][1] > 3 * got["scored"][1]


CLOSED = [*SHORT, "traffic.tokens.sessions.turn_gap_from=answer"]


def _by_turn(r):
    """The records' sessions, turns, arrivals and responses, in session then turn order,
    and where a row follows the turn before it in its session."""
    order = np.lexsort((r.turn, r.session))
    ses, turn, arrival, resp = (x[order] for x in (r.session, r.turn, r.arrival, r.t_response))
    follows = np.zeros(len(order), dtype=bool)
    follows[1:] = (ses[1:] == ses[:-1]) & (turn[1:] == turn[:-1] + 1)
    return ses, turn, arrival, resp, follows


def test_a_closed_loops_turn_waits_for_the_answer_then_the_users_think_time():
    """``turn_gap_from: answer``: every later turn is sent its gap after the answer to the
    turn before it reached the user. The gaps are the user's, not the fleet's: on a fleet
    half as large (slower answers) each turn's gap after its answer is the same draw, and
    the later turns come later. Each session's first turn in the run (its first, or for a
    session under way at time 0 the one after its last before 0) comes when an open loop
    sends it, the same draw, on any fleet; the turns after it follow without a hole."""
    think = "traffic.tokens.sessions.turn_gap={kind: lognormal, p50_ms: 3000, p99_ms: 12000}"
    got, firsts = {}, {}
    for mode, count in (("answer", 2), ("answer", 1), ("arrival", 2)):
        over = [*SHORT, think, f"traffic.tokens.sessions.turn_gap_from={mode}", f"workers.count={count}"]
        r = simulate(load_scenario(MULTI, over)).records
        ses, turn, arrival, resp, follows = _by_turn(r)
        assert np.all(r.completed)
        first = np.append(True, ses[1:] != ses[:-1])
        assert np.all(follows == ~first)  # one turn after another, no hole
        firsts[mode, count] = set(zip(ses[first].tolist(), turn[first].tolist(), arrival[first].tolist(), strict=True))
        think_ms = arrival[1:][follows[1:]] - resp[:-1][follows[1:]]
        if mode == "answer":
            assert think_ms.min() > 0
            assert np.count_nonzero(follows) > 100
        later = zip(ses[follows].tolist(), turn[follows].tolist(), strict=True)
        got[mode, count] = dict(zip(later, zip(arrival[follows], think_ms, strict=True), strict=True))
    assert firsts["answer", 2] == firsts["answer", 1] == firsts["arrival", 2]
    assert sum(t > 0 for _, t, _ in firsts["answer", 2]) > 10  # sessions under way at time 0
    fast, slow = got["answer", 2], got["answer", 1]
    both = sorted(set(fast) & set(slow))
    assert len(both) > 100
    assert len(slow) < len(fast)
    a_fast, k_fast = np.array([fast[k] for k in both]).T
    a_slow, k_slow = np.array([slow[k] for k in both]).T
    np.testing.assert_allclose(k_slow, k_fast, rtol=0, atol=1e-6)  # the same think time, ms
    assert np.mean(a_slow > a_fast) > 0.5
    assert np.mean(a_slow - a_fast) > 100


def test_a_closed_loop_is_the_same_run_in_any_chunks():
    """The engine learns the answers chunk by chunk and cuts a chunk where a turn it does not
    know yet could arrive; cut so, any chunk length gives the whole run's records, bit for
    bit (think times of 3 s: chunks cut often)."""
    from simulator.engine import stream
    from simulator.pieces import concat_records

    s = load_scenario(MULTI, [*CLOSED, "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 3000}"])
    whole = simulate(s).records
    for chunk_s in (0.7, 4.3):
        pieces = list(stream(s, chunk_s=chunk_s))
        assert len(pieces) > s.duration_s / chunk_s
        r = concat_records([p.records for p in pieces])
        for name in ("arrival", "session", "turn", "prompt_tokens", "t_first_token", "t_response", "cached_tokens"):
            np.testing.assert_array_equal(getattr(r, name), getattr(whole, name), err_msg=f"{name}, {chunk_s} s")


def test_where_answers_outlast_the_gaps_a_closed_loop_slows_its_turns_and_an_open_one_does_not():
    """One replica, gaps of 4 s on average and answers of seconds: an open loop's turns keep
    coming on time (most before the answer to the turn before them), a closed loop's wait:
    none comes early, fewer turns arrive (577-590 against 823-925 over seeds 1-3), and the
    first token's tail is shorter (72-181 ms against 148-5,273 ms)."""
    from simulator.results.reduce import summarize

    gap = "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 4000}"
    over = [*SHORT, "workers.count=1", "traffic.rate_rps=30", gap]
    got = {}
    for mode in ("arrival", "answer"):
        run = simulate(load_scenario(MULTI, [*over, f"traffic.tokens.sessions.turn_gap_from={mode}"]))
        r = run.records
        ttft = np.nanpercentile((r.t_first_token - r.arrival)[r.arrival >= 10_000], 99)
        got[mode] = (summarize(run)["llm"]["sessions"], np.count_nonzero(r.turn > 0), ttft)
    (ses_open, later_open, ttft_open), (ses_closed, later_closed, ttft_closed) = got["arrival"], got["answer"]
    assert ses_open["early_turns_share"] > 0.3
    assert ses_closed["early_turns_share"] == 0.0
    assert ses_open["turn_gap_from"] == "arrival"
    assert ses_closed["turn_gap_from"] == "answer"
    assert later_closed < 0.8 * later_open
    assert ttft_closed < ttft_open


def test_a_closed_loop_warns_where_the_warm_up_is_shorter_than_a_conversation():
    """Its conversations under way at time 0 are placed as an open loop would place them,
    a little ahead of a closed loop's: where the warm-up is shorter than twice a
    conversation's think times the run command says so, naming warmup_s and the length to
    give it, and runs."""
    args = ("run", MULTI, "--set", "traffic.tokens.sessions.turn_gap_from=answer", "--set", "duration_s=30")
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "warning:" in out.stderr
    assert "warmup_s (20 s)" in out.stderr
    assert "set warmup_s to 208" in out.stderr
    assert "a closed loop" in out.stdout
    quiet = cli(*args, "--set", "duration_s=230", "--set", "warmup_s=210", "--set", "traffic.rate_rps=10")
    assert quiet.returncode == 0
    assert "warning" not in quiet.stderr


def test_the_replicas_floors_are_never_late_and_keep_a_closed_loops_chunks_long():
    """Between chunks each replica says, for the turns it holds, when each can be answered
    at the earliest (the tokens it still owes, a step each, at the least token-making step,
    its noise factors and the host's speed). Every such floor is at or before that turn's
    end on its replica, across policies, a noisy step and a speed path, and most reach well
    past the chunk's end; with them a run with think times near 0 takes a few dozen chunks
    where the chunk's start alone gives over a thousand (1,365 here)."""
    from simulator.engine import _Run

    exp = "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 3000}"
    speed = "platform.speed={kind: log_ar1, step_ms: 100, components: [{sigma: 0.4, correlation_time_s: 1.0}]}"
    cases = {
        "continuous": [],
        "prefill_first": ["batching.policy=prefill_first"],
        "static": ["batching.policy=static"],
        "noisy_slowed": ["batching.noise_cv=0.3", speed],
    }
    for name, extra in cases.items():
        s = load_scenario(MULTI, [*CLOSED, exp, *extra])
        end = s.duration_s * 1000.0
        run, lo, readings, pieces = _Run(s, s.seed), 0.0, [], []
        while True:
            hi = run.reach(lo, min(lo + 40_000.0, end))
            readings.append((lo, run.pool.scheduler.answer_floors()))  # what reach read
            pieces.append(run.chunk(hi, hi >= end).records)
            if hi >= end:
                break
            lo = hi
        ses, turn, arrival, done = (
            np.concatenate([getattr(r, f) for r in pieces]) for f in ("session", "turn", "arrival", "t_inferred")
        )
        checked = ahead = 0
        for at, floors in readings:
            for session, floor in floors.items():
                mine = np.flatnonzero((ses == session) & (arrival < at))  # its turn in flight then: the latest
                k = mine[np.argmax(turn[mine])]
                assert done[k] >= floor, (name, session, at, floor, done[k])
                checked += 1
                ahead += floor > at + 100.0
        assert checked > 100, name
        assert ahead > checked / 2, (name, ahead, checked)
        assert len(pieces) < 150, (name, len(pieces))


USERS = [
    "traffic.rate_rps=null",
    "traffic.tokens.sessions.turn_gap_from=answer",
    "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 5000}",
    "workers.count=1",
]


def _per_user(r, users: int):
    """Each user's sends in time order: user, send (arrival), answer (response), conversation."""
    user, conv = r.session % users, r.session // users
    order = np.lexsort((r.arrival, user))
    return user[order], r.arrival[order], r.t_response[order], conv[order], r.turn[order]


@pytest.mark.parametrize(("users", "duration_s", "warmup_s"), [(50, 260, 60), (400, 400, 150)])
def test_a_population_of_users_keeps_the_response_time_law(users, duration_s, warmup_s):
    """``sessions.users``: a fixed population, each user in one conversation at a time and
    each turn sent a think time after the answer before it (the next conversation's first
    too). Every user is there, never has two requests out, and runs its conversations in
    order, a turn after another; the think times are the scenario's (their mean within four
    standard errors of turn_gap's); and the interactive response time law of a closed system
    holds, N = X (R + Z) (throughput X, mean response R and think Z of the turns sent in the
    window, but its last minute: with no send after the run's end to compete, the last
    answers come faster), to 3%: at 50 users on one replica (answers 2.6 s, thinks 5 s;
    seeds 1-6 off by -0.8 to +1.1%) and at 400 past its knee (answers about 21 s; seeds 1-3
    +0.2 to +1.4%; counted to the run's end, -1.8 to -0.6%)."""
    s = load_scenario(
        MULTI, [*USERS, f"traffic.tokens.sessions.users={users}", f"duration_s={duration_s}", f"warmup_s={warmup_s}"]
    )
    r = simulate(s).records
    assert np.all(r.completed)
    user, send, answer, conv, turn = _per_user(r, users)
    assert len(np.unique(user)) == users
    same = user[1:] == user[:-1]
    think = send[1:][same] - answer[:-1][same]
    assert think.min() > 0  # the next send comes after the answer to the last: one state at a time
    assert np.all(answer > send)
    # within a user: a conversation's turns in order, then the next conversation from its first turn
    step = (conv[1:] - conv[:-1])[same], (turn[1:] - turn[:-1])[same], turn[1:][same]
    assert np.all(((step[0] == 0) & (step[1] == 1)) | ((step[0] == 1) & (step[2] == 0)))
    z = s.traffic.tokens.sessions.turn_gap
    a, b = warmup_s * 1000.0, duration_s * 1000.0
    # thinks begun a minute before the end (e^-12 of them outlast it): the run's end keeps no long one out
    begun = think[answer[:-1][same] < b - 60_000.0]
    assert abs(begun.mean() - z.mean) < 4 * math.sqrt(z.variance / len(begun))
    sent = np.flatnonzero(same) + 1  # the sends after a think
    # not the last minute's: its answers come faster with no send after the end to compete
    win = sent[(send[sent] >= a) & (send[sent] < b - 60_000.0)]
    x = len(win) / (b - 60_000.0 - a)
    law = x * (np.mean(answer[win] - send[win]) + np.mean(send[win] - answer[win - 1]))
    assert law == pytest.approx(users, rel=0.03)


def test_a_population_starts_with_its_users_part_way_through_their_conversations():
    """Each user's conversations are played from a start in a window before 0 up to the one
    under way at 0, so from the first minute the turns are as far into their conversations,
    and their prompts as long, as in the steady state: 1,000 users of llm_multiturn.yaml's
    conversations, the first minute's mean prompt 5.7% under the last ten minutes' (seeds
    1-4, calibrate/experiments/closed_loop_start.py --mode users), where every user starting
    at a first turn put it 54.6% under and took seven minutes to come within 3%."""
    from simulator.planning.llm_napkin import mean_tokens

    s = load_scenario(
        MULTI,
        [
            "traffic.rate_rps=null",
            "traffic.tokens.sessions.users=1000",
            "traffic.tokens.sessions.turn_gap_from=answer",
            "duration_s=60",
            "warmup_s=0",
        ],
    )
    r = simulate(s).records
    steady_prompt, _ = mean_tokens(s)  # the mean over every turn of many conversations
    assert r.prompt_tokens.mean() > 0.88 * steady_prompt
    assert np.mean(r.turn > 0) > 0.5  # most turns of the first minute are not a conversation's first
    assert r.session.max() >= 1000  # some users are past their first conversation at time 0


def test_a_population_is_refused_without_a_closed_loop_or_with_a_rate():
    """A population of users waits for its answers and sets its own rate: one message each,
    naming the field and its line, exit 2, before the run."""
    base = ["--set", "traffic.tokens.sessions.users=100"]
    one_error(cli("run", MULTI, *base, "--set", "traffic.rate_rps=null"), "turn_gap_from: answer", "line ")
    closed = [*base, "--set", "traffic.tokens.sessions.turn_gap_from=answer"]
    one_error(cli("run", MULTI, *closed), "traffic.tokens.sessions.users sets its own rate", "drop traffic.rate_rps")
    shaped = [*closed, "--set", "traffic.rate_rps=null", "--set", "traffic.shape={kind: diurnal, peak_to_mean: 2}"]
    one_error(cli("run", MULTI, *shaped), "drop traffic.rate_rps and shape")
    replay = "traffic.tokens.sessions.turn_gap={kind: empirical, samples_ms: [900, 5000], order: sequential}"
    one_error(cli("run", MULTI, *closed, "--set", "traffic.rate_rps=null", "--set", replay), "order: random")
    one_error(
        cli("run", MULTI, *closed, "--set", "traffic.rate_rps=null", "--set", "traffic.tokens.sessions.users=0"),
        "traffic.tokens.sessions.users",
        "greater than or equal to 1",
    )


def test_a_command_that_varies_the_rate_says_a_population_has_none():
    """``plan --max-rate`` varies traffic.rate_rps: on a population of users (or a shaped
    rate) one message saying where its rate comes from, exit 2 (it was a traceback)."""
    users = ROOT / "scenarios/llm_users.yaml"
    one_error(cli("plan", users, "--max-rate"), "--max-rate varies traffic.rate_rps", "its users")
    shape = "traffic.shape={kind: ramp, from_rps: 10, to_rps: 50, end_s: 100}"
    ramp = ["--set", "traffic.rate_rps=null", "--set", shape]
    one_error(cli("plan", ROOT / "scenarios/llm_chat.yaml", "--max-rate", *ramp), "its shape or arrivals file")


def test_the_napkin_takes_a_populations_rate_from_the_response_time_law():
    """``explain``'s napkin needs a rate: a population's is the interactive response time
    law's, X = N / (Z + R), with R the napkin's own answer (a prefill and E[o] decode steps
    at its batch), and the line says so."""
    from simulator.planning.llm_napkin import llm_napkin

    s = load_scenario(ROOT / "scenarios/llm_users.yaml")
    lines, _ = llm_napkin(s, 6.88)
    rate = lines[0]
    z = s.traffic.tokens.sessions.turn_gap.mean / 1000.0
    r = 2000 / rate.value - z  # the answer the napkin took
    assert 1.0 < r < 10.0
    assert rate.value < s.traffic.tokens.sessions.users_rps()  # answers take time
    assert rate.formula.startswith(f"X = N / (Z + R): 2,000 users / ({z:.1f} s thinking + {r:.2f} s an answer")


CONCURRENCY = """
name: concurrency
seed: 5
duration_s: {duration_s}
warmup_s: 2
sla: {{percentile: 99, target_ms: 30000, ttft_ms: 300, tpot_ms: 50}}
traffic:
  tokens:
    prompt: {prompt}
    output: {output}
    sessions:
      users: {users}
      turns: {{fixed: 1}}
      turn_gap: {{kind: deterministic, value_ms: 0}}
      turn_gap_from: answer
{network}
router: {{balancing: {balancing}}}
batching:
  kind: continuous
  model: llama-3-8b
  max_num_batched_tokens: 2048
  enable_prefix_caching: true
  noise_cv: {noise_cv}
workers: {{count: {count}, instance_type: h100}}
"""
NETWORK = """network:
  client_to_api: {kind: lognormal, p50_ms: 5.0, p99_ms: 20.0}
  api_to_client: {kind: lognormal, p50_ms: 5.0, p99_ms: 20.0}"""


def _concurrency(tmp_path, **given):
    values = {
        "duration_s": 20,
        "prompt": "{mean: 500, p99: 3000, max: 6000}",
        "output": "{mean: 150, p99: 600, max: 1000}",
        "users": 32,
        "network": NETWORK,
        "balancing": "scored",
        "noise_cv": 0.05,
        "count": 2,
    } | given
    path = tmp_path / "concurrency.yaml"
    path.write_text(CONCURRENCY.format(**values))
    return load_scenario(path)


def test_a_think_time_of_zero_holds_a_concurrency_in_any_chunks(tmp_path):
    """A load generator's concurrency (vllm bench serve --max-concurrency, GuideLLM's
    concurrent profile): ``users`` each sending the next request the instant the answer
    before it arrives (``turn_gap`` 0 ms). Every user sends at time 0, then each send is
    exactly its answer before, so at every instant all of them have a request out; and
    the chunks (each ending before a send nobody knows yet: a step's least time after a
    turn reaches the fleet) give the whole run's records bit for bit, with the network's
    delays, noisy steps and two scored replicas."""
    from simulator.engine import stream
    from simulator.pieces import concat_records

    s = _concurrency(tmp_path)
    whole = simulate(s).records
    assert np.all(whole.completed)
    user, send, answer, _, _ = _per_user(whole, 32)
    same = user[1:] == user[:-1]
    assert np.count_nonzero(same) > 300
    np.testing.assert_array_equal(send[1:][same], answer[:-1][same])  # the next send is the answer
    firsts = np.append(True, ~same)
    assert np.all(send[firsts] == 0.0)
    assert np.count_nonzero(firsts) == 32
    assert np.all(answer > send)
    for chunk_s in (0.3, 2.9):
        pieces = list(stream(s, chunk_s=chunk_s))
        r = concat_records([p.records for p in pieces])
        for name in ("arrival", "session", "prompt_tokens", "t_first_token", "t_response", "cached_tokens"):
            np.testing.assert_array_equal(getattr(r, name), getattr(whole, name), err_msg=f"{name}, {chunk_s} s")


def test_a_single_request_at_a_time_takes_the_step_models_time_exactly(tmp_path):
    """One user, no think time, no network, steps without noise: each request runs alone,
    its prompt in one chunk and then a decode step a token, so its time to first token and
    its answer are the step model's sums (to 1e-9), and the next one is sent as it ends."""
    from simulator.serving.step_time import Work, step_model

    prompt, output = 700, 40
    s = _concurrency(
        tmp_path,
        users=1,
        count=1,
        network="",
        noise_cv=0,
        prompt=f"{{fixed: {prompt}}}",
        output=f"{{fixed: {output}}}",
        balancing="round_robin",
    )
    r = simulate(s).records
    step = step_model(s.batching, "h100")
    first = step.ms(Work(prefill_tokens=prompt, attention=prompt * prompt / 2.0, chunks=1))
    answer = first + sum(step.ms(Work(decodes=1, decode_context=prompt + k)) for k in range(1, output))
    assert len(r.arrival) > 50
    np.testing.assert_allclose(r.t_first_token - r.arrival, first, rtol=1e-9)
    np.testing.assert_allclose(r.t_response - r.arrival, answer, rtol=1e-9)
    np.testing.assert_allclose(r.arrival, np.arange(len(r.arrival)) * answer, rtol=1e-9)


@pytest.mark.slow
def test_the_concurrency_scenario_answers_its_question():
    """``llm_concurrency.yaml``'s header, run as written: at 64 in flight one H100 gives
    ~21 req/s within both targets; 128 more throughput, still within; 256 some more, its
    TPOT p99 past 50 ms (every one of max_num_seqs' seats taken, steps at their widest);
    512 no more throughput than 256, and TTFT p99 seconds long (half the clients wait for
    a seat)."""
    from simulator.results.reduce import summarize
    from tests.test_scenarios import documented_commands, overrides

    path = ROOT / "scenarios/llm_concurrency.yaml"
    got = []
    for cmd in documented_commands(path):
        out = summarize(simulate(load_scenario(path, overrides(cmd))))
        llm = out["llm"]
        got.append((out["requests"]["throughput_rps"], llm["ttft_ms"]["p99"], llm["tpot_ms"]["p99"]))
    (x64, ttft64, tpot64), (x128, ttft128, tpot128), (x256, _, tpot256), (x512, ttft512, _) = got
    assert 19 < x64 < 23
    assert ttft64 < 300
    assert tpot64 < 50
    assert x128 > 1.15 * x64
    assert ttft128 < 300
    assert tpot128 < 50
    assert x256 > 1.05 * x128
    assert tpot256 > 50
    assert x512 == pytest.approx(x256, rel=0.03)
    assert ttft512 > 5_000


@pytest.mark.parametrize("users", [16, 128])
def test_the_napkin_of_a_concurrency_stretches_its_decode_steps_by_the_prefills(users):
    """With no think time every replica holds its share of the users, always, and each
    decode step waits for the others' prefills: the napkin's X = N / R, with R's steps at
    that batch stretched by the share of the GPU's time the prefills take (which X sets),
    lands within 5% of the simulated rate (llm_concurrency.yaml, one H100, seeds 41: 16
    users 8.5 against 8.5-8.7 req/s over seeds, 128 users 27.5 against 26.7-26.8; the
    unstretched steps said 32.6 for 64 users, where 20.6-21.1 ran)."""
    from simulator.planning.llm_napkin import llm_napkin
    from simulator.results.reduce import summarize

    s = load_scenario(ROOT / "scenarios/llm_concurrency.yaml", [f"traffic.tokens.sessions.users={users}"])
    lines, _ = llm_napkin(s, 6.88)
    rate = next(ln for ln in lines if ln.quantity == "request rate")
    assert "stretched by the others' prefills" in rate.formula
    assert next(ln.value for ln in lines if ln.quantity == "replicas") == 1
    ran = summarize(simulate(s))["requests"]["throughput_rps"]
    assert rate.value == pytest.approx(ran, rel=0.05)

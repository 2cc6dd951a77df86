"""The interview trainer (``simulator/planning/practice.py``, ``servesim practice``): fresh
numbers from a seed, nothing of the scenarios' comments in the question, every step graded
against the napkin, the simulator's reveal, and the terminal trainer with scripted answers."""

from __future__ import annotations

import math
import re
import subprocess

import pytest

from simulator.planning.napkin import napkin
from simulator.planning.practice import SITUATIONS, ask, check, reveal, stage_key
from simulator.planning.situations import STEPS
from simulator.results.metrics import worker_price
from tests.helpers import ROOT
from tests.servers import servesim_cmd


def _header_sentences(file: str) -> list[str]:
    """The sentences of a scenario file's header comment (what must not leak)."""
    text = (ROOT / "scenarios" / file).read_text()
    head = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
    return [x.strip() for x in re.split(r"[.:;]", head) if len(x.strip()) > 25]


IMAGE = [k for k, v in SITUATIONS.items() if v.kind == "image"]
LLM = [k for k, v in SITUATIONS.items() if v.kind == "llm"]


@pytest.mark.parametrize("name", IMAGE)
def test_a_question_is_drawn_fresh_from_its_seed_and_gives_nothing_away(name):
    a, b, c = ask(name, 11), ask(name, 11), ask(name, 12)
    assert a.text == b.text  # the same seed, the same question: it can be shared
    assert a.text != c.text  # another seed, other numbers: a second try is not memory
    assert not [x for x in _header_sentences(SITUATIONS[name].file) if x in a.text]
    # what the napkin needs is in the question: the rate, the batch time, the price, the SLA
    g = a.givens
    for key in ("rate", "batch_ms", "price", "target"):
        assert g[key] in a.text, key
    lines = {ln.quantity: ln.value for ln in napkin(a.scenario, worker_price(a.scenario))}
    assert a.answers["workers"] == lines["workers"]
    assert a.scenario.workers.count == a.answers["workers_headroom"]


def test_own_numbers_make_the_question():
    q = ask("platform", 3, {"traffic.rate_rps": 100_000, "sla.target_ms": 120, "napkin.headroom": 0.5})
    assert q.answers["peak_rps"] == 100_000
    assert q.answers["workers_headroom"] == math.ceil(q.answers["workers"] * 1.5 - 1e-9)
    assert "50% headroom" in q.text
    assert "100,000 requests/s" in q.text
    assert "120 ms" in q.text
    with pytest.raises(ValueError, match="unknown situation"):
        ask("nowhere")


def test_each_step_is_graded_against_the_napkin_within_its_tolerance():
    q = ask("platform", 42)
    for step in STEPS:
        truth = q.answers[step.key]
        assert check(q, step.key, truth).ok
        assert check(q, step.key, truth * 1.08).ok  # within 10%
        wrong = check(q, step.key, truth * 1.5)
        assert not wrong.ok
        assert wrong.note.startswith("off by +50%: ")
    assert check(q, "workers", q.answers["workers"] + 1).ok  # workers: within one
    assert not check(q, "workers", None).ok
    assert [stage_key(x) for x in ("queueing", "feature fetch", "GPU", "?")] == ["queue", "features", "inference", None]


def test_the_reveal_finds_the_simulated_minimum_and_says_why_it_differs():
    q = ask("platform", 42)
    r = reveal(q, q.answers["workers_headroom"])
    assert r.met
    assert r.minimum_workers is not None
    assert r.minimum_workers < q.answers["workers"]  # batches grow under load: fewer than the napkin
    assert any(w.startswith("Batches grow under load") for w in r.why)
    small = reveal(q, max(1, r.minimum_workers // 2))
    assert not small.met
    assert small.stage == "queue"


def _practice(args: list[str], answers: list[str]) -> subprocess.CompletedProcess:
    """``servesim practice`` with scripted answers, one a line."""
    return subprocess.run(
        [*servesim_cmd(), "practice", *args],
        input="\n".join(answers) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_servesim_practice_reads_scripted_answers_and_prints_the_reveal():
    q = ask("platform", 42)
    answers = [f"{q.answers[s.key]:.6g}" for s in STEPS[:-1]] + ["", "queueing"]  # skip the cost
    proc = _practice(["--seed", "42"], answers)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert q.text.split(".")[0] in text
    assert text.count("✓") == len(STEPS) - 1
    assert "✗ the napkin says" in text  # the skipped step
    assert "fewest workers meeting the SLA" in text
    assert "Why the napkin and the simulation differ" in text
    assert re.search(r"score: \d+ of 9", text)


def test_servesim_practice_refuses_an_unknown_situation():
    proc = subprocess.run(
        [*servesim_cmd(), "practice", "--situation", "nowhere"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "unknown situation 'nowhere'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", LLM)
def test_an_llm_question_is_drawn_fresh_and_its_steps_are_graded(name):
    a, b, c = ask(name, 11), ask(name, 11), ask(name, 12)
    assert a.text == b.text
    assert a.text != c.text
    assert not [x for x in _header_sentences(SITUATIONS[name].file) if x in a.text]
    assert set(a.answers) == {st.key for st in SITUATIONS[name].asked}
    for step in a.steps:
        truth = a.answers[step.key]
        assert truth > 0, step.key
        assert check(a, step.key, truth).ok
        assert not check(a, step.key, truth * 1.5 + 2).ok  # counts are graded within one: +2 is out
        assert "=" in check(a, step.key, truth).note  # the formula with the values put in


def test_kv_memory_napkin_is_the_textbook_arithmetic():
    # Llama-2-7B (32 layers, 32 KV heads of 128), 4k tokens, 80 GB at 90%, 2 GB activations
    q = ask(
        "llm_kv_memory",
        1,
        {
            "traffic.tokens.prompt.fixed": 3584,
            "batching.gpu_memory_utilization": 0.9,
            "batching.activations_gb": 2,
        },
    )
    a = q.answers
    assert a["weights_fp16_gb"] == pytest.approx(13.48)
    assert a["kv_kb_per_token"] == pytest.approx(2 * 32 * 32 * 128 * 2 / 1e3)  # 512 KiB
    assert a["kv_gb_per_seq"] == pytest.approx(4096 * 524_288 / 1e9)  # 2.15 GB
    assert a["kv_fp16_gb"] == pytest.approx(72 - 13.48 - 2)
    assert a["seqs_fp16"] == 26
    assert a["weights_int4_gb"] == pytest.approx(3.37)
    assert a["seqs_int4"] == 31


def test_kv_memory_reveal_fits_more_with_int4_and_admits_past_the_napkin():
    q = ask("llm_kv_memory", 3)
    r = reveal(q)
    fp16, int4 = r.table.iloc[0], r.table.iloc[1]
    assert fp16["run"] == "FP16 weights"
    assert int4["most sequences in a step"] > fp16["most sequences in a step"]
    # admitted on their prompts' blocks, more run at once than fit whole, and are preempted
    assert fp16["most sequences in a step"] >= q.answers["seqs_fp16"]
    assert fp16["preemptions a request"] > 0
    assert any("INT4" in w for w in r.why)


def test_chunked_prefill_cuts_the_worst_gap_near_the_napkins_figures():
    q = ask("llm_chunked_prefill", 5)
    r = reveal(q)
    whole, chunked = r.table.iloc[0], r.table.iloc[1]
    assert chunked["worst gap p99 (ms)"] < whole["worst gap p99 (ms)"] / 4
    assert chunked["TPOT p99 (ms)"] < whole["TPOT p99 (ms)"]
    # the napkin's gaps are the simulated worst gaps' order of magnitude
    assert 0.5 < whole["worst gap p99 (ms)"] / q.answers["gap_whole_ms"] < 3
    assert 0.5 < chunked["worst gap p99 (ms)"] / q.answers["gap_chunked_ms"] < 3


def test_static_batching_misses_the_first_token_where_continuous_meets_it():
    q = ask("llm_static_batching", 2)
    r = reveal(q, q.answers["static_replicas"])
    static, continuous = r.table.iloc[0], r.table.iloc[1]
    assert static["TTFT p99 (ms)"] > 5 * continuous["TTFT p99 (ms)"]
    assert continuous["met"]
    assert not static["met"]


def test_prefix_caching_serves_the_documents_and_shortens_the_first_token():
    q = ask("llm_rag_prefix", 4)
    r = reveal(q)
    off, on = r.table.iloc[0], r.table.iloc[1]
    assert off["prefix cache hit rate"] == 0
    assert on["prefix cache hit rate"] > 0.3
    assert on["TTFT p50 (ms)"] < off["TTFT p50 (ms)"]


def test_servesim_practice_llm_kv_memory_grades_the_steps_then_runs_fp16_beside_int4():
    q = ask("llm_kv_memory", 9)
    steps = SITUATIONS["llm_kv_memory"].asked
    answers = [f"{q.answers[s.key]:.6g}" for s in steps[:-1]] + ["1"]  # the last one wrong
    proc = _practice(["--situation", "llm_kv_memory", "--seed", "9"], answers)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert q.text.split(".")[0] in text
    assert text.count("✓") == len(steps) - 1
    assert "✗ off by" in text
    assert "FP16 weights" in text
    assert "INT4 weights" in text
    assert "most sequences in a step" in text
    assert "Why the napkin and the simulation differ" in text
    assert f"score: {len(steps) - 1} of {len(steps)}" in text
    assert "Where does the tail" not in text  # an LLM question asks no stage


@pytest.mark.slow
def test_servesim_practice_llm_chat_grades_the_steps_then_simulates():
    """The issue's command (about a minute: the fewest replicas are bisected on the chat
    question's two-minute runs)."""
    q = ask("llm_chat", 42)
    steps = SITUATIONS["llm_chat"].asked
    answers = [f"{q.answers[s.key]:.6g}" for s in steps[:-1]] + [""]  # skip the last step
    proc = _practice(["--situation", "llm_chat", "--seed", "42"], answers)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "300 ms" in text  # the first-token budget
    assert text.count("✓") == len(steps) - 1
    assert "fewest replicas meeting the SLA" in text
    assert "TTFT p99 (ms)" in text
    assert "Why the napkin and the simulation differ" in text
    assert re.search(rf"score: {len(steps) - 1} of {len(steps)}", text)


def test_an_answer_that_is_not_a_number_is_asked_again_not_graded_as_a_skip():
    """'abc', '-5' or '1e400' for a step: said to be no estimate and asked again; the next
    answer is graded (a typo was graded as a skip, a negative number as 'off by -122%')."""
    q = ask("platform", 42)
    good = [f"{q.answers[s.key]:.6g}" for s in STEPS[:-1]]
    answers = ["abc", good[0], "-5", good[1], "1e400", *good[2:], "", "queueing"]
    proc = _practice(["--seed", "42"], answers)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.count("is not an estimate") == 3
    assert text.count("✓") == len(STEPS) - 1  # every step graded on its second answer

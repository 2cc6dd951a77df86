"""The interview trainer (``simulator/planning/practice.py``, ``servesim practice``): fresh
numbers from a seed, nothing of the scenarios' comments in the question, every step graded
against the napkin, the simulator's reveal, and the terminal trainer with scripted answers."""

from __future__ import annotations

import math
import re
import subprocess

import pytest

from simulator.planning.napkin import napkin
from simulator.planning.practice import SITUATIONS, STEPS, ask, check, reveal, stage_key
from simulator.results.metrics import worker_price
from tests.helpers import ROOT
from tests.servers import servesim_cmd


def _header_sentences(file: str) -> list[str]:
    """The sentences of a scenario file's header comment (what must not leak)."""
    text = (ROOT / "scenarios" / file).read_text()
    head = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
    return [x.strip() for x in re.split(r"[.:;]", head) if len(x.strip()) > 25]


@pytest.mark.parametrize("name", list(SITUATIONS))
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


def test_servesim_practice_reads_scripted_answers_and_prints_the_reveal():
    q = ask("platform", 42)
    answers = [f"{q.answers[s.key]:.6g}" for s in STEPS[:-1]] + ["", "queueing"]  # skip the cost
    proc = subprocess.run(
        [*servesim_cmd(), "practice", "--seed", "42"],
        input="\n".join(answers) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
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

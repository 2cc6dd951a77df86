"""``servesim practice``: the interview trainer in the terminal.

It prints a question (:func:`simulator.planning.practice.ask`: fresh numbers from a seed),
asks for each napkin step in turn and grades it at once, asks which stage the tail lives
in, then prints the simulator's answer (:func:`simulator.planning.practice.reveal`) and
the score. Answers are read from standard input, one per line, so a script can drive it
(``printf '200000\\n...' | servesim practice --seed 7``); an empty line skips a step.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer
from rich.table import Table as RichTable

from servesim.console import fail, out
from simulator.planning.situations import SITUATIONS
from simulator.results.anatomy import STAGE_WORDS


def _number(text: str) -> float | None:
    """A typed answer as a number: '200k', '1.2M', '$530', '18,000' all read; '' is None."""
    t = text.strip().lower().replace(",", "").replace("$", "").replace("/h", "").replace(" ", "")
    if not t:
        return None
    scale = 1.0
    for suffix, factor in (("k", 1e3), ("m", 1e6), ("g", 1e9)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], factor
            break
    try:
        return float(t) * scale
    except ValueError:
        return float("nan")


def _read(prompt: str) -> str:
    out.print(f"[bold]{prompt}[/]: ", end="")
    line = sys.stdin.readline()
    if not sys.stdin.isatty():
        out.print(line.rstrip("\n"), highlight=False)  # a scripted answer, shown as if typed
    return line.rstrip("\n")


def _estimate(prompt: str, tries: int = 3) -> float | None:
    """A step's estimate: asked again (up to ``tries`` times) when the answer is not a
    number above 0, so a typo is not graded as a skip; an empty line (or the end of the
    input) skips the step."""
    for _ in range(tries):
        text = _read(prompt)
        value = _number(text)
        if value is None or (math.isfinite(value) and value > 0):
            return value
        out.print(
            f"  {text.strip()!r} is not an estimate: a number above 0, like 200k, 1.2M or $530 "
            "(an empty line skips the step)",
            style="yellow",
            highlight=False,
        )
    return None


def practice(
    seed: Annotated[
        int | None, typer.Option(help="The attempt's seed (default: a fresh one); share it to share the question.")
    ] = None,
    situation: Annotated[str, typer.Option(help=f"The system asked about: {', '.join(SITUATIONS)}.")] = "platform",
    workers: Annotated[
        int | None, typer.Option(help="Simulate this fleet in the reveal (default: your headroom answer).")
    ] = None,
) -> None:
    """Practise capacity estimation: a question with fresh numbers, your napkin step by step,
    each step checked, then the simulator's answer and why it differs from the napkin."""
    from simulator.planning.practice import ask, check, reveal, stage_key

    if situation not in SITUATIONS:
        raise fail(f"--situation: unknown situation {situation!r}; choose one of {', '.join(SITUATIONS)}")
    q = ask(situation, seed)
    sit = SITUATIONS[situation]
    out.rule(f"{sit.title} · seed {q.seed}")
    out.print(q.text, highlight=False)
    out.print("\nEstimate each step (numbers like 200k, 1.2M or $530 are fine; an empty line skips it).\n", style="dim")
    marks = []
    for step in sit.asked:
        mark = check(q, step.key, _estimate(f"{step.prompt} ({step.unit})"))
        marks.append(mark)
        out.print(("  [green]✓[/] " if mark.ok else "  [red]✗[/] ") + mark.note, highlight=False)
    if not sit.asks_stage:
        fleet = workers or (_answer(marks, sit.fleet_step) if sit.fleet_step else None)
        fleet = round(fleet or (q.answers[sit.fleet_step] if sit.fleet_step else q.scenario.workers.count))
        with out.status("simulating …"):
            r = reveal(q, fleet)
        _print_llm(r)
        score = sum(m.ok for m in marks)
        out.print(f"\n[bold]score: {score} of {len(marks)}[/] · try again with --seed {q.seed} or a fresh question")
        return
    stages = list(STAGE_WORDS)
    out.print("\nWhere does the tail (p99) spend most of its time? " + ", ".join(stages), highlight=False)
    said = stage_key(_read("stage"))
    yours = workers or round(_answer(marks, "workers_headroom") or q.answers["workers_headroom"])
    with out.status("simulating …"):
        r = reveal(q, yours)
    stage_ok = said == r.stage
    out.print(
        ("  [green]✓[/] " if stage_ok else "  [red]✗[/] ")
        + f"the tail lives in {STAGE_WORDS[r.stage]} ({r.stage_share:.0%} of it at {r.workers} workers)",
        highlight=False,
    )
    out.rule("the simulator")
    table = RichTable(show_header=False, box=None)
    pct = f"p{q.scenario.sla.percentile:g}"
    table.add_row("fewest workers meeting the SLA", f"{r.minimum_workers}" if r.minimum_workers else "none in range")
    table.add_row(
        f"{pct} at your {r.workers} workers",
        f"{r.attained_ms:,.1f} ms against {q.scenario.sla.target_ms:g} ms: " + ("met" if r.met else "missed"),
    )
    table.add_row("where the tail lives", f"{STAGE_WORDS[r.stage]} ({r.stage_share:.0%})")
    out.print(table)
    out.print("\n[bold]Why the napkin and the simulation differ[/]")
    for line in r.why:
        out.print(f"  • {line}", highlight=False)
    score = sum(m.ok for m in marks) + stage_ok
    out.print(f"\n[bold]score: {score} of {len(marks) + 1}[/] · try again with --seed {q.seed} or a fresh question")


def _print_llm(r) -> None:
    """An LLM question's reveal: each run of its contrast, a column; the verdict; why."""
    out.rule("the simulator")
    runs = r.table.drop(columns=["met"]).set_index("run")
    table = RichTable(show_header=True, box=None)
    table.add_column("")
    for name in runs.index:
        table.add_column(str(name), justify="right")
    for metric in runs.columns:
        cells = [f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}" for v in runs[metric]]
        table.add_row(metric, *cells)
    out.print(table)
    if r.minimum_workers is not None:
        out.print(f"fewest replicas meeting the SLA: {r.minimum_workers}", highlight=False)
    out.print(r.headline, highlight=False)
    out.print("\n[bold]Why the napkin and the simulation differ[/]")
    for line in r.why:
        out.print(f"  • {line}", highlight=False)


def _answer(marks, key: str) -> float | None:
    m = next(m for m in marks if m.key == key)
    return m.yours if isinstance(m.yours, float) and m.yours == m.yours and m.yours > 0 else None

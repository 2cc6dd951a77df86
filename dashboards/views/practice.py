"""Practice for system-design interviews: a question with fresh numbers (and nothing of the
answer in it), the napkin estimated step by step and checked, then the simulation and why
it differs; a history of attempts while the app is open; your own numbers if you like.
The trainer itself is :mod:`simulator.planning.practice` (also ``servesim practice``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboards.data import value_at
from simulator.planning.practice import SITUATIONS, STAGE_WORDS, Question, ask, check, reveal
from simulator.scenario.loader import ScenarioError


@st.cache_data(show_spinner=False, max_entries=16)
def _reveal(situation: str, seed: int, overrides: tuple, workers: int):
    return reveal(ask(situation, seed, dict(overrides)), workers)


def _new_seed() -> None:
    st.session_state["practice-seed"] = int(np.random.default_rng().integers(1, 1_000_000))


def _own_numbers(situation: str, q: Question) -> tuple:
    """The situation's drawn numbers, editable: a candidate's or an interviewer's own."""
    with st.expander("ask your own question: type the numbers"):
        values = {}
        cols = st.columns(3)
        for i, knob in enumerate(SITUATIONS[situation].knobs):
            values[knob.path] = cols[i % 3].number_input(
                knob.path.split(".", 1)[1].replace("_", " "),
                value=float(value_at(q.scenario, knob.path)),
                min_value=0.0,
                format="%g",
                key=f"own:{situation}:{knob.path}",
            )
        values["napkin.headroom"] = cols[len(values) % 3].number_input(
            "headroom (0.3 = 30%)",
            value=float(q.scenario.napkin.headroom),
            min_value=0.0,
            format="%g",
            key=f"own:{situation}:napkin.headroom",
        )
        use = st.toggle("use these numbers", key=f"own-use:{situation}")
    return tuple(sorted(values.items())) if use else ()


def _llm_reveal(situation: str, seed: int, own: tuple, marks, r) -> None:
    """An LLM question's answer: its runs side by side, the verdict, why they and the
    napkin differ, and the attempts so far."""
    if r.minimum_workers is not None:
        st.metric("fewest replicas meeting the SLA", r.minimum_workers)
    st.dataframe(r.table.drop(columns=["met"]).set_index("run").T, width="stretch")
    (st.success if r.met else st.error)(r.headline)
    st.markdown("**Why the napkin and the simulation differ**\n\n" + "\n".join(f"- {w}" for w in r.why))
    _history(situation, seed, own, f"{sum(m.ok for m in marks)} of {len(marks)}", r)


def _history(situation: str, seed: int, own: tuple, score: str, r) -> None:
    history = st.session_state.setdefault("practice-history", [])
    entry = {"situation": SITUATIONS[situation].title, "seed": seed, "own numbers": bool(own)}
    entry |= {"score": score, "workers": r.workers, "simulated minimum": r.minimum_workers}
    if not history or history[-1] != entry:
        history.append(entry)
    st.subheader("your attempts")
    st.dataframe(pd.DataFrame(history), hide_index=True, width="stretch")


def render(choice=None, s=None) -> None:
    st.header("Practice: estimate first, then check")
    st.caption(
        "A capacity question as an interviewer asks it. Work the napkin step by step; each step is checked "
        "against the napkin math, then the simulator answers and says why the two differ."
    )
    top = st.columns([2, 1, 1])
    situation = top[0].selectbox(
        "situation",
        list(SITUATIONS),
        format_func=lambda k: SITUATIONS[k].title,
        key="practice-situation",
    )
    if "practice-seed" not in st.session_state:
        asked = st.query_params.get("seed")
        st.session_state["practice-seed"] = int(asked) if asked and asked.isdigit() else 1
    seed = top[1].number_input("seed (share it to share the question)", min_value=1, step=1, key="practice-seed")
    top[2].button("new numbers", on_click=_new_seed, key="practice-new")
    st.query_params["seed"] = str(int(seed))
    q = ask(situation, int(seed))
    own = _own_numbers(situation, q)
    if own:
        try:
            q = ask(situation, int(seed), dict(own))
        except (ScenarioError, ValueError) as e:  # numbers the scenario refuses: said, not thrown
            st.error(f"These numbers do not make a valid question: {e}")
            return
    st.info(q.text)
    attempt = f"{situation}:{int(seed)}:{own}"
    sit = SITUATIONS[situation]
    with st.form(f"steps:{attempt}"):
        st.markdown("**Your napkin**")
        cols = st.columns(4)
        yours = {}
        for i, step in enumerate(sit.asked):
            yours[step.key] = cols[i % 4].number_input(
                f"{step.prompt} ({step.unit})", min_value=0.0, value=None, format="%g", key=f"{attempt}:{step.key}"
            )
        stage = None
        if sit.asks_stage:
            stage = st.selectbox(
                "where the p99 tail spends most of its time", list(STAGE_WORDS), format_func=STAGE_WORDS.get, index=None
            )
        checked = st.form_submit_button("check my steps")
    if checked:
        st.session_state[f"marks:{attempt}"] = ([check(q, k, v) for k, v in yours.items()], stage)
    if f"marks:{attempt}" not in st.session_state:
        return
    marks, stage = st.session_state[f"marks:{attempt}"]
    st.dataframe(
        pd.DataFrame(
            {
                "step": [m.prompt for m in marks],
                "": ["✓" if m.ok else "✗" for m in marks],
                "yours": ["–" if m.yours is None else f"{m.yours:,.4g}" for m in marks],
                "napkin": [f"{m.truth:,.4g}" for m in marks],
                "how": [m.note for m in marks],
            }
        ),
        hide_index=True,
        width="stretch",
    )
    if sit.fleet_step is None:
        workers = q.scenario.workers.count
    else:
        workers = next(m.yours for m in marks if m.key == sit.fleet_step) or q.answers[sit.fleet_step]
    unit = "replica" if sit.kind == "llm" else "worker"
    if not st.button(
        f"reveal the simulation at {int(workers)} {unit}{'s' if workers != 1 else ''}",
        type="primary",
        key=f"reveal:{attempt}",
    ):
        return
    with st.spinner("simulating …"):
        r = _reveal(situation, int(seed), own, int(workers))
    if not sit.asks_stage:
        _llm_reveal(situation, int(seed), own, marks, r)
        return
    stage_ok = stage == r.stage
    score = sum(m.ok for m in marks) + stage_ok
    pct = f"p{q.scenario.sla.percentile:g}"
    c = st.columns(3)
    c[0].metric("fewest workers meeting the SLA", r.minimum_workers if r.minimum_workers else "none in range")
    c[1].metric(
        f"{pct} at your {r.workers} workers", f"{r.attained_ms:,.1f} ms", help=f"SLA ≤ {q.scenario.sla.target_ms:g} ms"
    )
    c[2].metric("where the tail lives", STAGE_WORDS[r.stage], f"{r.stage_share:.0%} of {pct}", delta_color="off")
    (st.success if r.met else st.error)(
        f"At {r.workers} workers the SLA is {'met' if r.met else 'missed'}: {pct} {r.attained_ms:,.1f} ms against "
        f"{q.scenario.sla.target_ms:g} ms. You said the tail lives in "
        f"{STAGE_WORDS.get(stage, 'nowhere')}: {'right' if stage_ok else 'it lives in ' + STAGE_WORDS[r.stage]}."
    )
    st.markdown("**Why the napkin and the simulation differ**\n\n" + "\n".join(f"- {w}" for w in r.why))
    _history(situation, int(seed), own, f"{score} of {len(marks) + 1}", r)

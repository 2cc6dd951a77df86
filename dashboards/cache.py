"""Cached runs for the pages: a rerun with the same scenario text and knobs is free."""

from __future__ import annotations

import streamlit as st

from dashboards import data
from dashboards.data import Choice, Result


@st.cache_data(show_spinner=False, max_entries=32)
def run(source: str, text: str, overrides: tuple[str, ...], extra: tuple[str, ...] = ()) -> Result:
    return data.run(Choice(source, text, overrides).load(extra))


@st.cache_data(show_spinner=False, max_entries=16)
def load_curve(source: str, text: str, overrides: tuple[str, ...], factors: tuple[float, ...]):
    return data.load_curve(Choice(source, text, overrides).load(), list(factors))


@st.cache_data(show_spinner=False, max_entries=16)
def worker_curve(source: str, text: str, overrides: tuple[str, ...], counts: tuple[int, ...]):
    return data.worker_curve(Choice(source, text, overrides).load(), list(counts))


def result(choice: Choice, extra: tuple[str, ...] = ()) -> Result:
    """The run of ``choice`` (plus ``extra`` overrides), with a progress indicator."""
    with st.spinner("simulating …"):
        return run(choice.source, choice.text, choice.overrides, extra)


@st.cache_data(show_spinner=False, max_entries=16)
def llm_load_curve(source: str, text: str, overrides: tuple[str, ...], rates: tuple[float, ...]):
    return data.llm_load_curve(Choice(source, text, overrides).load(), list(rates))


@st.cache_data(show_spinner=False, max_entries=16)
def llm_users_curve(source: str, text: str, overrides: tuple[str, ...], users: tuple[int, ...]):
    return data.llm_users_curve(Choice(source, text, overrides).load(), list(users))


@st.cache_data(show_spinner=False, max_entries=8)
def llm_plan(source: str, text: str, overrides: tuple[str, ...], gpus: tuple, budgets: tuple, lo, hi, reps):
    return data.llm_plan(Choice(source, text, overrides).load(), list(gpus), list(budgets), lo, hi, int(reps))

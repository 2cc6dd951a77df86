"""Calibration: measured against predicted latency per load level, from committed profiles."""

from __future__ import annotations

import json

import streamlit as st

from dashboards import charts
from dashboards.data import PROFILES, Choice, calibration_reports, calibration_table, validation_rows
from simulator.scenario.config import Scenario

MAIN_PROFILE = "cpu-resnet64"


def render(choice: Choice | None = None, s: Scenario | None = None) -> None:
    st.header("Calibration: measured vs predicted")
    reports = calibration_reports()
    if not reports:
        st.info("No calibration reports under calibrate/profiles/ (run `servesim calibrate run --out ...`).")
        return
    names = sorted(reports)
    main = names.index(MAIN_PROFILE) if MAIN_PROFILE in names else 0  # the README's own profile first
    name = st.selectbox("profile", names, index=main, key="profile")
    report = reports[name]
    profile = json.loads((PROFILES / name / "profile.json").read_text())
    hw, model = profile["hardware"], profile["model"]
    st.caption(
        f"{model['kind']} ({model['precision']}) on {hw['cpu']}"
        + (f" + {hw['gpu']['name']}" if hw.get("gpu", {}).get("name") else "")
        + f"; measured {profile['created']}; fitted on loads "
        + ", ".join(f"{x['load']:.0%}" for x in profile.get("fit_levels", []) if "load" in x)
    )
    table = calibration_table(report)
    st.altair_chart(charts.calibration(table), width="content")
    st.dataframe(validation_rows(report), hide_index=True)

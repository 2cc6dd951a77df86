"""servesim's dashboard: `servesim dashboard` (or `streamlit run dashboards/app.py`).

The sidebar picks and edits a scenario for every page; each page is one small module in
``dashboards/views/`` (not ``pages/``: a ``pages/`` folder beside the main script turns on
Streamlit's older directory-based pages, which resets sidebar widgets under st.navigation).
"""

from __future__ import annotations

import streamlit as st

from dashboards.sidebar import sidebar
from dashboards.views import calibration, compare, load_curve, plan, practice, results, timeline


def main() -> None:
    st.set_page_config(page_title="servesim", layout="wide")
    choice, s = sidebar()

    def needs_scenario(render):
        def page():
            if s is None:
                st.warning("Fix the scenario in the sidebar to see this page.")
                return
            render(choice, s)

        return page

    pages = [
        st.Page(needs_scenario(results.render), title="Results", url_path="results", default=True),
        st.Page(needs_scenario(compare.render), title="Compare", url_path="compare"),
        st.Page(needs_scenario(load_curve.render), title="Load curve", url_path="load-curve"),
        st.Page(needs_scenario(timeline.render), title="Timeline", url_path="timeline"),
        st.Page(needs_scenario(plan.render), title="Plan", url_path="plan"),
        st.Page(calibration.render, title="Calibration", url_path="calibration"),
        st.Page(practice.render, title="Practice", url_path="practice"),
    ]
    st.navigation(pages).run()


main()

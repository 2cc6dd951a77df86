"""servesim's dashboard: `servesim dashboard` (or `streamlit run dashboards/app.py`).

The sidebar picks and edits a scenario for every page; each page is one small module in
``dashboards/views/`` (not ``pages/``: a ``pages/`` folder beside the main script turns on
Streamlit's older directory-based pages, which resets sidebar widgets under st.navigation).
"""

from __future__ import annotations

import streamlit as st

from dashboards.sidebar import sidebar
from dashboards.views import calibration, compare, llm, load_curve, plan, practice, results, timeline


def main() -> None:
    st.set_page_config(page_title="servesim", layout="wide")
    choice, s = sidebar()

    def needs_scenario(render, llm_render=None):
        def page():
            if s is None:
                st.warning("Fix the scenario in the sidebar to see this page.")
                return
            if llm_render is not None and s.traffic.tokens is not None:  # an LLM scenario: its own page
                llm_render(choice, s)
                return
            render(choice, s)

        return page

    def llm_curve(choice, s):
        st.header("Load curve")
        llm.load_curve(choice, s)

    views = [
        (needs_scenario(results.render), "Results", "results"),
        (needs_scenario(compare.render), "Compare", "compare"),
        (needs_scenario(load_curve.render, llm_curve), "Load curve", "load-curve"),
        (needs_scenario(timeline.render), "Timeline", "timeline"),
        (needs_scenario(plan.render, llm.plan), "Plan", "plan"),
        (calibration.render, "Calibration", "calibration"),
        (practice.render, "Practice", "practice"),
    ]
    # a shared link names its page in the query (?page=compare&scenario=...): the app's root
    # URL then opens that page, without the 404s Streamlit's front end makes on a page's own
    # path (streamlit/streamlit#7074)
    asked = st.query_params.get("page")
    first = asked if asked in {path for _, _, path in views} else "results"
    pages = [st.Page(fn, title=title, url_path=path, default=path == first) for fn, title, path in views]
    current = st.navigation(pages)
    st.query_params["page"] = next(path for (_, t, path) in views if t == current.title)
    current.run()


main()

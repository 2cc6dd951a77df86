"""The dashboard: every page under Streamlit's AppTest, and the whole app once in a real
headless Chromium (the system's, driven by Playwright)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra (streamlit) is not installed")
import pandas as pd
from streamlit.testing.v1 import AppTest

from reference_server.lifetime import die_with_parent
from simulator.engine import simulate
from simulator.results.anatomy import e2e_cdf, stage_bands
from simulator.results.metrics import window
from simulator.scenario.loader import load_scenario
from tests.helpers import ROOT
from tests.servers import descendants, free_port, servesim_cmd, wait_gone, wait_http

APP = str(ROOT / "dashboards" / "app.py")
TIMEOUT = 180


@pytest.fixture(autouse=True)
def _keep_main_module():
    """AppTest runs each script as ``__main__`` and leaves it in ``sys.modules``; a later
    spawned process (a Dask worker) would re-run that script. Put the real one back."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def page_app(page: str) -> None:
    """One page under the real sidebar (AppTest runs this function as a script)."""
    import importlib

    from dashboards.sidebar import sidebar

    choice, s = sidebar()
    importlib.import_module(f"dashboards.views.{page}").render(choice, s)


def run_page(page: str, scenario: str = "scenarios/inference_platform.yaml") -> AppTest:
    at = AppTest.from_function(page_app, args=(page,), default_timeout=TIMEOUT)
    at.run()
    if scenario != at.selectbox(key="file").value:
        at.selectbox(key="file").set_value(scenario).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_app(page: str, scenario: str) -> AppTest:
    """The whole app opened by a shared link (``?page=…&scenario=…``)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["scenario"] = scenario
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> int:
    return len(at.get("vega_lite_chart"))


def test_the_app_opens_on_results_with_kpis_charts_and_downloads():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert labels == ["p50", "p95", "p99", "within SLA", "dropped", "workers", "load of peak", "cost per hour"]
    assert next(m for m in at.metric if m.label == "workers").value == "130"  # the fleet, not the sample
    assert next(m for m in at.metric if m.label == "dropped").value == "0"
    verdict = at.success[0].value  # coloured, with its margin
    assert verdict.startswith("**SLA p99 ≤ 150 ms: met with ")
    assert "ms to spare**" in verdict
    assert any(m.value.startswith("**Where latency lives:** ") for m in at.markdown)
    assert charts(at) == 3  # waterfall, CDF, batch sizes
    assert len(at.get("download_button")) == 3


def test_a_knob_changes_the_kpis_and_a_bad_edit_shows_the_cli_message():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    p99 = next(m for m in at.metric if m.label == "p99").value
    workers = next(n for n in at.number_input if n.label == "workers")
    workers.set_value(78).run()
    assert not at.exception
    assert next(m for m in at.metric if m.label == "p99").value != p99
    assert any("--set workers.count=78" in c.value for c in at.code)
    next(n for n in at.number_input if n.label == "max batch").set_value(8).run()
    errors = [e.value for e in at.error]
    text = (ROOT / "scenarios/inference_platform.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.startswith("  batch_size: 16"))  # napkin.batch_size
    message = f"line {line}: napkin.batch_size: Value error, napkin.batch_size (16) exceeds batching.max_batch_size (8)"
    assert any(message in e for e in errors), errors
    assert any("Fix the scenario" in w.value for w in at.warning)


def test_compare_page_shows_both_variants_and_their_deltas():
    at = run_page("compare", "scenarios/recsys_feature_fetch.yaml")
    # B defaults to the first variant the scenario's header documents
    assert at.text_area[0].value == "workers.service_time.base_ms=9\nworkers.service_time.per_item_ms=1"
    at.selectbox(key="variant-pick:recsys_feature_fetch").set_value("features.batch_size=100").run()
    assert at.text_area[0].value == "features.batch_size=100"
    assert len(at.metric) == 16
    assert charts(at) == 2  # the CDFs overlaid, the waterfalls on one shared axis
    table = at.dataframe[0].value
    assert "e+" not in table.to_string()  # numbers as people read them
    workers = table[table["KPI"] == "workers"].iloc[0]
    assert workers["change"] == ""  # no change: nothing shown, nothing coloured
    assert len(at.dataframe) == 1
    at.text_area[0].set_value("workers.count=0").run()
    assert any("workers.count" in e.value for e in at.error)


def test_load_curve_page_draws_both_hockey_sticks():
    at = run_page("load_curve")
    assert charts(at) == 2
    assert any("Napkin: 130 workers" in c.value for c in at.caption)


def test_timeline_page_draws_rate_workers_queue_and_latency_with_events():
    at = run_page("timeline", "scenarios/autoscaling.yaml")
    assert charts(at) == 4
    assert any(h.value == "events" for h in at.subheader)


def test_plan_page_bisects_and_offers_the_chosen_scenario():
    at = run_page("plan", "scenarios/validation/mmc.yaml")
    at.text_input(key="plan-values:batching.max_queue_delay_ms").set_value("0,1")
    at.button(key="plan-run").click().run()
    assert not at.exception
    assert charts(at) == 1  # the cost / latency frontier
    answer = at.success[0].value
    assert answer.startswith("cheapest, tied within 0.5%: ")  # with batching off the window changes nothing
    assert "than now" in answer or "the same cost as now" in answer
    assert len(at.get("download_button")) == 1


def test_calibration_page_shows_measured_against_predicted():
    at = run_page("calibration")
    assert charts(at) == 1
    assert at.selectbox(key="profile").value == "cpu-resnet64"
    assert len(at.dataframe) == 1
    at.selectbox(key="profile").set_value("cpu-ranker-mget").run()  # the ranker through Redis
    assert not at.exception
    assert charts(at) == 1
    assert "ranker" in at.caption[0].value


def test_practice_page_checks_each_step_then_reveals_the_simulation():
    at = run_page("practice")
    at.selectbox(key="practice-situation").set_value("cv_degradation").run()
    at.number_input(key="practice-seed").set_value(7).run()
    question = at.info[0].value
    assert "requests a minute" in question
    header = (ROOT / "scenarios/cv_degradation.yaml").read_text().split("\nname:")[0]
    sentences = [
        x.strip("# ").strip() for x in header.replace("\n#", " ").split(".") if len(x.strip("# ").strip()) > 20
    ]
    assert not [x for x in sentences if x in question]  # nothing of the scenario's comments
    from simulator.planning.practice import ask

    q = ask("cv_degradation", 7)
    assert q.text == question  # the seed gives the same question
    right = {"peak_rps": q.answers["peak_rps"], "workers": q.answers["workers"], "workers_headroom": 5}
    for key, value in right.items():
        next(n for n in at.number_input if n.key.endswith(f":{key}")).set_value(value)
    next(b for b in at.button if b.label == "check my steps").click().run()  # grade the steps
    assert not at.exception
    steps = at.dataframe[0].value
    assert list(steps[""][:1]) == ["✓"]  # peak rate right
    assert (steps[""] == "✗").sum() >= 5  # the steps left empty
    at.button(key="reveal:cv_degradation:7:()").click().run()
    assert not at.exception
    assert next(m.label for m in at.metric) == "fewest workers meeting the SLA"
    assert any(m.value.startswith("**Why the napkin and the simulation differ**") for m in at.markdown)
    assert len(at.dataframe) == 2  # the steps, and the history of attempts
    assert at.dataframe[1].value["seed"].tolist() == [7]


def test_practice_page_asks_an_llm_question_and_shows_its_runs_side_by_side():
    at = run_page("practice")
    at.selectbox(key="practice-situation").set_value("llm_kv_memory").run()
    at.number_input(key="practice-seed").set_value(3).run()
    from simulator.planning.practice import ask

    q = ask("llm_kv_memory", 3)
    assert at.info[0].value == q.text
    assert not [s for s in at.selectbox if s.label.startswith("where the p99 tail")]  # no stage question here
    next(n for n in at.number_input if n.key.endswith(":seqs_fp16")).set_value(q.answers["seqs_fp16"])
    next(b for b in at.button if b.label == "check my steps").click().run()
    assert not at.exception
    steps = at.dataframe[0].value
    assert (steps[""] == "✓").sum() == 1
    at.button(key="reveal:llm_kv_memory:3:()").click().run()
    assert not at.exception
    runs = at.dataframe[1].value
    assert list(runs.columns) == ["FP16 weights", "INT4 weights"]
    assert any(m.value.startswith("**Why the napkin and the simulation differ**") for m in at.markdown)
    assert at.dataframe[2].value["score"].tolist() == ["1 of 7"]
    # your own numbers, refused by the scenario: said, with the field, not thrown
    at.number_input(key="own:llm_kv_memory:batching.gpu_memory_utilization").set_value(0.0)
    at.toggle(key="own-use:llm_kv_memory").set_value(True).run()
    assert not at.exception
    assert any("gpu_memory_utilization" in e.value for e in at.error)


def test_stage_bands_add_up_to_the_percentile():
    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["workers.count=13", "traffic.rate_rps=20000"])
    run = simulate(s)
    mask = window(run.records, s)
    bands = stage_bands(run.records, mask)
    for q, g in bands.groupby("percentile"):
        # the band holds requests within ±0.5 percentile points of q: their mean total is the percentile
        assert g["ms"].sum() == pytest.approx(g["e2e_ms"].iloc[0], rel=0.02), q
        assert np.allclose(g["end_ms"].to_numpy()[:-1], g["start_ms"].to_numpy()[1:])
    cdf = e2e_cdf(run.records, mask)
    assert np.all(np.diff(cdf["latency_ms"]) >= 0)
    assert cdf["probability"].iloc[-1] == pytest.approx(0.9999)


def start_dashboard(port: int) -> subprocess.Popen:
    """``servesim dashboard`` in a process group of its own, which the caller kills whole;
    killed with the test's process should that die first (a killed pytest runs no finally)."""
    return subprocess.Popen(
        [*servesim_cmd(), "dashboard", "--port", str(port), "--headless"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


PAGES = ("results", "compare", "load-curve", "timeline", "plan", "calibration", "practice")


def _settle(page, timeout_s: float = TIMEOUT) -> None:
    """Wait until the app has drawn and stopped running (Streamlit's status widget gone)."""
    page.wait_for_selector('[data-testid="stMain"]', timeout=timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline and quiet < 4:
        running = page.locator('[data-testid="stStatusWidget"]').count()
        quiet = quiet + 1 if not running else 0
        page.wait_for_timeout(250)


def _metrics(page) -> dict[str, str]:
    labels = page.get_by_test_id("stMetricLabel").all_inner_texts()
    values = page.get_by_test_id("stMetricValue").all_inner_texts()
    return dict(zip(labels, values, strict=True))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (CI installs it)")
def test_the_dashboard_in_a_real_browser(tmp_path):
    """At 1400 px, as a capacity planner and a candidate use it: the KPI row whole, the
    autoscaling scenario's rejected requests, the ranker's own verdict in noisy_neighbour,
    an edited upload of the same name, a practice question with nothing of the answer; a
    page's URL opened directly; a screenshot of every page (``SERVESIM_ARTIFACTS`` keeps
    them)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    shots = Path(os.environ.get("SERVESIM_ARTIFACTS", tmp_path)) / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_dashboard(port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/_stcore/health", proc=proc)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("response", lambda r: console.append(f"{r.status} {r.url}") if r.status == 404 else None)

            # the KPI row is whole at 1400 px: no ellipsis, nothing overflowing its box
            page.goto(url + "/?scenario=scenarios/inference_platform.yaml")
            _settle(page)
            kpis = _metrics(page)
            assert list(kpis) == [
                "p50",
                "p95",
                "p99",
                "within SLA",
                "dropped",
                "workers",
                "load of peak",
                "cost per hour",
            ]
            assert not [t for t in [*kpis, *kpis.values()] if "…" in t]
            cut = page.evaluate(
                """() => [...document.querySelectorAll(
                       '[data-testid="stMetricValue"] *, [data-testid="stMetricLabel"] *')]
                   .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""
            )
            assert cut == [], f"KPI text cut off: {cut}"
            verdict = page.get_by_test_id("stAlertContentSuccess").first.inner_text()
            assert "met with" in verdict
            assert "to spare" in verdict
            page.screenshot(path=str(shots / "results.png"), full_page=True)

            # an edited file of the same name, uploaded, changes the KPIs (its knobs start from its
            # own values); edited again and uploaded again, again
            original = (ROOT / "scenarios/inference_platform.yaml").read_text()
            picker = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
            for workers in (90, 80):
                before = _metrics(page)
                if workers == 80:  # the first upload out, then the new one in
                    page.get_by_role("button", name="Remove inference_platform.yaml").click()
                    _settle(page)
                    before = _metrics(page)
                # the same name from another folder: the browser sends a file it has not seen
                upload = tmp_path / f"edit{workers}" / "inference_platform.yaml"
                upload.parent.mkdir()
                upload.write_text(original.replace("count: 130", f"count: {workers}"))
                picker.set_input_files(str(upload))
                deadline = time.monotonic() + TIMEOUT
                while _metrics(page).get("workers") != str(workers) and time.monotonic() < deadline:
                    page.wait_for_timeout(250)
                _settle(page)
                after = _metrics(page)
                assert after["workers"] == str(workers)
                assert after["p99"] != before["p99"]

            # the autoscaling scenario shows what it rejected
            page.goto(url + "/?scenario=scenarios/autoscaling.yaml")
            _settle(page)
            dropped = _metrics(page)["dropped"]
            assert dropped != "0"
            assert "%" in dropped
            assert "rejected" in page.get_by_test_id("stAlertContentError").first.inner_text()

            # noisy_neighbour: the ranker's own p99 and verdict
            page.goto(url + "/?scenario=scenarios/noisy_neighbour.yaml")
            _settle(page)
            table = page.get_by_test_id("stDataFrame").first
            table.wait_for()
            page.screenshot(path=str(shots / "results-classes.png"), full_page=True)
            assert "per traffic class" in page.get_by_test_id("stMain").inner_text()
            cells = page.evaluate(
                """() => [...document.querySelectorAll('[data-testid="stDataFrame"] canvas')].length"""
            )
            assert cells >= 1  # the class table is drawn (its cells are a canvas: checked by AppTest)

            # every page, opened by a shared link, drawn and photographed
            for name in PAGES[1:]:
                page.goto(f"{url}/?page={name}&scenario=scenarios/inference_platform.yaml")
                _settle(page)
                assert not page.get_by_test_id("stException").count(), name
                assert page.evaluate("() => new URLSearchParams(location.search).get('page')") == name
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

            # the practice question gives nothing of the scenario's header away
            page.goto(f"{url}/?page=practice&seed=7")
            _settle(page)
            question = page.get_by_test_id("stAlertContentInfo").first.inner_text()
            head = " ".join(x.lstrip("#").strip() for x in original.splitlines() if x.startswith("#"))
            sentences = [x.strip() for x in head.split(".") if len(x.strip()) > 25]
            assert sentences
            assert not [x for x in sentences if x in question]
            assert "requests/s" in question

            # an LLM engine: TTFT and TPOT against their targets, tokens and their cost, the KV
            # cache over time; its load curve with the knee; continuous beside static batching
            page.goto(f"{url}/?page=results&scenario=scenarios/llm_chat.yaml")
            _settle(page)
            verdicts = page.get_by_test_id("stAlertContentSuccess").all_inner_texts()
            assert any(v.startswith("TTFT p99 ≤ 300 ms: met") and "margin" in v for v in verdicts), verdicts
            assert any(v.startswith("TPOT p99 ≤ 50 ms: met") for v in verdicts), verdicts
            kpis = _metrics(page)
            assert {"TTFT p99", "TPOT p99", "output tokens/s", "$ per M tokens", "prefix cache hit rate"} <= set(kpis)
            assert not [t for t in [*kpis, *kpis.values()] if "…" in t]
            page.screenshot(path=str(shots / "llm-results.png"), full_page=True)
            page.goto(f"{url}/?page=load-curve&scenario=scenarios/llm_chat.yaml")
            _settle(page)
            assert "Knee:" in page.get_by_test_id("stMain").inner_text()
            page.screenshot(path=str(shots / "llm-load-curve.png"), full_page=True)
            page.goto(f"{url}/?page=compare&scenario=scenarios/llm_chat.yaml")
            _settle(page)
            assert "B: batching.policy=static" in page.get_by_test_id("stMain").inner_text()
            page.screenshot(path=str(shots / "llm-compare.png"), full_page=True)
            assert not page.get_by_test_id("stException").count()
            browser.close()
        assert not [m for m in console if m.startswith("404 ")], console
        for name in ("results", "results-classes", *PAGES[1:], "llm-results", "llm-load-curve", "llm-compare"):
            assert (shots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        assert wait_gone([proc.pid, *descendants(proc.pid)]) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_servesim_dashboard_frees_its_port_and_the_environment_is_honoured(sig):
    """Started with Streamlit's own environment settings only (port, headless), the
    dashboard serves there; SIGTERM or Ctrl-C to the command stops it and frees the port."""
    pytest.importorskip("streamlit", reason="the dashboard needs streamlit")
    port = free_port()
    env = {**os.environ, "STREAMLIT_SERVER_PORT": str(port), "STREAMLIT_SERVER_HEADLESS": "true"}
    proc = subprocess.Popen(
        [*servesim_cmd(), "dashboard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
        preexec_fn=die_with_parent,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc=proc)
        proc.send_signal(sig)  # to the command itself, not its group
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"port {port} still served 10 s after {sig.name}")
        assert wait_gone([proc.pid, *descendants(proc.pid)]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_dashboard_flags_leave_the_environment_to_streamlit():
    from servesim.cli import dashboard_flags

    assert dashboard_flags({}, None, None) == ["--server.port", "8501", "--server.address", "127.0.0.1"]
    env = {"STREAMLIT_SERVER_PORT": "9000", "STREAMLIT_SERVER_ADDRESS": "0.0.0.0"}
    assert dashboard_flags(env, None, None) == []
    assert dashboard_flags(env, 8600, True) == ["--server.port", "8600", "--server.headless", "true"]


def test_the_url_carries_the_scenario():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["scenario"] = "scenarios/recsys_under_load.yaml"
    at.run()
    assert not at.exception
    assert at.selectbox(key="file").value == "scenarios/recsys_under_load.yaml"
    at.selectbox(key="file").set_value("scenarios/cv_degradation.yaml").run()
    assert at.query_params["scenario"] == "scenarios/cv_degradation.yaml"


def test_the_load_curve_reaches_past_the_knee():
    """Load factors go past the fleet's peak capacity (every worker at its largest batch)."""
    from dashboards.views.load_curve import load_factors
    from simulator.planning.napkin import per_worker_rps

    s = load_scenario(ROOT / "scenarios/inference_platform.yaml")
    peak = s.workers.count * per_worker_rps(s, s.batching.max_batch_size) / s.traffic.rate_rps
    factors = load_factors(s)
    assert 1.0 in factors
    assert max(factors) > peak > 1.5  # 130 workers peak at ~1.7x the 200k req/s


def test_the_timeline_ends_where_the_run_ends_and_plots_drops():
    import pandas as pd

    from dashboards.views.timeline import intervals
    from simulator.results.reduce import summarize

    s = load_scenario(ROOT / "scenarios/autoscaling.yaml", ["duration_s=30.5", "warmup_s=5"])
    t = pd.DataFrame(summarize(simulate(s))["timeline"])
    shown = intervals(t, s)
    assert shown["t_s"].max() < s.duration_s
    last, before = shown["offered_rps"].iloc[-1], shown["offered_rps"].iloc[-5:-1].mean()
    assert 0.6 * before < last < 1.4 * before  # the half interval at the end is not a drop to half
    assert {"rejected_rps", "timed_out_rps"} <= set(shown.columns)


def test_plan_ties_the_napkin_and_nothing_meeting_the_sla():
    import pandas as pd

    from dashboards.data import Choice
    from dashboards.views.plan import answer, knob_overrides

    best = pd.DataFrame(
        {"config": ["a", "b", "c"], "met": [True, True, False], "cost_per_hour_usd": [100.0, 100.2, 50.0]}
    )
    assert list(answer(best)["config"]) == ["a", "b"]  # within 0.5%: a tie, both shown
    assert answer(best.assign(met=False)).empty
    # a max batch below the napkin's batch (16) takes the napkin's down with it
    path = ROOT / "scenarios/inference_platform.yaml"
    s = load_scenario(path)
    over = knob_overrides(s, "batching.max_batch_size", "8")
    assert over == ("batching.max_batch_size=8", "napkin.batch_size=8")
    assert Choice(str(path), path.read_text()).load(over).batching.max_batch_size == 8
    # the chosen scenario's file names an instance type too (its batch times rescale on load)
    from dashboards.views.plan import as_set

    assert as_set(s, "workers.instance_type", "h100") == ("workers.instance_type=h100",)


def test_plan_page_says_why_nothing_meets_the_sla():
    at = run_page("plan", "scenarios/validation/mmc.yaml")
    at.text_input(key="plan-values:batching.max_queue_delay_ms").set_value("0")
    at.slider(key="plan-range").set_value((1, 3))  # M/M/8 at rho 0.8 needs 8 or more
    at.button(key="plan-run").click().run()
    assert not at.exception
    text = at.error[0].value
    assert text.startswith("**Nothing meets the SLA in this range** (workers 1–3). The closest: ")
    assert "It is at the top of the range" in text
    assert any(i.value.startswith("**Now:** ") for i in at.info)


def test_an_edited_upload_of_the_same_name_resets_the_knobs_and_keeps_its_profile():
    """The knobs' keys carry the file's content, and an upload named like a shipped scenario
    resolves its relative profile path beside that scenario."""
    import hashlib

    from dashboards.data import Choice
    from dashboards.sidebar import upload_source

    text = (ROOT / "scenarios/calibrated_cpu_resnet.yaml").read_text()
    choice = Choice(upload_source("calibrated_cpu_resnet.yaml"), text)
    assert choice.load().workers.count == 6  # its profile (../calibrate/profiles/...) found
    edited = text.replace("count: 6", "count: 9")
    assert edited != text
    assert Choice(upload_source("calibrated_cpu_resnet.yaml"), edited).load().workers.count == 9
    keys = {hashlib.sha1(t.encode()).hexdigest()[:10] for t in (text, edited)}
    assert len(keys) == 2  # different widget keys: the new file's values, not the old knobs


def test_compare_shows_each_traffic_class_for_both_variants():
    at = run_page("compare", "scenarios/noisy_neighbour.yaml")
    assert at.text_area[0].value == "traffic.classes.tagger.max_instances=5"  # the header's first fix
    assert [h.value for h in at.subheader].count("per traffic class") == 2
    a, b = (df.value for df in at.dataframe[:2])
    assert list(a["class"]) == ["ranker", "tagger"]
    assert list(b["class"]) == ["ranker", "tagger"]


def test_practice_takes_your_own_numbers():
    at = run_page("practice")
    before = at.info[0].value
    at.number_input(key="own:platform:traffic.rate_rps").set_value(123_000.0)
    at.toggle(key="own-use:platform").set_value(True).run()
    assert not at.exception
    after = at.info[0].value
    assert after != before
    assert "123,000 requests/s" in after


@pytest.mark.parametrize("page", ["results", "timeline", "compare"])
def test_an_llm_scenario_opens_on_the_pages_that_draw_it(page):
    at = run_page(page, "scenarios/llm_chat.yaml")
    assert charts(at) >= 1


@pytest.mark.parametrize(
    "scenario",
    [
        "scenarios/llm_multiturn.yaml",
        "scenarios/llm_disaggregated.yaml",
        "scenarios/llm_users.yaml",
        "scenarios/llm_concurrency.yaml",
    ],
)
def test_multi_turn_and_split_fleets_open_on_results(scenario):
    at = run_page("results", scenario)
    assert charts(at) >= 1
    assert not any("nan%" in c.value for c in at.caption)


def test_an_llm_scenario_has_an_engines_knobs_and_users_who_wait_for_their_answers():
    """An LLM scenario's sidebar offers the engine's knobs, not the dynamic batcher's; with
    conversations, a toggle closes the loop (each turn waits for the answer before it), and
    the page says which loop ran and how many turns came before their answers."""
    at = run_page("results", "scenarios/llm_multiturn.yaml")
    labels = {n.label for n in at.number_input}
    assert {"tokens a step (max_num_batched_tokens)", "sequences at once (max_num_seqs)"} <= labels
    assert not {"batching window (ms)", "max batch"} & labels
    caption = next(c.value for c in at.caption if c.value.startswith("conversations:"))
    assert "an open loop" in caption
    assert "0.0% of those" not in caption  # turns 30 s apart: some came before their answer
    next(t for t in at.toggle if t.label == "users wait for each answer").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("--set traffic.tokens.sessions.turn_gap_from=answer" in c.value for c in at.code)
    caption = next(c.value for c in at.caption if c.value.startswith("conversations:"))
    assert "0.0% of those" in caption
    assert "a closed loop" in caption
    next(t for t in at.toggle if t.label == "prefix cache").set_value(False).run()
    assert any("--set batching.enable_prefix_caching=False" in c.value for c in at.code)
    assert next(m for m in at.metric if m.label == "prefix cache hit rate").value == "0.0%"


@pytest.mark.slow
def test_a_split_fleet_under_its_pools_autoscalers_has_each_pools_bounds():
    """Prefill and decode apart, each under its own autoscaler: the sidebar offers each
    pool's bounds (not a worker count), and a bound edited is the CLI's --set."""
    at = run_page("results", "scenarios/llm_disaggregated_autoscaling.yaml")
    labels = {n.label for n in at.number_input}
    assert {"prefill pool: min replicas", "prefill pool: max replicas", "decode pool: max replicas"} <= labels
    assert "workers" not in labels
    next(n for n in at.number_input if n.label == "decode pool: max replicas").set_value(2).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("--set batching.disaggregation.decode_autoscaler.max_replicas=2" in c.value for c in at.code)
    at = run_page("timeline", "scenarios/llm_disaggregated_autoscaling.yaml")  # each pool over time
    assert any("prefill_workers" in str(c.spec) and "decode_workers" in str(c.spec) for c in at.get("vega_lite_chart"))
    for page in ("plan", "load-curve"):  # they vary a fixed fleet: they say so rather than vary the pools' starts
        at = open_app(page, "scenarios/llm_disaggregated_autoscaling.yaml")
        assert any("fixed fleet" in i.value for i in at.info), page


def test_a_population_of_users_has_a_users_knob_and_no_rate():
    """A population's rate is what its users and the fleet make it: the sidebar offers the
    users, not a rate, and more users send more (as far as the fleet answers)."""
    at = run_page("results", "scenarios/llm_users.yaml")
    labels = {n.label for n in at.number_input}
    assert "users" in labels
    assert "rate (req/s)" not in labels
    assert not [t for t in at.toggle if t.label == "users wait for each answer"]  # a population always does
    goodput = next(m for m in at.metric if m.label == "goodput").value
    next(n for n in at.number_input if n.label == "users").set_value(1000).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("--set traffic.tokens.sessions.users=1000" in c.value for c in at.code)
    fewer = next(m for m in at.metric if m.label == "goodput").value
    assert float(fewer.split()[0].replace(",", "")) < 0.6 * float(goodput.split()[0].replace(",", ""))


def test_a_populations_curve_is_against_its_users_with_the_knee_in_users():
    """A population has no rate to vary: its load curve runs the scenario at populations
    around what the napkin's capacity answers, TTFT and TPOT against the users, and the
    knee between the last size meeting both targets and the first breaking one."""
    from dashboards.data import knee, llm_users_curve

    s = load_scenario(ROOT / "scenarios/llm_users.yaml", ["duration_s=120", "warmup_s=60", "workers.count=2"])
    curve = llm_users_curve(s, [300, 900, 1800])
    assert list(curve["users"]) == [300, 900, 1800]
    assert curve["ttft_ms"].is_monotonic_increasing
    assert curve["completed_rps"].iloc[0] < curve["completed_rps"].iloc[-1]
    k = knee(curve, {"ttft_ms": 300, "tpot_ms": 50}, x="users")
    assert 300 <= k <= 1800
    ok = (curve["ttft_ms"] <= 300) & (curve["tpot_ms"] <= 50)
    assert curve["users"][ok].max() <= k < curve["users"][~ok].min()


@pytest.mark.slow
def test_the_load_curve_page_of_a_population_draws_it():
    at = open_app("load-curve", "scenarios/llm_users.yaml")
    assert charts(at) == 1
    assert any(x.value.startswith("**Knee:**") and "users" in x.value for x in [*at.success, *at.error])


def test_an_llm_scenario_shows_its_tokens_kv_cache_and_queue():
    at = run_page("results", "scenarios/llm_kv_memory.yaml")
    lines = [x.value for x in [*at.success, *at.error]]
    assert any(x.startswith("**TTFT p99 ≤ 2 s: ") for x in lines)
    assert any(x.startswith("**TPOT p99 ≤ 50 ms: ") and "margin" in x for x in lines)
    labels = {m.label for m in at.metric}
    assert {"TTFT p99", "TPOT p99", "goodput", "output tokens/s", "$ per M tokens"} <= labels
    assert {"preemptions a request", "prefix cache hit rate"} <= labels
    specs = [str(c.spec) for c in at.get("vega_lite_chart")]
    for title in ("KV cache in use", "running and waiting", "output tokens"):
        assert any(title in x for x in specs), title
    assert charts(at) >= 5  # KV, running and waiting, tokens, then the request's waterfall and CDF


def test_compare_puts_static_batching_beside_continuous_on_the_same_traffic():
    at = run_page("compare", "scenarios/llm_chat.yaml")  # its header documents the static variant
    assert at.text_area[0].value == "batching.policy=static"
    table = at.dataframe[-1].value
    assert list(table["KPI"][:2]) == ["ttft", "tpot"]
    assert {m.label for m in at.metric} >= {"TTFT p99", "TPOT p99"}
    from dashboards.views.compare import suggestion

    bare = load_scenario(ROOT / "scenarios/llm_kv_memory.yaml")  # with no variant of its own: static
    assert suggestion(bare) == "batching.policy=static"
    for name in ("llm_disaggregated.yaml", "llm_disaggregated_autoscaling.yaml"):  # static cannot split: colocated
        split = ROOT / "scenarios" / name
        assert suggestion(load_scenario(split)) == "batching.disaggregation=null"
        load_scenario(split, [suggestion(load_scenario(split))])  # a variant that loads


def test_the_llm_load_curve_marks_the_knee_between_its_points():
    at = open_app("load-curve", "scenarios/llm_kv_memory.yaml")
    assert charts(at) == 1
    (line,) = [x.value for x in at.success if x.value.startswith("**Knee:**")]
    knee = float(re.search(r"Knee:\*\* ([\d.]+) req/s", line).group(1))
    points = at.dataframe[0].value
    assert points["offered_rps"].min() < knee < points["offered_rps"].max()  # between its points
    assert knee < 2.5  # the scenario's own rate breaks TTFT: the knee is below it


def test_the_knee_is_where_the_first_target_breaks():
    from dashboards.data import knee

    curve = pd.DataFrame(
        {"offered_rps": [1.0, 2.0, 3.0, 4.0], "ttft_ms": [100, 150, 400, 900], "tpot_ms": [10, 20, 30, 90]}
    )
    k = knee(curve, {"ttft_ms": 300, "tpot_ms": 50})
    assert 2.0 < k < 3.0  # TTFT crosses 300 between 2 and 3 req/s (log-linear: 2.71)
    assert k == pytest.approx(2 + np.log(2) / np.log(400 / 150))
    assert knee(curve, {"tpot_ms": 5}) is None  # broken at the lowest rate
    assert knee(curve, {"tpot_ms": 500}) == 4.0  # never broken


def test_the_llm_plan_page_bisects_replicas_for_each_gpu_and_token_budget():
    at = open_app("plan", "scenarios/llm_kv_memory.yaml")
    at.text_input(key="llm-plan-gpus").set_value("h100")
    at.text_input(key="llm-plan-budgets").set_value("2048,8192")
    at.slider(key="llm-plan-range").set_value((1, 3))
    at.button(key="llm-plan-run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert list(table["max_num_batched_tokens"]) == [2048, 8192]
    assert table["met"].astype(bool).all()  # one H100 at 2.5 req/s misses TTFT; 1-3 replicas hold it
    (cheapest,) = [x.value for x in at.success]
    assert cheapest.startswith(f"cheapest: {int(table['workers'].min())} × h100")
    # a GPU without a preset, or one the model does not fit, is refused before anything runs
    for gpu, words in (("h100,b300", "has no GPU preset"), ("t4", "no room for the KV cache")):
        at.text_input(key="llm-plan-gpus").set_value(gpu).run()
        assert not at.exception
        assert any(words in e.value for e in at.error), gpu
        assert "run the plan" not in [b.label for b in at.button]


@pytest.mark.slow
def test_the_load_curve_page_of_a_concurrency_runs_around_the_fleets_seats():
    """No think time: the users' curve runs from a sixteenth to twice the fleet's seats
    (replicas × max_num_seqs), not around a think time's rate (0 users)."""
    at = open_app("load-curve", "scenarios/llm_concurrency.yaml")
    assert charts(at) == 1
    assert any("No think time" in x.value and "256 at most" in x.value for x in at.caption)

"""The sidebar: pick or upload a scenario, edit its main knobs, validate as the CLI does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import streamlit as st

from dashboards.data import ROOT, SCENARIOS, Choice, scenario_files
from simulator.scenario.catalog import load_catalog
from simulator.scenario.config import Scenario
from simulator.scenario.llm import ContinuousBatching
from simulator.scenario.loader import ScenarioError

DEFAULT = "scenarios/inference_platform.yaml"


def _num(label: str, value: float, key: str, *, integer: bool = False, minimum: float = 0.0, help_: str = ""):
    if integer:
        return st.number_input(label, min_value=int(minimum), value=int(value), step=1, key=key, help=help_)
    return st.number_input(label, min_value=float(minimum), value=float(value), key=key, help=help_, format="%g")


def knobs(s: Scenario, prefix: str) -> list[str]:
    """Widgets for the main knobs of ``s``; the overrides (path=value) where they differ."""
    wanted: dict[str, object] = {}
    if s.traffic.rate_rps is not None:
        wanted["traffic.rate_rps"] = _num("rate (req/s)", s.traffic.rate_rps, f"{prefix}rate", minimum=0.001)
    b = s.batching
    scalers = b.autoscalers(s.workers) if isinstance(b, ContinuousBatching) else []
    scalers = [(path, a) for path, a in scalers or [("workers.autoscaler", s.workers.autoscaler)] if a is not None]
    if not scalers:
        wanted["workers.count"] = _num("workers", s.workers.count, f"{prefix}workers", integer=True, minimum=1)
    for path, a in scalers:  # the fleet's autoscaler, or each pool's where prefill and decode are apart
        pool = path.rsplit(".", 1)[-1].removesuffix("_autoscaler")
        label, key = ("autoscaler: {} workers", "") if pool == "autoscaler" else (f"{pool} pool: {{}} replicas", pool)
        wanted[f"{path}.min_replicas"] = _num(label.format("min"), a.min_replicas, f"{prefix}{key}min", integer=True)
        wanted[f"{path}.max_replicas"] = _num(
            label.format("max"), a.max_replicas, f"{prefix}{key}max", integer=True, minimum=1
        )
    llm = {}  # an LLM engine's knobs (path: current value) in place of the dynamic batcher's
    if isinstance(b, ContinuousBatching):
        llm = {
            "batching.max_num_batched_tokens": b.max_num_batched_tokens,
            "batching.max_num_seqs": b.max_num_seqs,
            "batching.enable_prefix_caching": b.enable_prefix_caching,
        }
        wanted["batching.max_num_batched_tokens"] = _num(
            "tokens a step (max_num_batched_tokens)", b.max_num_batched_tokens, f"{prefix}mnbt", integer=True, minimum=1
        )
        wanted["batching.max_num_seqs"] = _num(
            "sequences at once (max_num_seqs)", b.max_num_seqs, f"{prefix}mns", integer=True, minimum=1
        )
        wanted["batching.enable_prefix_caching"] = st.toggle(
            "prefix cache", b.enable_prefix_caching, key=f"{prefix}prefix", help="vLLM's automatic prefix caching."
        )
        sessions = s.traffic.tokens.sessions
        if sessions is not None and sessions.users is not None:  # a population: its size, not a rate
            llm["traffic.tokens.sessions.users"] = sessions.users
            wanted["traffic.tokens.sessions.users"] = _num(
                "users", sessions.users, f"{prefix}users", integer=True, minimum=1
            )
        elif sessions is not None:
            llm["traffic.tokens.sessions.turn_gap_from"] = sessions.turn_gap_from
            waits = st.toggle(
                "users wait for each answer",
                sessions.turn_gap_from == "answer",
                key=f"{prefix}closed",
                help="On: a conversation's next turn comes its gap after the answer reached the user (a closed "
                "loop). Off: its gap after the turn before arrived, as a trace records turns (an open loop).",
            )
            wanted["traffic.tokens.sessions.turn_gap_from"] = "answer" if waits else "arrival"
    else:
        wanted["batching.max_queue_delay_ms"] = _num("batching window (ms)", b.max_queue_delay_ms, f"{prefix}window")
        wanted["batching.max_batch_size"] = _num(
            "max batch", b.max_batch_size, f"{prefix}batch", integer=True, minimum=1
        )
    f = s.features
    if f.lookups_per_request:
        wanted["features.batch_size"] = _num(
            "feature keys per round trip", f.batch_size, f"{prefix}fbatch", integer=True, minimum=1
        )
        wanted["features.parallelism"] = _num(
            "feature round trips in flight", f.parallelism, f"{prefix}fpar", integer=True, minimum=1
        )
    for name in ("result", "feature"):
        cache = getattr(s.caches, name)
        if cache is not None and cache.ttl_s is not None:
            wanted[f"caches.{name}.ttl_s"] = _num(
                f"{name} cache TTL (s)", cache.ttl_s, f"{prefix}{name}ttl", minimum=0.001
            )
    if s.router.canary is not None and not s.router.canary.schedule:
        wanted["router.canary.percent"] = _num("canary (% of users)", s.router.canary.percent, f"{prefix}canary")
    types = sorted(load_catalog(s.cost.catalog).instances)
    if s.workers.instance_type in types:
        wanted["workers.instance_type"] = st.selectbox(
            "instance type",
            types,
            index=types.index(s.workers.instance_type),
            key=f"{prefix}itype",
            help=f"The GPU the workers are: its price, and its speed. Batch times were measured on "
            f"{s.workers.measured_on or s.workers.instance_type} and are rescaled by the catalog's relative "
            "throughput, as `servesim run --set workers.instance_type=...` and `servesim plan` do.",
        )
    current = {
        "traffic.rate_rps": s.traffic.rate_rps,
        "workers.count": s.workers.count,
        **{f"{path}.{end}": getattr(a, end) for path, a in scalers for end in ("min_replicas", "max_replicas")},
        "batching.max_queue_delay_ms": b.max_queue_delay_ms,
        "batching.max_batch_size": b.max_batch_size,
        "features.batch_size": f.batch_size,
        "features.parallelism": f.parallelism,
        "caches.result.ttl_s": s.caches.result.ttl_s if s.caches.result else None,
        "caches.feature.ttl_s": s.caches.feature.ttl_s if s.caches.feature else None,
        "router.canary.percent": s.router.canary.percent if s.router.canary else None,
        "workers.instance_type": s.workers.instance_type,
        **llm,
    }
    return [f"{k}={v}" for k, v in wanted.items() if v != current[k]]


def upload_source(name: str) -> str:
    """Where an upload's relative file references resolve: beside the shipped scenario of
    that name when there is one (a downloaded, edited scenario keeps its profile), else in
    the shipped scenarios' folder."""
    shipped = {p.name: p for p in scenario_files()}
    return str(shipped.get(Path(name).name, SCENARIOS / Path(name).name))


def sidebar() -> tuple[Choice | None, Scenario | None]:
    """The chosen, edited and validated scenario; (choice, None) with an error shown when
    the edit does not validate; (None, None) when the file itself does not."""
    bar = st.sidebar
    files = scenario_files()
    names = [str(p.relative_to(ROOT)) for p in files]
    with bar:
        # the URL carries the scenario (?scenario=scenarios/….yaml), so a link opens the same one
        asked = st.query_params.get("scenario")
        start = asked if asked in names else DEFAULT if DEFAULT in names else names[0]
        picked = st.selectbox("scenario", names, index=names.index(start), key="file")
        if st.query_params.get("scenario") != picked:
            st.query_params["scenario"] = picked
        upload = st.file_uploader("…or upload a scenario YAML", type=["yaml", "yml"], key="upload")
        if upload is not None:
            choice = Choice(source=upload_source(upload.name), text=upload.getvalue().decode("utf-8", errors="replace"))
        else:
            choice = Choice(source=str(ROOT / picked), text=(ROOT / picked).read_text())
        try:
            base = choice.load()
        except ScenarioError as e:
            st.error(str(e))
            if upload is not None and "file not found" in str(e):
                st.info(
                    "An uploaded scenario's relative paths (a profile, an arrivals file) are read from the shipped "
                    f"scenarios' folder, `{SCENARIOS.relative_to(ROOT)}/`: name the file as a path from there, "
                    "or give an absolute path."
                )
            return None, None
        st.caption(base.description or base.name)
        # the knobs' keys carry the file's content: an edited upload of the same name starts
        # from its own values, not the last file's
        digest = hashlib.sha1(choice.text.encode()).hexdigest()[:10]
        overrides = knobs(base, prefix=f"{Path(choice.source).stem}:{digest}:")
        choice = Choice(choice.source, choice.text, tuple(overrides))
        if overrides:
            st.code("\n".join(f"--set {o}" for o in overrides), language="bash")
        try:
            return choice, choice.load()
        except ScenarioError as e:
            st.error(str(e))
            return choice, None

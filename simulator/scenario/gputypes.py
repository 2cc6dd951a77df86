"""One meaning for ``workers.instance_type``: the GPU the workers are, everywhere.

A scenario's batch times are the times on the GPU they were measured on,
``workers.measured_on`` (by default the ``instance_type`` the file itself names). When
``instance_type`` names another GPU (in the file, with ``--set``, in a plan or the
dashboard), the batch times are rescaled by the catalog's relative throughput of the two
types, and the price is that type's. `servesim run` and `servesim plan` thus agree: 130
T4s where the scenario measured A100s are 130 slower workers, not 130 A100s at a T4's
price.
"""

from __future__ import annotations

from simulator.scenario.catalog import Catalog
from simulator.scenario.config import Scenario
from simulator.scenario.servicetime import Affine, Table


def _scaled(st, f: float, where: str):
    if isinstance(st, Affine):
        return st.model_copy(update={"base_ms": st.base_ms * f, "per_item_ms": st.per_item_ms * f})
    if isinstance(st, Table):
        return st.model_copy(update={"batch_ms": {b: v * f for b, v in st.batch_ms.items()}})
    raise ValueError(
        f"{where} is a plain distribution, which cannot be rescaled to another GPU: give an affine or table "
        "service time, or measure on the target type"
    )


def speed_ratio(catalog: Catalog, measured_on: str, instance_type: str) -> float:
    """How many times longer a batch takes on ``instance_type`` than on ``measured_on``."""
    rows = catalog.instances
    for t, field in ((measured_on, "workers.measured_on"), (instance_type, "workers.instance_type")):
        if t not in rows:
            raise ValueError(f"{field} {t!r} is not in the catalog ({', '.join(sorted(rows))})")
        if rows[t].relative_throughput is None:
            raise ValueError(f"the catalog has no relative_throughput for {t!r}: cannot rescale the batch time")
    return rows[measured_on].relative_throughput / rows[instance_type].relative_throughput


def on_type(s: Scenario, instance_type: str, catalog: Catalog) -> Scenario:
    """``s`` with its workers on ``instance_type``: every batch time rescaled from the type it
    was measured on (``workers.measured_on``, else ``instance_type``), which it then records."""
    w = s.workers
    source = w.measured_on or w.instance_type
    if s.traffic.tokens is not None:  # an LLM replica: its roofline is the new GPU's own
        from simulator.scenario.llm import LinearStep

        if isinstance(s.batching.step_time, LinearStep) and instance_type != source:
            raise ValueError(
                f"batching.step_time was fitted on {source}; on {instance_type} give the roofline "
                "(drop step_time) or a step time fitted there"
            )
        return s.model_copy(update={"workers": w.model_copy(update={"instance_type": instance_type})}).repriced(catalog)
    if instance_type == source:
        return s.model_copy(update={"workers": w.model_copy(update={"instance_type": instance_type})}).repriced(catalog)
    f = speed_ratio(catalog, source, instance_type)
    workers = w.model_copy(
        update={
            "instance_type": instance_type,
            "measured_on": instance_type,
            "service_time": _scaled(w.service_time, f, "workers.service_time"),
        }
    )
    update: dict = {"workers": workers}
    r = s.router
    versions = {
        name: v.model_copy(update={"service_time": _scaled(v.service_time, f, f"router.{name}.service_time")})
        for name, v in (("canary", r.canary), ("shadow", r.shadow))
        if v is not None and v.service_time is not None
    }
    if versions:
        update["router"] = r.model_copy(update=versions)
    if s.traffic.classes:
        classes = {
            name: c.model_copy(
                update={"service_time": _scaled(c.service_time, f, f"traffic.classes.{name}.service_time")}
            )
            if c.service_time is not None
            else c
            for name, c in s.traffic.classes.items()
        }
        update["traffic"] = s.traffic.model_copy(update={"classes": classes})
    return s.model_copy(update=update).repriced(catalog)

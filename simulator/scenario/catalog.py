"""The GPU instance catalog: what one worker-hour costs, with where the price came from."""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import Field

from simulator.scenario.frozen import Frozen


class Instance(Frozen):
    """One catalog row: a GPU type and its price per GPU-hour, with source and date."""

    gpu: str = Field(description="GPU model.")
    aws_instance: str | None = Field(None, description="Cloud instance type the price is taken from.")
    gpus_per_instance: int = Field(1, ge=1, description="GPUs in that instance.")
    instance_price_per_hour_usd: float | None = Field(None, gt=0, description="Whole-instance price, USD/h.")
    price_per_gpu_hour_usd: float = Field(gt=0, description="Price of one GPU (one worker), USD/h.")
    source: str = Field(description="Where the price was read.")
    as_of: str = Field(description="When the price was read (YYYY-MM or YYYY-MM-DD).")
    spot_price_per_gpu_hour_usd: float | None = Field(
        None, gt=0, description="Indicative spot price of one GPU, USD/h (spot prices move; check before quoting)."
    )
    spot_source: str | None = Field(None, description="Where the spot price was read, and when.")
    relative_throughput: float | None = Field(
        None, gt=0, description="Inference throughput relative to the catalog's reference GPU (a100 = 1)."
    )
    throughput_source: str | None = Field(None, description="Where the relative throughput comes from.")

    def price(self, market: str = "on_demand") -> float:
        """USD per GPU-hour on ``market`` (on_demand or spot)."""
        if market == "spot":
            if self.spot_price_per_gpu_hour_usd is None:
                raise ValueError(f"{self.gpu}: the catalog has no spot price")
            return self.spot_price_per_gpu_hour_usd
        return self.price_per_gpu_hour_usd


class Catalog(Frozen):
    """Instance types by key (t4, l4, a100, h100, ...)."""

    instances: dict[str, Instance]


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The catalog at ``path``, or the one shipped with servesim."""
    if path is None:
        return _shipped()
    return Catalog.model_validate(yaml.safe_load(Path(path).read_text()))


@functools.cache
def _shipped() -> Catalog:
    """The catalog shipped with servesim, read once (it is package data; a Catalog is frozen)."""
    text = resources.files("simulator.scenario").joinpath("data/instances.yaml").read_text()
    return Catalog.model_validate(yaml.safe_load(text))


def worker_hour_price(catalog: Catalog, instance_type: str, market: str) -> float:
    """USD per worker-hour of ``instance_type`` on ``market``; ValueError naming what is missing."""
    row = catalog.instances.get(instance_type)
    if row is None:
        known = ", ".join(sorted(catalog.instances))
        raise ValueError(f"workers.instance_type {instance_type!r} not in catalog ({known})")
    return row.price(market)


def instance_for_gpu(name: str, catalog: Catalog | None = None) -> str | None:
    """The catalog's instance type a GPU's name is, a word of it (``NVIDIA H100 80GB
    HBM3``: ``h100``; ``NVIDIA A100-SXM4-80GB``: ``a100``; an L40S is not an ``l4``), or
    None where the catalog lists none of its words."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    return next((key for key in (catalog or load_catalog()).instances if key in words), None)

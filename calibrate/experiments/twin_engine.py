"""What the LLM twin's experiments share (``llm_twin_updates.py``, ``llm_twin_precision.py``,
``llm_twin_target.py``): a calibration folder read as the twin would meet its engine, and
that engine simulated at half its knee as the twin would scrape it. Imported by the scripts
beside it (they run as files: their folder is first on the path), and it uses nothing of the
twin but :func:`calibrate.vllm_metrics.scrapes_of` (an older commit's
``calibrate.watch_llm.scrapes_of``), so that an older twin runs the scripts
(``PYTHONPATH=<its worktree>``)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from simulator import simulate
from simulator.scenario.config import Scenario

try:
    from calibrate.vllm_metrics import scrapes_of
except ImportError:  # an older commit's twin (PYTHONPATH=<its worktree>), before vllm_metrics
    from calibrate.watch_llm import scrapes_of

CPU_PROFILE = Path(__file__).parents[1] / "profiles/cpu-tiny-llm"  # the committed CPU calibration


def profile_engine(folder: Path = CPU_PROFILE) -> tuple[dict, float, dict]:
    """A calibration folder's scenario (parsed YAML), its measured knee (req/s), and the KV
    labels its engine exports (``vllm:cache_config_info``), built from the profile."""
    profile = json.loads((folder / "profile.json").read_text())
    base = yaml.safe_load((folder / "scenario.yaml").read_text())
    eng = profile["engine"]
    info = {"num_gpu_blocks": str(eng["num_blocks"]), "block_size": str(eng["block_size"])}
    info.update({k: str(eng[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if k in eng})
    return base, profile["knee"]["completed_rps"], info


def half_knee_scrapes(base: dict, knee: float, info: dict, duration_s: float, every_s: float, n: int, seed: int):
    """The engine ``base`` models, at half ``knee`` for ``duration_s`` (one open-loop run on
    ``seed``), as ``n`` scrapes every ``every_s`` would read its /metrics."""
    doc = json.loads(json.dumps(base))
    doc["traffic"]["rate_rps"] = 0.5 * knee
    doc["duration_s"], doc["warmup_s"] = duration_s, 0.0
    doc.pop("autoscaler", None)
    records = simulate(Scenario.model_validate(doc), seed=seed).records
    return scrapes_of(records, every_s, n, info)

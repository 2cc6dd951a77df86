"""GuideLLM, run and read: the load generator nobody here wrote that ``servesim calibrate
judge`` (:mod:`calibrate.judge`) sets against the calibrated scenario. One run open loop
(Poisson) or at a fixed concurrency against an OpenAI-compatible server, on core 0 with
one worker process, in a process group of its own that goes whole however the judge stops;
the engine's byte tokenizer written as a local Hugging Face one (no hub here), so GuideLLM's
token counts are the engine's; and its JSON report read into each completed request's
lengths and times.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

METRICS = {  # ours: GuideLLM's per-request field
    "ttft": "time_to_first_token_ms",
    "itl": "inter_token_latency_ms",
    "tpot": "time_per_output_token_ms",
}
# GuideLLM's synthetic lengths: normal (mean, stdev), clipped; the same means and spread as
# calibrate llm's workload
PROMPT = {"mean": 256, "stdev": 150, "min": 8, "max": 1024}
OUTPUT = {"mean": 64, "stdev": 38, "min": 2, "max": 256}


class JudgeMissing(RuntimeError):
    """GuideLLM (or transformers) is not installed."""


def byte_tokenizer(path: Path) -> Path:
    """A Hugging Face tokenizer whose tokens are UTF-8 bytes, as the engine's: token ``b``
    is byte ``b`` (GPT-2's byte-level alphabet, no merges), written to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char, extra = {}, 0
    for b in range(256):  # GPT-2's byte-to-character map: printable bytes as themselves
        if b in printable:
            char[b] = chr(b)
        else:
            char[b] = chr(256 + extra)
            extra += 1
    tok = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(path))
    return path


def guidellm_command() -> list[str]:
    exe = shutil.which("guidellm") or str(Path(sys.executable).with_name("guidellm"))
    if not Path(exe).exists():
        raise JudgeMissing("GuideLLM is not installed: pip install 'servesim[judge]' (or pip install guidellm)")
    return [exe]


def run_guidellm(
    url: str, rate_rps: float, duration_s: float, out: Path, tokenizer: Path, seed: int, streams: int = 0
) -> dict:
    """One GuideLLM Poisson run at ``rate_rps`` for ``duration_s`` (or, with ``streams``,
    its concurrent profile: that many requests in flight, each sent as the one before it
    ends); its JSON report."""

    def kv(**items) -> str:
        return ",".join(f"{k}={v}" for k, v in items.items())

    data = kv(
        kind="synthetic_text",
        prompt_tokens=PROMPT["mean"],
        prompt_tokens_stdev=PROMPT["stdev"],
        prompt_tokens_min=PROMPT["min"],
        prompt_tokens_max=PROMPT["max"],
        output_tokens=OUTPUT["mean"],
        output_tokens_stdev=OUTPUT["stdev"],
        output_tokens_min=OUTPUT["min"],
        output_tokens_max=OUTPUT["max"],
    )
    cmd = [
        *guidellm_command(),
        "run",
        "--backend",
        kv(kind="openai_http", target=url, request_format="/v1/completions"),
        "--profile",
        kv(kind="concurrent", streams=streams) if streams else kv(kind="poisson", rate=f"{rate_rps:.4f}"),
        "--constraint",
        kv(kind="max_duration", seconds=f"{duration_s:g}"),
        "--data",
        data,
        "--tokenizer",
        kv(kind="huggingface_auto", model=str(tokenizer)),
        "--seed",
        kv(kind="static", value=seed),
        "--output",
        kv(kind="json", path=str(out)),
        "--disable-progress",
    ]
    env = {**os.environ, "GUIDELLM__MAX_WORKER_PROCESSES": "1", "HF_HUB_OFFLINE": "1"}

    def core0():  # where the front end and our own generator run; the engine has core 1
        if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    # in a session of its own: GuideLLM's worker processes go with it however the judge stops
    # (a SIGTERM's KeyboardInterrupt, a timeout), not only its main process
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=core0,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=duration_s + 300)
    finally:
        _stop_group(proc)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm failed (exit {proc.returncode}): {stderr[-2000:] or stdout[-2000:]}")
    return json.loads(out.read_text())


def _stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop what is left of ``proc``'s process group: SIGTERM, then SIGKILL to whatever
    outlives ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:  # nobody left
        proc.wait()
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # the leader reaped, so that only live members keep the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def requests(report: dict) -> pd.DataFrame:
    """The run's completed requests: lengths and GuideLLM's own per-request times (ms)."""
    bench = report["benchmarks"][0]
    ok = bench["requests"]["successful"]
    rows = [
        {
            "prompt_tokens": r["prompt_tokens"],
            "output_tokens": r["output_tokens"],
            **{ours: r[theirs] for ours, theirs in METRICS.items()},
        }
        for r in ok
    ]
    df = pd.DataFrame(rows)
    df.attrs["errored"] = len(bench["requests"]["errored"] or [])
    df.attrs["incomplete"] = len(bench["requests"]["incomplete"] or [])
    df.attrs["percentiles"] = {
        ours: bench["metrics"][theirs]["successful"]["percentiles"] for ours, theirs in METRICS.items()
    }
    return df

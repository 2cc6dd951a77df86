"""The interview trainer's LLM situations: a chat assistant's fleet, KV memory, continuous
against static batching, chunked prefill and the TPOT tail, prefix caching for RAG.

Each works as the request-path situations do (:mod:`simulator.planning.practice`): the
numbers are drawn from a seed, the candidate's napkin steps are graded against this
module's napkin (each line a :class:`~simulator.planning.napkin.Line`, its formula with the
values put in), then the simulator runs the situation and its contrast (FP16 against INT4
weights, static against continuous, whole prompts against chunks, the cache off against
on) and says, from what the runs show, why they and the napkin differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.planning.llm_napkin import llm_napkin, mean_tokens
from simulator.planning.napkin import Line
from simulator.scenario.config import Scenario
from simulator.scenario.llm import gpu_spec

CHUNK = 1024  # the chunked-prefill situation's max_num_batched_tokens


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 or float(x).is_integer() else f"{x:,.3g}"


def _step(s: Scenario):
    from simulator.serving.step_time import step_model

    return step_model(s.batching, s.workers.instance_type)


def _prefill_ms(s: Scenario, tokens: int) -> float:
    """What ``tokens`` prompt tokens (one chunk, from nothing cached) add to a step."""
    from simulator.serving.step_time import Work

    step = _step(s)
    return step.ms(Work(prefill_tokens=tokens, attention=tokens * tokens / 2.0, chunks=1)) - step.ms(Work())


def _decode_ms(s: Scenario, batch: int, context: float) -> float:
    from simulator.serving.step_time import Work

    return _step(s).ms(Work(decodes=batch, decode_context=int(batch * context)))


def _common(s: Scenario, price: float) -> dict[str, str]:
    b, m = s.batching, s.batching.spec
    gpu = gpu_spec(s.workers.instance_type)
    return {
        "rate": f"{_fmt(s.traffic.rate_rps)} requests/s",
        "model": b.model,
        "params": f"{m.params_b:g}",
        "layers": str(m.layers),
        "kv_heads": str(m.kv_heads),
        "head_dim": str(m.head_dim),
        "gpu": s.workers.instance_type.upper(),
        "gpu_gb": f"{gpu.memory_gb:g}",
        "util": f"{b.gpu_memory_utilization:.0%}",
        "activations": f"{b.activations_gb:g}",
        "price": f"${price:.4g}",
        "headroom": f"{s.napkin.headroom:.0%}",
        "percentile": f"{s.sla.percentile:g}",
        "replicas": str(s.workers.count),
        "ttft": f"{s.sla.ttft_ms:g} ms" if s.sla.ttft_ms is not None else "–",
        "tpot": f"{s.sla.tpot_ms:g} ms" if s.sla.tpot_ms is not None else "–",
    }


def chat(s: Scenario, price: float) -> tuple[list[Line], dict[str, str]]:
    lines, nap = llm_napkin(s, price)
    e_s, e_o = mean_tokens(s)
    givens = _common(s, price) | {
        "prompt_tokens": _fmt(round(e_s, -1)),
        "output_tokens": _fmt(round(e_o)),
        "batch": str(nap.batch),
        "step_ms": f"{nap.step_ms:.3g}",
        "prefill_ms": f"{nap.prefill_ms:.3g}",
    }
    return lines, givens


def kv_memory(s: Scenario, price: float) -> tuple[list[Line], dict[str, str]]:
    b, m = s.batching, s.batching.spec
    gpu = gpu_spec(s.workers.instance_type)
    seq = int(s.traffic.tokens.prompt.fixed + s.traffic.tokens.output.fixed)
    per_token = m.kv_bytes_per_token
    per_seq = per_token * seq / 1e9
    usable = gpu.memory_gb * b.gpu_memory_utilization
    w16, w4 = m.params_b * 2.0, m.params_b * 0.5
    left16, left4 = usable - w16 - b.activations_gb, usable - w4 - b.activations_gb
    kv = f"2 × {m.layers} layers × {m.kv_heads} KV heads × {m.head_dim} × 2 bytes"
    lines = [
        Line("FP16 weights", f"{m.params_b:g} B × 2 bytes", w16, "GB"),
        Line("KV bytes per token", kv, per_token / 1e3, "KB"),
        Line("KV per sequence", f"{per_token / 1e3:,.0f} KB × {seq:,} tokens", per_seq, "GB"),
        Line(
            "KV memory, FP16 weights",
            f"{gpu.memory_gb:g} GB × {b.gpu_memory_utilization:g} − {w16:.3g} GB − {b.activations_gb:g} GB",
            left16,
            "GB",
        ),
        Line("sequences, FP16 weights", f"⌊{left16:.3g} GB / {per_seq:.3g} GB⌋", left16 // per_seq, "sequences"),
        Line("INT4 weights", f"{m.params_b:g} B × 0.5 bytes", w4, "GB"),
        Line("sequences, INT4 weights", f"⌊{left4:.3g} GB / {per_seq:.3g} GB⌋", left4 // per_seq, "sequences"),
    ]
    return lines, _common(s, price) | {"seq_tokens": f"{seq:,}"}


def longest_of(s: Scenario, batch: int, draws: int = 2000) -> float:
    """The mean longest output of ``batch`` requests (a fixed sample: the same for every
    attempt with the same numbers)."""
    _, output = s.traffic.tokens.lengths()
    rng = np.random.default_rng(0)
    return float(np.asarray(output.sample(draws * batch, rng), dtype=float).reshape(draws, batch).max(axis=1).mean())


def static(s: Scenario, price: float) -> tuple[list[Line], dict[str, str]]:
    lines, givens = chat(s, price)
    by = {ln.quantity: ln for ln in lines}
    batch, t_b = int(givens["batch"]), float(givens["step_ms"])
    prefill = float(givens["prefill_ms"])
    longest = longest_of(s, batch)
    lam = by["peak request rate"].value
    dur = (batch * prefill + longest * t_b) / 1000.0
    rps = batch / dur
    lines = [
        by["per-replica throughput"],
        by["replicas"],
        Line("static batch time", f"({batch} × {prefill:.3g} ms + {longest:,.0f} × {t_b:.3g} ms) / 1000", dur, "s"),
        Line("static per-replica throughput", f"{batch} / {dur:.3g} s", rps, "req/s"),
        Line("static replicas", f"⌈{lam:,.0f} / {rps:.3g}⌉", math.ceil(lam / rps - 1e-9), "replicas"),
    ]
    return lines, givens | {"longest": _fmt(round(longest))}


def chunked(s: Scenario, price: float) -> tuple[list[Line], dict[str, str]]:
    e_s, e_o = mean_tokens(s)
    doc = int(s.traffic.tokens.prompt.p99)
    napkin = {ln.quantity: ln.value for ln in llm_napkin(s, price)[0]}
    n = max(1, round(napkin["running sequences per replica"]))  # Little's law, as the napkin has it
    t_n = _decode_ms(s, n, e_s + e_o / 2)
    per_ms = doc / _prefill_ms(s, doc)
    whole = doc / per_ms
    room = CHUNK - n
    chunk_ms = room / per_ms
    steps = math.ceil(doc / room)
    lines = [
        Line("document prefill", f"{doc:,} tokens / {per_ms:,.0f} tokens a ms", whole, "ms"),
        Line("gap, whole", f"{t_n:.3g} ms + {whole:,.0f} ms", t_n + whole, "ms"),
        Line("gap, chunked", f"{t_n:.3g} ms + ({CHUNK} − {n}) / {per_ms:,.0f} ms", t_n + chunk_ms, "ms"),
        Line("chunked steps", f"⌈{doc:,} / ({CHUNK} − {n})⌉", steps, "steps"),
        Line("document prefill, chunked", f"{steps} × ({t_n:.3g} + {chunk_ms:.3g}) ms", steps * (t_n + chunk_ms), "ms"),
    ]
    givens = _common(s, price) | {
        "doc_tokens": f"{doc:,}",
        "tokens_per_ms": _fmt(round(per_ms, -1)),
        "running": str(n),
        "step_ms": f"{t_n:.3g}",
        "chunk": f"{CHUNK:,}",
    }
    return lines, givens


def rag(s: Scenario, price: float) -> tuple[list[Line], dict[str, str]]:
    t = s.traffic.tokens
    doc = int(t.prefix.tokens)
    b = s.batching
    kv = next(ln for ln in llm_napkin(s, price)[0] if ln.quantity == "KV cache per replica")
    kv_tokens = int(kv.value)
    e_s, _ = mean_tokens(s)  # the question and the document its request shares (every request)
    q = e_s - t.prefix.share * doc
    per_ms = (doc + q) / _prefill_ms(s, int(doc + q))
    computed = doc + q - (doc // b.block_size) * b.block_size
    lines = [
        Line("prompt tokens", f"{doc:,} + {q:,.0f}", doc + q, "tokens"),
        kv,
        Line("documents per replica", f"{kv_tokens:,} / {doc:,}", kv_tokens / doc, "documents"),
        Line("computed on a hit", f"{doc + q:,.0f} − {doc:,} (whole blocks of {b.block_size})", computed, "tokens"),
        Line("prefill saved", f"{doc:,} / {per_ms:,.0f} tokens a ms", doc / per_ms, "ms"),
    ]
    givens = _common(s, price) | {
        "groups": f"{t.prefix.groups:,}",
        "doc_tokens": f"{doc:,}",
        "question_tokens": _fmt(round(q, -1)),
        "kv_kb": f"{b.spec.kv_bytes_per_token / 1e3:.4g}",
        "tokens_per_ms": _fmt(round(per_ms, -1)),
    }
    return lines, givens


NAPKINS = {
    "llm_chat": chat,
    "llm_kv_memory": kv_memory,
    "llm_static_batching": static,
    "llm_chunked_prefill": chunked,
    "llm_rag_prefix": rag,
}

# each situation's contrast: (label, overrides) run beside the question's own scenario
CONTRASTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "llm_chat": [("continuous, as asked", ())],
    "llm_kv_memory": [("FP16 weights", ()), ("INT4 weights", ("batching.weight_bytes=0.5",))],
    "llm_static_batching": [("static", ("batching.policy=static",)), ("continuous", ())],
    "llm_chunked_prefill": [
        ("whole prompts", ()),
        (f"chunks of {CHUNK:,}", (f"batching.max_num_batched_tokens={CHUNK}",)),
    ],
    "llm_rag_prefix": [("no prefix cache", ("batching.enable_prefix_caching=false",)), ("prefix cache", ())],
}


@dataclass
class LLMReveal:
    """The simulator's answer to an LLM question: one row per run (the situation's
    contrast), the fewest replicas meeting the SLA where the question is a fleet's, and
    why the napkin and the simulation differ."""

    workers: int
    table: pd.DataFrame
    minimum_workers: int | None
    met: bool
    headline: str
    why: list[str]


def _one(s: Scenario) -> dict:
    from simulator.planning.runner import run

    result = run(s, chunk_s="whole", interval_s=None)
    m = result.summary
    llm = m["llm"]
    sizes = result.run.batches.size
    return {
        "TTFT p50 (ms)": llm["ttft_ms"]["p50"],
        "TTFT p99 (ms)": llm["ttft_ms"]["p99"],
        "TPOT p99 (ms)": llm["tpot_ms"]["p99"],
        "worst gap p99 (ms)": llm["max_itl_ms"]["p99"],
        "output tokens/s": llm["tokens"]["output_per_s"],
        "goodput (req/s)": llm["sla"]["goodput_rps"],
        "most sequences in a step": int(sizes.max()) if len(sizes) else 0,
        "mean sequences in a step": float(sizes.mean()) if len(sizes) else 0.0,
        "preemptions a request": llm["tokens"]["preemptions_per_request"],
        "prefix cache hit rate": llm["tokens"]["prefix_hit_rate"],
        "$ per M tokens": llm["cost"]["per_million_tokens_usd"],
        "met": bool(m["sla"]["met"]) and all(v is None or v["met"] for v in (llm["sla"]["ttft"], llm["sla"]["tpot"])),
    }


def reveal(q, workers: int | None = None) -> LLMReveal:
    """Run the question's scenario (at ``workers`` replicas where the question is a
    fleet's) and its contrast; the fewest replicas meeting the SLA for the chat question."""
    from simulator.planning.plan import Planner, with_workers
    from simulator.planning.situations import SCENARIOS, SITUATIONS
    from simulator.scenario.loader import load_scenario

    sit = SITUATIONS[q.situation]
    n = max(1, int(workers or q.scenario.workers.count))
    rows = []
    for label, extra in CONTRASTS[q.situation]:
        s = load_scenario(SCENARIOS / sit.file, [*q.sets, *extra]) if extra else q.scenario
        rows.append({"run": label, **_one(with_workers(s, n))})
    table = pd.DataFrame(rows)
    table.attrs["replicas"] = n
    minimum = None
    if q.situation == "llm_chat":
        bare = int(q.answers["replicas"])
        planner = Planner(replications=2, max_replications=4)
        top = max(2 * bare, n, bare + 2)
        best, _, _ = planner.min_workers(q.scenario, max(1, bare // 2), top, f"practice:{q.seed}")
        minimum = best.workers if best else None
    first = table.iloc[0]
    met = bool(first["met"])
    sla = q.scenario.sla
    headline = (
        f"At {n} replica{'s' if n != 1 else ''}: TTFT p99 {first['TTFT p99 (ms)']:,.0f} ms "
        f"(target {sla.ttft_ms:g} at p{sla.percentile:g}), TPOT p99 {first['TPOT p99 (ms)']:,.1f} ms (target "
        f"{sla.tpot_ms:g}): {'met' if met else 'missed'}."
    )
    return LLMReveal(n, table, minimum, met, headline, WHY[q.situation](q, table, minimum))


def _why_chat(q, t: pd.DataFrame, minimum: int | None) -> list[str]:
    r = t.iloc[0]
    a = q.answers
    out = []
    if minimum is not None and minimum != a["replicas"]:
        more = minimum > a["replicas"]
        out.append(
            f"The simulator needs {minimum} replicas where the bare napkin says {a['replicas']:,.0f}: "
            + (
                "the napkin's mean rates leave no room for the queue of prompts the first token waits behind "
                "at the TTFT percentile."
                if more
                else "the running batch grows with the load, and a wider decode step costs little more."
            )
        )
    mean_seqs = r["mean sequences in a step"]
    per = q.scenario.traffic.rate_rps / t.attrs.get("replicas", q.scenario.workers.count)
    out.append(
        f"Batches: the napkin sized a replica at its full batch of {q.givens['batch']} ({q.givens['step_ms']} ms a "
        f"step); at {per:.3g} req/s a replica the run's steps averaged {mean_seqs:.0f} sequences, so steps were "
        f"shorter and TPOT p{q.scenario.sla.percentile:g} came out at {r['TPOT p99 (ms)']:.1f} ms against "
        f"{q.scenario.sla.tpot_ms:g}: "
        + ("TTFT, not TPOT, limits this fleet." if r["TPOT p99 (ms)"] < q.scenario.sla.tpot_ms else "TPOT binds.")
    )
    out.append(
        f"TTFT is a queue, not an average: p99 {r['TTFT p99 (ms)']:,.0f} ms against a median of "
        f"{r['TTFT p50 (ms)']:,.0f} ms, from prompts arriving in bunches and long prompts ahead in the same step "
        f"(max_num_batched_tokens {q.scenario.batching.max_num_batched_tokens:,} tokens a step)."
    )
    if r["preemptions a request"] > 0.001:
        out.append(
            f"The KV cache ran full: {r['preemptions a request']:.3f} preemptions a request, each recomputing its "
            "prompt, which the napkin's steady state does not see."
        )
    return out


def _why_kv(q, t: pd.DataFrame, _minimum) -> list[str]:
    f16, i4 = t.iloc[0], t.iloc[1]
    a = q.answers
    return [
        f"FP16: the napkin fits {a['seqs_fp16']:.0f} whole sequences; the run held up to "
        f"{f16['most sequences in a step']} at once (mean {f16['mean sequences in a step']:.1f}). vLLM admits a "
        "sequence when its prompt's blocks are free, not its whole length: more start than can finish together, "
        f"and as they grow the cache runs out ({f16['preemptions a request']:.2f} preemptions a request, each a "
        "recompute).",
        f"INT4: {a['weights_fp16_gb'] - a['weights_int4_gb']:.3g} GB of weights freed for the KV cache: "
        f"{a['seqs_int4']:.0f} sequences on the napkin, up to {i4['most sequences in a step']} in the run. "
        "Quantizing the weights buys memory, not KV: the cache stays FP16, so the gain is the weights' difference "
        "over one sequence's KV.",
        "Blocks: the KV cache is allocated in blocks of "
        f"{q.scenario.batching.block_size} tokens; a sequence's last block is partly empty, which the napkin's "
        "bytes-per-token count leaves out.",
    ]


def _why_static(q, t: pd.DataFrame, _minimum) -> list[str]:
    st_, co = t.iloc[0], t.iloc[1]
    n = q.answers["static_replicas"]
    return [
        f"The napkin's {n:.0f} static replicas keep up with the tokens, and still miss the first-token target: "
        f"TTFT p50 {st_['TTFT p50 (ms)']:,.0f} ms and p99 {st_['TTFT p99 (ms)']:,.0f} ms against "
        f"{co['TTFT p50 (ms)']:,.0f} and {co['TTFT p99 (ms)']:,.0f} ms continuous, on the same fleet. A request "
        "that arrives while a batch runs waits for the whole batch: throughput is not the SLA.",
        f"A static batch decodes until its longest answer ({q.givens['longest']} tokens on average against a "
        f"mean of {q.givens['output_tokens']}): a finished answer's place stays empty until the batch ends, where "
        "continuous batching fills it at the next step.",
        f"Static batches are as wide as the queue when they start, not the napkin's {q.givens['batch']}: up to "
        f"{st_['most sequences in a step']} in the run (continuous: up to {co['most sequences in a step']}), "
        "so the time per token follows the queue.",
    ]


def _why_chunked(q, t: pd.DataFrame, _minimum) -> list[str]:
    whole, chunk = t.iloc[0], t.iloc[1]
    return [
        f"The worst gap between two tokens (p99 over requests): {whole['worst gap p99 (ms)']:,.0f} ms with whole "
        f"prompts, {chunk['worst gap p99 (ms)']:,.0f} ms in chunks: the napkin's {q.answers['gap_whole_ms']:,.0f} "
        f"and {q.answers['gap_chunked_ms']:,.0f} ms, with more than one document sometimes in a step.",
        f"TPOT p99 moves less ({whole['TPOT p99 (ms)']:,.1f} → {chunk['TPOT p99 (ms)']:,.1f} ms): TPOT averages a "
        "request's gaps, so one long stall is spread over its tokens; the worst gap is what a reader sees.",
        f"The documents pay: TTFT p99 {whole['TTFT p99 (ms)']:,.0f} → {chunk['TTFT p99 (ms)']:,.0f} ms, a "
        "document's prefill now spread over steps shared with the decodes.",
    ]


def _why_rag(q, t: pd.DataFrame, _minimum) -> list[str]:
    off, on = t.iloc[0], t.iloc[1]
    hit = on["prefix cache hit rate"]
    return [
        f"The cache served {hit:.0%} of prompt tokens, not every document's: each of the "
        f"{q.scenario.workers.count} replicas (round robin) must cache every document it is asked about, and "
        f"it holds about {q.answers['docs_per_replica']:.0f} of {q.givens['groups']}: the popular ones stay, "
        "the rest miss.",
        f"TTFT p50 {off['TTFT p50 (ms)']:,.0f} → {on['TTFT p50 (ms)']:,.0f} ms, p99 {off['TTFT p99 (ms)']:,.0f} → "
        f"{on['TTFT p99 (ms)']:,.0f} ms: a hit computes about {q.answers['computed_on_hit']:,.0f} prompt tokens "
        f"instead of {q.answers['prompt_tokens']:,.0f}, and without the cache the replicas spend their time on "
        "the same documents' prefills again.",
        "Routing by prefix (router.balancing: prefix_affinity) sends a document's requests to one replica, "
        "so the replicas split the documents instead of each caching them all.",
    ]


WHY = {
    "llm_chat": _why_chat,
    "llm_kv_memory": _why_kv,
    "llm_static_batching": _why_static,
    "llm_chunked_prefill": _why_chunked,
    "llm_rag_prefix": _why_rag,
}

"""The napkin of an LLM fleet (``batching.kind: continuous``), each line with its formula:
the mean tokens, weights and KV bytes, the sequences a replica's KV cache holds, a decode
step at a batch, a prompt's prefill, Little's law for the running sequences, the replicas
with headroom and their cost; prefill and decode apart where the fleet splits them.
:mod:`simulator.planning.napkin` is a batch fleet's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq

from simulator.planning.napkin import Line, peak_rate
from simulator.planning.prefix_cache import CacheEstimate, PrefixCache
from simulator.scenario.config import Scenario


def mean_tokens(s: Scenario, draws: int = 100_000) -> tuple[float, float]:
    """The mean prompt (with any shared prefix, and a session's history) and output tokens
    of the traffic, from a fixed sample of the length distributions (their clipping
    included); with sessions, of the turns of ``draws / 5`` sessions."""
    import numpy as np

    t = s.traffic.tokens
    extra = t.prefix.share * t.prefix.tokens if t.prefix is not None else 0.0
    if t.sessions is not None:
        from simulator.rng import streams
        from simulator.stages.tokens import TokenDraws

        turns = TokenDraws(s, streams(0)).sessions._start(np.zeros(draws // 5))[1]
        return float(turns.prompt.mean()), float(turns.output.mean())
    if t.from_trace:
        from simulator.scenario.tokens import read_trace

        _, prompt, output = read_trace(s.traffic.arrivals_file)
        return float(prompt.mean()) + extra, float(output.mean())
    prompt, output = t.lengths()
    rng = np.random.default_rng(0)
    return float(prompt.sample(draws, rng).mean()) + extra, float(output.sample(draws, rng).mean())


@dataclass(frozen=True)
class LLMNapkin:
    """The LLM napkin's key figures (per replica unless said)."""

    batch: int  # decoding sequences the napkin assumes per step
    step_ms: float  # a decode step at that batch
    prefill_ms: float  # a mean prompt's prefill, above a step's fixed cost
    per_replica_rps: float
    bare: int
    padded: int


def llm_napkin(s: Scenario, price_per_worker_hour: float) -> tuple[list[Line], LLMNapkin]:
    """The napkin of an LLM scenario (``batching.kind: continuous``): weights and KV bytes,
    the concurrent sequences the KV cache holds, a decode step's time at a batch, tokens/s
    per GPU, a prompt's prefill, Little's law for the running sequences, and replicas with
    headroom and their cost."""
    from simulator.scenario.llm import gpu_spec
    from simulator.serving.step_time import Work, step_model

    b, w = s.batching, s.workers
    if w.mix:
        raise ValueError(
            "workers.mix: the napkin counts replicas of one GPU type; run the mixed fleet (servesim run) "
            "or compare types with servesim plan --vary workers.instance_type"
        )
    m = b.spec
    lam = peak_rate(s)
    e_s, e_o = mean_tokens(s)
    step = step_model(b, w.instance_type)
    blocks = b.blocks(w.instance_type)
    kv_tokens = blocks * b.block_size
    concurrent = kv_tokens / (e_s + e_o)  # each sequence's footprint when it finishes
    cap = int(min(b.max_num_seqs, concurrent))

    def decode_ms(batch: int) -> float:
        return step.ms(Work(decodes=batch, decode_context=int(batch * (e_s + e_o / 2))))

    target = s.sla.tpot_ms
    batch = cap
    if target is not None:  # the widest batch whose step stays within the TPOT target
        while batch > 1 and decode_ms(batch) > target:
            batch -= 1
    users = s.traffic.users
    think_s = s.traffic.tokens.sessions.turn_gap.mean / 1000.0 if users is not None else 0.0
    # a population runs no more sequences than it has users; with no think time (a load
    # generator's concurrency) every replica holds its share of them, always: the fewest
    # replicas are those whose share decodes within the TPOT target
    widest = batch
    instant = users is not None and think_s == 0
    if instant:
        batch = math.ceil(users / math.ceil(users / widest))
    elif users is not None:
        batch = min(batch, users)
    t_b = decode_ms(batch)
    cache = PrefixCache(s)
    footprint = e_s - cache.shared_mean + e_o / 2  # a running sequence's KV tokens, its shared prefix apart

    def prefill_of(reused: float) -> float:  # what a prefill computes, attending to the cached tokens too
        new = e_s - reused
        return step.ms(Work(prefill_tokens=round(new), attention=new * (reused + new / 2), chunks=1)) - step.ms(Work())

    def rate_of(prefill: float, n: int = 1) -> float:  # a population's: the interactive response time law
        if users is None:
            return lam
        if not instant:  # X = N / (Z + R)
            return users / (think_s + (prefill + e_o * t_b) / 1000.0)

        # no think time: the replicas are always full, and each decode step is stretched by the
        # share b of the GPU's time the others' prefills take, which the rate sets, b = X·prefill/n:
        # b - X(b)·prefill/n rises with b, one root in [0, 1)
        def rate(b: float) -> float:
            return users / ((prefill + e_o * t_b / (1.0 - b)) / 1000.0)

        b = brentq(lambda b: b - rate(b) * prefill / n / 1000.0, 0.0, 1.0 - 1e-12)
        return rate(b)

    def sized(n: int):
        """The napkin at ``n`` replicas: the prefix cache's hits there (the rate, the
        prefill and the hits each settle the others: a few rounds), the prefill of what
        the cache leaves, the rate, and a replica's throughput."""
        prefill, hit = prefill_of(0.0), None
        rate = rate_of(prefill, n)
        for _ in range(4):
            running = min(rate / n * (e_o * t_b + prefill) / 1000.0, float(cap))  # Little, per replica
            hit = cache.at(n, rate, running, footprint, prefill + e_o * t_b)
            prefill = prefill_of(hit.reused)
            rate = rate_of(prefill, n)
        return hit, prefill, rate, 1000.0 / (e_o * t_b / batch + prefill)

    if instant:  # no think time: the fewest replicas whose share of the users decodes within TPOT
        bare = math.ceil(users / widest)
        got = sized(bare)
    else:  # the fewest that carry the rate with the hits their KV memory keeps, from a bound
        # below: the slowest answers' rate over a replica finding all it could
        most = cache.shared_mean + cache.history_mean if cache.on else 0.0
        bare = max(math.ceil(rate_of(prefill_of(0.0)) * (e_o * t_b / batch + prefill_of(most)) / 1000.0 - 1e-9), 1)
        while math.ceil((got := sized(bare))[2] / got[3] - 1e-9) > bare:
            bare += 1
    hit, prefill, lam, mu = got
    answer_s = (prefill + e_o * t_b) / 1000.0  # a prefill, then E[o] steps at the batch
    padded = math.ceil(bare * (1 + s.napkin.headroom) - 1e-9)
    # Little's law for the running sequences at ``bare`` replicas, self-consistently: each
    # is resident for its prefill and E[o] tokens; with N running a token takes a decode
    # step t(N), stretched by the share of the GPU's time the prompts' prefills take
    lam_r, running = lam / bare / 1000.0, 1.0
    busy_prefill = lam_r * prefill
    stretch = 1.0 / (1.0 - busy_prefill) if busy_prefill < 1 else math.inf

    def tpot(n: float) -> float:
        return decode_ms(max(round(n), 1)) * stretch

    for _ in range(200):
        running = min(lam_r * (e_o * tpot(running) + prefill), float(cap))
    gpu = gpu_spec(w.instance_type) if b.num_blocks is None else None
    lines = [
        Line(
            "peak request rate" if s.traffic.users is None else "request rate",
            "from traffic (rate × the shape's peak)"
            if s.traffic.users is None
            else f"X = N / R: {users:,} users / {users / lam:,.2f} s an answer (no think time: a prefill and "
            f"{e_o:,.0f} steps at batch {batch}, each stretched by the others' prefills, "
            f"{lam / bare:.3g} req/s × {prefill:.3g} ms of a replica's time)"
            if instant
            else f"X = N / (Z + R): {users:,} users / ({think_s:,.1f} s thinking + {answer_s:,.2f} s an "
            f"answer: a prefill and {e_o:,.0f} steps at batch {batch})",
            lam,
            "req/s",
        ),
        Line(
            "mean prompt tokens",
            "E[prompt] of traffic.tokens (shared prefix included"
            + (", and the conversation so far: all computed, no cache)" if s.traffic.tokens.sessions else ")"),
            e_s,
            "tokens",
        ),
        Line("mean output tokens", "E[output] of traffic.tokens", e_o, "tokens"),
        Line(
            "prompt tokens from the prefix cache",
            _cache_formula(s, cache, hit, bare),
            hit.reused,
            "tokens",
        ),
        Line("weights", f"{m.params_b:g} B parameters × {m.weight_bytes:g} bytes", m.weights_total_bytes / 1e9, "GB"),
        Line(
            "KV bytes per token",
            f"2 × {m.layers} layers × {m.kv_heads} KV heads × {m.head_dim} × {m.kv_bytes:g} bytes",
            m.kv_bytes_per_token / 1e3,
            "KB",
        ),
        Line(
            "KV cache per replica",
            f"({gpu.memory_gb:g} GB × {b.gpu_memory_utilization:g} − weights − {b.activations_gb:g} GB activations)"
            f" / KV bytes per token"
            if gpu is not None
            else f"{blocks} blocks × {b.block_size}",
            kv_tokens,
            "tokens",
        ),
        Line(
            "max concurrent sequences",
            f"{kv_tokens:,} / ({e_s:,.0f} + {e_o:,.0f}), at most max_num_seqs {b.max_num_seqs}"
            + ("" if users is None else f" and the {users:,} users"),
            min(concurrent, b.max_num_seqs, users or math.inf),
            "sequences",
        ),
        Line(
            "decode step at the napkin's batch",
            f"step time of {batch} sequences"
            + (
                " (a replica's share of the users)"
                if batch < widest
                else f" (the widest within TPOT {target:g} ms)"
                if target is not None
                else " (the widest that fits)"
            ),
            t_b,
            "ms",
        ),
        Line("output tokens per GPU", f"{batch} / {t_b:.3g} ms", batch / t_b * 1000.0, "tokens/s"),
        Line(
            "prefill of a mean prompt",
            f"{e_s - hit.reused:,.0f} tokens' step time above its fixed cost"
            + (f", attending to {hit.reused:,.0f} cached" if hit.reused >= 0.5 else ""),
            prefill,
            "ms",
        ),
        Line(
            "per-replica throughput",
            f"1 / ({e_o:,.0f} × {t_b:.3g} / {batch} + {prefill:.3g}) ms",
            mu,
            "req/s",
        ),
        Line(
            "replicas",
            f"⌈{users:,} users / {widest} sequences a replica⌉: no think time, so each replica always holds its share"
            if instant
            else f"⌈{lam:,.0f} / {mu:.3g}⌉"
            + (", the fewest whose KV memory keeps those hits" if hit.reused >= 0.5 else ""),
            bare,
            "replicas",
        ),
        Line(
            "share of a replica's time in prefill",
            f"{lam / bare:.3g} req/s × {prefill:.3g} ms",
            busy_prefill,
            "",
        ),
        Line(
            "running sequences per replica",
            f"Little: N = {lam / bare:.3g} req/s × ({e_o:,.0f} × TPOT(N) + {prefill:.3g} ms)",
            running,
            "sequences",
        ),
        Line(
            "time per output token there",
            f"TPOT(N) = t(N = {running:.0f}) / (1 − {busy_prefill:.2f})",
            tpot(running),
            "ms",
        ),
        Line("replicas with headroom", f"⌈{bare} × (1 + {s.napkin.headroom:g})⌉", padded, "replicas"),
        Line(
            "cost with headroom", f"{padded} × ${price_per_worker_hour:.4g}/h", padded * price_per_worker_hour, "USD/h"
        ),
        Line(
            "cost per million output tokens",
            f"${padded * price_per_worker_hour:,.2f}/h / ({lam:,.0f} × {e_o:,.0f} × 3,600)",
            padded * price_per_worker_hour / (lam * e_o * 3600) * 1e6,
            "USD",
        ),
    ]
    if b.disaggregation is None:
        return lines, LLMNapkin(batch, t_b, prefill, mu, bare, padded)
    return _split(s, lines, step, e_s, e_o, batch, t_b, prefill, price_per_worker_hour)


def _cache_formula(s: Scenario, cache: PrefixCache, hit: CacheEstimate, n: int) -> str:
    """How the napkin counts the prefix cache's hits, in words."""
    if not cache.on:
        return "none: the prefix cache is off"
    if hit.reusable <= 0:
        return "none: no prompt shares a prefix"
    what = "its shared prefix" if cache.shared_mean > 0 else ""
    if cache.turns is not None:
        back = "" if cache.routed_back else f", found on the one replica in {n} its next turn lands on"
        what = (what + " and " if what else "") + f"its conversation so far{back}"
    kept = (
        "everything fits"
        if math.isinf(hit.horizon_s)
        else f"an unused block stays {hit.horizon_s:,.1f} s in the {hit.free_tokens:,.0f} tokens {n} replicas "
        "leave free"
    )
    return f"of {hit.reusable:,.0f} reusable ({what}); Che's approximation of LRU: {kept}"


def _split(s: Scenario, lines: list[Line], step, e_s, e_o, batch, t_b, prefill, price) -> tuple[list[Line], LLMNapkin]:
    """The napkin of prefill and decode on separate replicas (DistServe's planning): a
    prefill replica computes prompts back to back, full steps of ``max_num_batched_tokens``
    sharing a step's fixed cost; a decode replica runs the napkin's batch without pauses;
    each side is counted apart, with its headroom."""
    from simulator.serving.step_time import Work

    b, lam, head = s.batching, peak_rate(s), s.napkin.headroom
    fixed = step.ms(Work())
    per_step = max(1, b.max_num_batched_tokens // max(round(e_s), 1))
    mu_p = 1000.0 / (prefill + fixed / per_step)
    mu_d = 1000.0 * batch / (e_o * t_b)
    n_p, n_d = (math.ceil(lam / mu - 1e-9) for mu in (mu_p, mu_d))
    pad_p, pad_d = (math.ceil(n * (1 + head) - 1e-9) for n in (n_p, n_d))
    d = b.disaggregation
    transfer = d.kv_transfer_ms + e_s * b.spec.kv_bytes_per_token / (d.kv_transfer_gb_s * 1e9) * 1000.0
    colocated = {"per-replica throughput", "replicas", "share of a replica's time in prefill"}
    colocated |= {"running sequences per replica", "time per output token there", "replicas with headroom"}
    colocated |= {"cost with headroom", "cost per million output tokens"}
    padded = pad_p + pad_d
    lines = [ln for ln in lines if ln.quantity not in colocated] + [
        Line("prompts per prefill step", f"{b.max_num_batched_tokens:,} / {e_s:,.0f}", per_step, "prompts"),
        Line("prefill replica throughput", f"1 / ({prefill:.3g} + {fixed:.3g} / {per_step}) ms", mu_p, "req/s"),
        Line("decode replica throughput", f"{batch} / ({e_o:,.0f} × {t_b:.3g} ms)", mu_d, "req/s"),
        Line("prefill replicas", f"⌈{lam:,.0f} / {mu_p:.3g}⌉", n_p, "replicas"),
        Line("decode replicas", f"⌈{lam:,.0f} / {mu_d:.3g}⌉", n_d, "replicas"),
        Line(
            "KV transfer of a mean prompt",
            f"{d.kv_transfer_ms:g} ms + {e_s:,.0f} × {b.spec.kv_bytes_per_token / 1e3:.4g} KB"
            f" / {d.kv_transfer_gb_s:g} GB/s",
            transfer,
            "ms",
        ),
        Line("replicas with headroom", f"⌈{n_p} × (1 + {head:g})⌉ + ⌈{n_d} × (1 + {head:g})⌉", padded, "replicas"),
        Line("cost with headroom", f"{padded} × ${price:.4g}/h", padded * price, "USD/h"),
        Line(
            "cost per million output tokens",
            f"${padded * price:,.2f}/h / ({lam:,.0f} × {e_o:,.0f} × 3,600)",
            padded * price / (lam * e_o * 3600) * 1e6,
            "USD",
        ),
    ]
    return lines, LLMNapkin(batch, t_b, prefill, lam / (n_p + n_d), n_p + n_d, padded)

"""The rules of a scenario that span its sections: an LLM fleet's (what it serves, what it
does not combine with yet, what fits its KV cache) and a front end's event loop's.

Each is a pure function of a validated :class:`~simulator.scenario.config.Scenario` that
raises ``ValueError`` naming the field it refuses (the loader turns that into the field's
YAML line); :class:`~simulator.scenario.config.Scenario` calls them as validators.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simulator.scenario.llm import ContinuousBatching, LinearStep, gpu_spec

if TYPE_CHECKING:
    from simulator.scenario.config import Scenario

STATEFUL = ("least_loaded", "prefix_affinity", "scored")  # balancing that reads the replicas' state


def llm_rules(s: Scenario) -> None:
    """The rules an LLM fleet (``batching.kind continuous``) keeps across sections, and the
    LLM-only fields a batch fleet refuses; a ``ValueError`` naming the field where one breaks."""
    b, w, t = s.batching, s.workers, s.traffic
    if not isinstance(b, ContinuousBatching):
        if s.router.balancing in STATEFUL:
            raise ValueError(
                f"router.balancing {s.router.balancing} reads LLM replicas' state: it needs batching.kind continuous"
            )
        if s.sla.ttft_ms is not None or s.sla.tpot_ms is not None:
            raise ValueError("sla.ttft_ms and sla.tpot_ms judge LLM requests: they need batching.kind continuous")
        if t.tokens is not None:
            raise ValueError("traffic.tokens describes LLM requests: it needs batching.kind continuous")
        if w.autoscaler is not None and w.autoscaler.metric == "ttft_ms":
            raise ValueError(
                "workers.autoscaler.metric ttft_ms reads LLM replicas' first tokens: it needs batching.kind "
                "continuous (p99_ms is a batch queue's latency)"
            )
        if w.service_time is None:
            raise ValueError("workers.service_time is required (how long a batch takes on a worker)")
        if w.mix:
            raise ValueError("workers.mix is for LLM replicas (batching.kind continuous) yet")
        return
    if t.tokens is None:
        raise ValueError("batching.kind continuous serves tokens: traffic.tokens gives their lengths")
    if w.service_time is not None:
        raise ValueError("workers.service_time is a batch time; an LLM engine has batching.step_time instead")
    reasons = [
        (bool(t.classes), "traffic.classes"),
        (s.router.canary is not None or s.router.shadow is not None, "router.canary and router.shadow"),
        (s.preprocess.event_loop is not None, "preprocess.event_loop"),
        (s.preprocess.relay is not None, "preprocess.relay"),
        (w.failures is not None, "workers.failures"),
        (s.router.activator is not None, "router.activator"),
        *(
            reason
            for name, a in b.autoscalers(w)
            if a is not None
            for reason in (
                (a.metric == "p99_ms", f"{name}.metric p99_ms"),
                (a.scrape_delay_s > 0, f"{name}.scrape_delay_s"),
                (a.min_replicas < 1, f"{name}.min_replicas 0"),
            )
        ),
        (s.router.balancing == "shared", "router.balancing shared (the router picks a replica)"),
        (w.instances > 1, "workers.instances above 1 (a worker is one replica)"),
    ]
    found = [why for cond, why in reasons if cond]
    if found:
        raise ValueError(f"batching.kind continuous does not combine with {', '.join(found)} yet")
    if w.mix:
        if isinstance(b.step_time, LinearStep):
            raise ValueError(
                "workers.mix: batching.step_time is fitted on one GPU; a mixed fleet steps by each GPU's "
                "roofline (drop step_time)"
            )
        for gpu in w.mix:
            try:
                gpu_spec(gpu)
            except ValueError:
                raise ValueError(f"workers.mix.{gpu}: no GPU preset for {gpu!r}") from None
    d = b.disaggregation
    if d is not None:
        if d.prefill_replicas >= w.count:
            raise ValueError(
                f"batching.disaggregation.prefill_replicas ({d.prefill_replicas}) leaves no decode replica "
                f"of workers.count {w.count}"
            )
        if w.autoscaler is not None:
            raise ValueError(
                "workers.autoscaler: prefill and decode apart, each pool scales on its own: "
                "use batching.disaggregation.decode_autoscaler (and prefill_autoscaler)"
            )
        starts = (d.prefill_replicas, w.count - d.prefill_replicas)
        for (name, a), start, pool in zip(b.autoscalers(w), starts, ("prefill", "decode"), strict=True):
            if a is not None and start > a.max_replicas:
                raise ValueError(
                    f"{name}.max_replicas ({a.max_replicas}) is under the {start} {pool} replicas the fleet starts with"
                )
    blocks = min(b.blocks(gpu) for gpu in (w.instance_type, *w.mix))  # the smallest replica's
    if b.max_num_seqs > blocks:
        raise ValueError(
            f"batching.max_num_seqs ({b.max_num_seqs}) exceeds the {blocks} KV blocks of a replica: "
            "every running sequence holds at least one block"
        )
    if t.tokens.from_trace:
        if t.arrivals_file is None:
            raise ValueError("traffic.tokens.from_trace replays traffic.arrivals_file: give the trace there")
        return  # the trace's lengths are checked once it is read (the loader)
    prompt, output = t.tokens.lengths()
    room = blocks * b.block_size
    for name, lengths in (("prompt", prompt), ("output", output)):
        if math.isinf(lengths.upper):
            raise ValueError(
                f"traffic.tokens.{name} has no max: a draw could exceed the KV cache "
                f"({room} tokens); set traffic.tokens.{name}.max"
            )
    prefix = t.tokens.prefix.tokens if t.tokens.prefix is not None else 0
    longest = prompt.upper + prefix + output.upper  # a request's prompt and answer, at most
    longest_prompt = prompt.upper + prefix
    sessions = t.tokens.sessions
    if sessions is not None:
        if sessions.max_context_tokens is not None:
            if longest > sessions.max_context_tokens:
                raise ValueError(
                    f"traffic.tokens.sessions.max_context_tokens ({sessions.max_context_tokens}) is below a "
                    f"first turn's prompt and answer ({longest:.0f} tokens at most)"
                )
            longest = sessions.max_context_tokens
            longest_prompt = longest - output.min
            grown = f"max_context_tokens ({longest})"
        else:  # every turn carries the ones before it
            longest = prefix + sessions.turns.upper * (prompt.upper + output.upper)
            longest_prompt = longest - output.upper
            grown = f"a session of {sessions.turns.upper:.0f} turns ({longest:.0f} tokens)"
        if longest > room:
            raise ValueError(
                f"traffic.tokens.sessions: {grown} is more than the KV cache of a replica holds "
                f"({blocks} blocks of {b.block_size} = {room} tokens); set a smaller "
                "traffic.tokens.sessions.max_context_tokens"
            )
    if longest > room:
        raise ValueError(
            f"traffic.tokens.prompt: a prompt of {longest_prompt:.0f} and an answer of "
            f"{output.upper:.0f} tokens can never fit the KV cache of a replica "
            f"({blocks} blocks of {b.block_size} = {room} tokens)"
        )
    if b.policy == "prefill_first" and longest_prompt > b.max_num_batched_tokens:
        raise ValueError(
            f"batching.max_num_batched_tokens ({b.max_num_batched_tokens}) is below the longest prompt "
            f"({longest_prompt:.0f}): prefill_first prefills whole prompts"
        )
    if sessions is not None and t.arrivals_file is not None:
        raise ValueError("traffic.tokens.sessions start as a Poisson process: drop traffic.arrivals_file")
    if sessions is not None and sessions.instant():  # every answer must take a step's time at least
        failing = s.features.lookups_per_request > 0 and s.features.on_timeout == "fail"
        for on, what in ((s.caches.result is not None, "caches.result"), (failing, "features.on_timeout fail")):
            if on:
                raise ValueError(
                    f"traffic.tokens.sessions.turn_gap can be 0 ms, and {what} answers without a replica's "
                    f"step, as soon as it likes: a user could send again at the same instant; give turn_gap a "
                    f"think time above 0, or drop {what}"
                )


def event_loop_rules(s: Scenario) -> None:
    """What a front end's event loop (``preprocess.event_loop``) or a relay combines with,
    and what the loop's own fields need of the rest; a ``ValueError`` naming the field."""
    if s.preprocess.event_loop is None and s.preprocess.relay is None:
        return
    reasons = [
        (s.workers.dynamic, "workers.autoscaler and workers.failures"),
        (bool(s.traffic.classes), "traffic.classes"),
        (s.router.canary is not None or s.router.shadow is not None, "router.canary and router.shadow"),
        (s.workers.count > 1 and s.router.balancing != "shared", "a batch queue per worker"),
        (s.batching.timeout_ms is not None or s.batching.deadline_ms is not None,
         "batching.timeout_ms and deadline_ms"),
    ]  # fmt: skip
    found = [why for cond, why in reasons if cond]
    name = "preprocess.event_loop" if s.preprocess.event_loop is not None else "preprocess.relay"
    if found:
        raise ValueError(
            f"{name} models front ends feeding one batch queue; it does not combine with {', '.join(found)} yet"
        )
    if s.preprocess.event_loop is None:
        return
    f = s.features
    if s.preprocess.event_loop.resume_ms is not None:
        awaits = [
            (f.lookups_per_request == 0, "features.lookups_per_request above 0 (a fetch to await)"),
            (f.store is not None, "no features.store (the loop is the station)"),
            (f.on_timeout == "fail", "features.on_timeout: default (a failed fetch leaves its handler)"),
        ]  # fmt: skip
        need = [why for cond, why in awaits if cond]
        if need:
            raise ValueError(f"preprocess.event_loop.resume_ms awaits the feature fetch: it needs {'; '.join(need)}")
    if s.preprocess.event_loop.reads_first and s.preprocess.event_loop.resume_ms is None:
        raise ValueError(
            "preprocess.event_loop.reads_first puts reads before the resumptions of awaited fetches: "
            "it needs preprocess.event_loop.resume_ms (a handler that awaits its fetch)"
        )
    if s.preprocess.event_loop.reads_first_ms is not None and not s.preprocess.event_loop.reads_first:
        raise ValueError(
            "preprocess.event_loop.reads_first_ms bounds how long reads go before a resumption: "
            "it needs preprocess.event_loop.reads_first: true"
        )
    if s.preprocess.event_loop.return_time is not None and s.preprocess.event_loop.return_ms > 0:
        raise ValueError(
            "preprocess.event_loop.return_time draws the hand-back's time per batch in place of return_ms: "
            "set one of them"
        )
    if s.preprocess.event_loop.timer_late is not None and s.batching.max_queue_delay_ms <= 0:
        raise ValueError(
            "preprocess.event_loop.timer_late delays the batching window's timer: it needs a window "
            "(batching.max_queue_delay_ms above 0; without one a batch goes at once, with no timer)"
        )

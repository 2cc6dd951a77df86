"""vLLM V1's scheduler (``batching.policy: continuous``): chunked prefill, prefill and
decode mixed in one step.

A step's token budget is ``max_num_batched_tokens``. The *running* sequences go first, in
the order they were admitted: each takes the tokens it still has to compute (one for a
decode; a prompt's next chunk, capped by ``long_prefill_token_threshold``) within the
budget. A sequence that needs a KV block when none is free preempts the last running
sequence (or itself, when it is the last), by recompute: its blocks are freed (their
content kept in the prefix cache while it lasts) and it goes to the front of the waiting
queue. Then, if nobody was preempted, *waiting* requests are admitted first come, first
served while the budget, ``max_num_seqs`` and the free blocks last; the first that does
not fit stops admission. A prompt longer than what is left of the budget is prefilled in
chunks over several steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from simulator.serving.llm_replica import Replica
    from simulator.serving.llm_types import Limits, Seq


class ChunkedPrefill:
    """vLLM V1's policy for one replica (see the module)."""

    keeps_slots = False
    in_arrival_order = False
    finishes_in_stretch = True

    def step(self, rep: Replica) -> None:
        lim, kv = rep.limits, rep.kv
        budget = lim.max_num_batched_tokens
        cap = lim.long_prefill_token_threshold
        running, waiting = rep.running, rep.waiting
        scheduled: list[tuple[Seq, int]] = []
        preempted = False
        tables, bs = kv.tables, lim.block_size
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = s.prompt + s.made - s.computed
            if cap and n > cap:
                n = cap
            if n > budget:
                n = budget
            if -(-(s.computed + n) // bs) <= len(tables[s.rid]):  # its blocks hold them (most decodes)
                scheduled.append((s, n))
                budget -= n
                i += 1
                continue
            while kv.allocate(s.rid, s.computed + n) is None:
                victim = running.pop()
                rep.preempt(victim)
                preempted = True
                if victim is s:
                    break
            else:
                scheduled.append((s, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            while waiting and budget > 0 and len(running) < lim.max_num_seqs:
                s = waiting[0]
                total = s.prompt + s.made
                hit = s.ready or (kv.cached_prefix(s.keys, total) if s.eager else 0)
                n = total - hit
                if cap and n > cap:
                    n = cap
                n = min(n, budget)
                if rep.admit(s, hit + n) is None:
                    break
                running.append(s)
                scheduled.append((s, n))
                budget -= n
        if not scheduled:
            if not preempted:  # nothing fits an empty replica (validation refuses such requests)
                rep.refuse_head()
            return  # everything running was preempted: admission comes next
        rep.run_step(scheduled)

    def decodes_all(self, rep: Replica) -> bool:
        # anyone waiting may be admitted; a budget under a token a sequence decodes some
        return not rep.waiting and len(rep.running) <= rep.limits.max_num_batched_tokens

    def width(self, decodes: int) -> int:
        return decodes

    def refuse(self, prompt: np.ndarray, limits: Limits) -> None:
        return None  # a prompt of any length is prefilled in chunks


__all__ = ["ChunkedPrefill"]

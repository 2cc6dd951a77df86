"""vLLM v0's scheduler (0.1.7, as in DistServe's runs; ``batching.policy: prefill_first``):
a step either prefills or decodes, never both, and prefills go first.

A step prefills whole prompts of waiting requests, first come, first served, while their
tokens fit ``max_num_batched_tokens``, the sequences ``max_num_seqs`` and the blocks stay
above a watermark (1% of them) kept free at admission. With nothing to prefill it decodes
every running sequence one token, in arrival order; a decode that needs a block preempts
the latest arrival not yet given its slot in the step. A preempted sequence grown past
what one prefill may hold can never come back: it is dropped (vLLM's ``ignored``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simulator.serving.llm_replica import Replica
    from simulator.serving.llm_types import Limits, Seq


class PrefillFirst:
    """vLLM v0's policy for one replica with ``limits`` (see the module)."""

    keeps_slots = False
    in_arrival_order = True
    finishes_in_stretch = False

    def __init__(self, limits: Limits):
        self.keep_free = int(limits.watermark * limits.num_blocks)  # blocks kept free at admission

    def step(self, rep: Replica) -> None:
        lim, kv = rep.limits, rep.kv
        running, waiting = rep.running, rep.waiting
        batch: list[tuple[Seq, int]] = []
        tokens = 0
        while waiting:
            s = waiting[0]
            length = s.prompt + s.made
            if length > lim.max_num_batched_tokens:  # a preempted sequence grown past any prefill
                waiting.popleft()
                rep.settle(s, ignored=True)
                continue
            if tokens + length > lim.max_num_batched_tokens or len(running) + len(batch) >= lim.max_num_seqs:
                break
            hit = kv.cached_prefix(s.keys, length) if s.eager else 0
            if kv.blocks_for(length) - hit // lim.block_size > kv.free_blocks - self.keep_free:
                break
            got = rep.admit(s, length)
            if got is None:
                break
            batch.append((s, length - got))
            tokens += length
        if batch:
            running.extend(s for s, _ in batch)
            rep.run_step(batch)
            return
        if not running:  # the head does not fit an empty replica above the watermark
            rep.refuse_head()
            return
        rep.decode_all()

    def decodes_all(self, rep: Replica) -> bool:
        return not rep.waiting  # a prefill would go first

    def width(self, decodes: int) -> int:
        return decodes

    def refuse(self, prompt: np.ndarray, limits: Limits) -> None:
        over = np.flatnonzero(prompt > limits.max_num_batched_tokens)
        if len(over):
            i = int(over[0])
            raise ValueError(
                f"request {i}: a {int(prompt[i])}-token prompt is over max_num_batched_tokens "
                f"{limits.max_num_batched_tokens}: it can never be prefilled"
            )


__all__ = ["PrefillFirst"]

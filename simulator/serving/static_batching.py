"""Request-level batching (``batching.policy: static``), as FasterTransformer serves.

Up to ``max_num_seqs`` requests are admitted only when the replica is empty, as many as
the KV cache holds, and prefilled together; the batch then decodes until the *last* of
them is done. A finished sequence keeps its slot (the batch is computed at its full
width) until then. It is here to teach what continuous batching buys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from simulator.serving.llm_replica import Replica
    from simulator.serving.llm_types import Limits, Seq


class StaticBatching:
    """Request-level batches for one replica (see the module)."""

    keeps_slots = True
    in_arrival_order = True
    finishes_in_stretch = False

    def __init__(self) -> None:
        self.batch_width = 0  # the batch's width while it lasts

    def step(self, rep: Replica) -> None:
        lim = rep.limits
        waiting = rep.waiting
        if not rep.running:  # a new batch: as many as fit the KV cache, prefilled together
            batch: list[tuple[Seq, int]] = []
            while waiting and len(batch) < lim.max_num_seqs:
                s = waiting[0]
                length = s.prompt + s.made
                got = rep.admit(s, length)
                if got is None:
                    break
                batch.append((s, length - got))
            if not batch:
                rep.refuse_head()
                return
            self.batch_width = len(batch)
            rep.running.extend(s for s, _ in batch)
            rep.run_step(batch, width=self.batch_width)
            return
        rep.decode_all(width=self.batch_width)

    def decodes_all(self, rep: Replica) -> bool:
        return True  # nobody is admitted while a batch runs: those waiting wait for its end

    def width(self, decodes: int) -> int:
        return self.batch_width

    def refuse(self, prompt: np.ndarray, limits: Limits) -> None:
        return None


__all__ = ["StaticBatching"]

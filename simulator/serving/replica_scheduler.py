"""Who computes what in an LLM replica's next step: one Protocol, one module per policy.

A replica (:class:`~simulator.serving.llm_replica.Replica`) owns the clock, the KV cache
and the mechanics of a step (admitting a sequence, preempting one, running a step and
settling what it finished); its scheduler only decides. Each policy
(``batching.policy``) is its own module, as Vidur keeps its schedulers:

- ``continuous`` (:mod:`simulator.serving.chunked_prefill`): vLLM V1, chunked prefill,
  prefill and decode mixed in one step;
- ``prefill_first`` (:mod:`simulator.serving.prefill_first`): vLLM v0 as DistServe ran
  it, a step prefills or decodes, prefills first;
- ``static`` (:mod:`simulator.serving.static_batching`): request-level batches, as
  FasterTransformer serves.

The step's time is the step-time model's business (:mod:`simulator.serving.step_time`),
which never decides who joins a step. A new policy is one module, one ``case`` here and
one member of the scenario's :data:`~simulator.scenario.llm.Policy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, get_args

from simulator.scenario.llm import Policy
from simulator.serving.chunked_prefill import ChunkedPrefill
from simulator.serving.prefill_first import PrefillFirst
from simulator.serving.static_batching import StaticBatching

if TYPE_CHECKING:
    import numpy as np

    from simulator.serving.llm_replica import Replica
    from simulator.serving.llm_types import Limits

POLICIES: tuple[str, ...] = get_args(Policy)  # the scenario's batching.policy, each a case below


class ReplicaScheduler(Protocol):
    """A replica's batching policy.

    Attributes
    ----------
    keeps_slots : bool
        A finished sequence keeps its slot in the steps until its batch is done (the step
        is computed at the batch's width).
    in_arrival_order : bool
        A decode step takes the running sequences in arrival order (else in the order they
        were admitted).
    finishes_in_stretch : bool
        A decode-only stretch (:func:`~simulator.serving.decode_stretch.decode_stretch`)
        may end with the step in which the first sequences finish: with nobody waiting,
        that step is a decode step like the others.
    """

    keeps_slots: bool
    in_arrival_order: bool
    finishes_in_stretch: bool

    def step(self, rep: Replica) -> None:
        """Form the replica's next step from its running and waiting sequences and run it
        (:meth:`Replica.run_step`); or, when none can be formed, preempt or refuse what
        must go."""

    def decodes_all(self, rep: Replica) -> bool:
        """Whether the replica's next step decodes every running sequence and does nothing
        else, so long as each of them is decoding: False when it could be anything else (a
        waiting request admitted, a token budget too small for all)."""

    def width(self, decodes: int) -> int:
        """The width a decode step of ``decodes`` sequences is computed at."""

    def refuse(self, prompt: np.ndarray, limits: Limits) -> None:
        """Raise ValueError, naming the first, for a prompt this policy can never serve
        (beyond what no replica can: see :func:`simulator.serving.llm_serve.refuse`)."""


def replica_scheduler(policy: str, limits: Limits) -> ReplicaScheduler:
    """A fresh scheduler of ``policy`` for one replica with ``limits``."""
    match policy:
        case "continuous":
            return ChunkedPrefill()
        case "prefill_first":
            return PrefillFirst(limits)
        case "static":
            return StaticBatching()
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")


__all__ = ["POLICIES", "ReplicaScheduler", "replica_scheduler"]

"""The scheduler of ``batching.kind: continuous``: a pool of LLM replicas, each an engine
stepping token by token over its paged KV cache (:class:`~simulator.serving.llm_replica.Replica`).

Behind the one :class:`~simulator.serving.scheduler.Scheduler` seam: requests come with
their work (prompt and output tokens, prefix group) and the replica the router picked;
each replica steps up to the horizon of what is known, so chunks take the same steps as
one whole run. A replica's steps are its batches (start, end, sequences in the step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.ledger import BatchLog, Outcome, Served, concat_logs
from simulator.rng import child
from simulator.scenario.llm import ContinuousBatching
from simulator.serving.llm_replica import Limits, Replica, StepModel, group_key, step_model
from simulator.serving.served import Settled, TokensServed


class Noise:
    """A replica's multiplicative step-time noise: log-normal with mean 1 and ``cv``,
    drawn from its own stream in buffers (the same factors whatever the chunks)."""

    def __init__(self, cv: float, rng: np.random.Generator, buffer: int = 4096):
        s2 = math.log1p(cv * cv)
        self.mu, self.sigma = -s2 / 2, math.sqrt(s2)
        self.rng, self.buffer = rng, buffer
        self.values = np.zeros(0)
        self.at = 0  # the next factor's place in values

    def _fill(self, k: int) -> None:
        while len(self.values) - self.at < k:
            self.values = np.concatenate([self.values[self.at :], self.rng.lognormal(self.mu, self.sigma, self.buffer)])
            self.at = 0

    def __call__(self) -> float:
        self._fill(1)
        self.at += 1
        return float(self.values[self.at - 1])

    def peek(self, k: int) -> np.ndarray:
        """The next ``k`` factors, not taken yet."""
        self._fill(k)
        return self.values[self.at : self.at + k]

    def consume(self, k: int) -> None:
        """Take the next ``k`` factors (those :meth:`peek` showed)."""
        self._fill(k)
        self.at += k


@dataclass(frozen=True)
class LLMService:
    """What a pool's replicas are: the step time, the engine's limits and policy, and the
    stream their step noise comes from (a child per replica)."""

    step: StepModel
    limits: Limits
    policy: str
    noise_cv: float
    rng: np.random.Generator
    balancing: str = "round_robin"  # the state-reading ones route in Replicas.extend
    weights: tuple[float, float, float] = (2.0, 1.0, 1.0)  # scored: prefix, queue, kv
    speed: object | None = None  # the platform's SpeedProcess: replica k steps on its worker(k) path

    @classmethod
    def of(
        cls, batching: ContinuousBatching, instance_type: str, rng: np.random.Generator, router=None, speed=None
    ) -> LLMService:
        limits = Limits(
            num_blocks=batching.blocks(instance_type),
            block_size=batching.block_size,
            max_num_batched_tokens=batching.max_num_batched_tokens,
            max_num_seqs=batching.max_num_seqs,
            long_prefill_token_threshold=batching.long_prefill_token_threshold,
            prefix_caching=batching.enable_prefix_caching,
        )
        extra = {"speed": speed}
        if router is not None:
            w = router.weights
            extra |= {"balancing": router.balancing, "weights": (w.prefix, w.queue, w.kv)}
        return cls(step_model(batching, instance_type), limits, batching.policy, batching.noise_cv, rng, **extra)

    def replica(self, k: int) -> Replica:
        noise = Noise(self.noise_cv, child(self.rng, k)) if self.noise_cv > 0 else None
        path = None if self.speed is None else self.speed.worker(k)
        return Replica(self.policy, self.step, self.limits, noise, speed=path)


class Replicas:
    """The :class:`~simulator.serving.scheduler.Scheduler` of ``kind: continuous``: one
    replica per queue (``instances[k]`` holds its one global id)."""

    def __init__(self, batching: ContinuousBatching, instances: list[list[int]], service: LLMService):
        if any(len(i) != 1 for i in instances):
            raise ValueError("an LLM replica is one instance: workers.instances must be 1")
        self.replicas = [service.replica(k) for k in range(len(instances))]
        self.instance = [i[0] for i in instances]
        self.horizon = -math.inf
        self.balancing, self.weights = service.balancing, service.weights
        self.block_size = service.limits.block_size
        # the prefix groups each replica has been sent and not yet finished (llm-d's index
        # of routed prefixes: a group in flight there will be cached there)
        self.in_flight: list[dict[int, int]] = [{} for _ in self.replicas]
        self.group_of: dict[int, tuple[int, int]] = {}  # request -> (replica, group) while in flight

    def extend(self, t, rid, queue, deadlines, horizon, work=None) -> None:
        """Requests reaching the replicas at ``t`` (time order), each on replica ``queue``
        (None: picked here from the replicas' state as of the request's time), with
        ``work``: prompt tokens, output tokens, prefix group (-1: none) and its shared
        prefix tokens."""
        if len(t):
            if work is None:
                raise ValueError("an LLM replica needs each request's tokens")
            prompt, output, group, shared = work
            routed = queue is None and len(self.replicas) > 1
            for i in range(len(t)):
                g, at = int(group[i]), float(t[i])
                if routed:
                    k = self._pick(at, g, int(shared[i]), int(prompt[i]))
                else:
                    k = 0 if queue is None else int(queue[i])
                self.replicas[k].push(
                    int(rid[i]), at, int(prompt[i]), int(output[i]), None if g < 0 else g, int(shared[i])
                )
                if g >= 0:
                    held = self.in_flight[k]
                    held[g] = held.get(g, 0) + 1
                    self.group_of[int(rid[i])] = (k, g)
        self.horizon = max(self.horizon, horizon)

    def _pick(self, t: float, group: int, shared: int, prompt: int) -> int:
        """The replica a request reaching the pool at ``t`` goes to, by ``balancing``, from
        each replica's state after the steps it started before ``t``."""
        for rep in self.replicas:
            rep.advance(t)
        self._forget_finished()
        load = [len(r.pending) + len(r.waiting) + len(r.running) for r in self.replicas]
        k_least = min(range(len(load)), key=load.__getitem__)
        if self.balancing == "least_loaded":
            return k_least
        hit = [self._hit(k, group, shared) / prompt for k in range(len(self.replicas))] if group >= 0 else None
        if self.balancing == "prefix_affinity":
            if hit is None:
                return k_least
            return min(range(len(load)), key=lambda k: (-hit[k], load[k], k))
        wp, wq, wk = self.weights
        top = max(load) or 1
        score = [
            (wp * hit[k] if hit is not None else 0.0) + wq * (1.0 - load[k] / top) + wk * (1.0 - r.kv.usage)
            for k, r in enumerate(self.replicas)
        ]
        return max(range(len(score)), key=lambda k: (score[k], -k))

    def _hit(self, k: int, group: int, shared: int) -> int:
        """Prompt tokens of ``group``'s prefix replica ``k`` holds or will hold: the whole
        prefix while a request of the group is in flight there, else its cached blocks."""
        if self.in_flight[k].get(group):
            return shared
        cached = self.replicas[k].kv.cached
        blocks = shared // self.block_size
        j = 0
        while j < blocks and group_key(group, j) in cached:
            j += 1
        return j * self.block_size

    def _forget_finished(self) -> None:
        for rep in self.replicas:
            for rid in rep.just_finished():
                held = self.group_of.pop(rid, None)
                if held is not None:
                    k, g = held
                    left = self.in_flight[k][g] - 1
                    if left:
                        self.in_flight[k][g] = left
                    else:
                        del self.in_flight[k][g]

    def close(self) -> None:
        self.horizon = math.inf

    def run(self) -> Settled:
        ids, served, tokens, logs = [], [], [], []
        for rep in self.replicas:
            rep.advance(self.horizon)
        self._forget_finished()
        for k, rep in enumerate(self.replicas):
            f = rep.finished()
            n = len(f.rid)
            inst = self.instance[k]
            if n:
                outcome = np.where(f.ignored, np.int8(Outcome.REJECTED), np.int8(Outcome.COMPLETED)).astype(np.int8)
                ids.append(f.rid)
                served.append(
                    Served(
                        t_dispatch=f.start,
                        t_done=f.done,
                        batch_size=np.ones(n, dtype=np.int64),
                        instance=np.full(n, inst, dtype=np.int64),
                        outcome=outcome,
                        t_dropped=np.where(f.ignored, f.start, np.nan),
                    )
                )
                tokens.append(TokensServed(f.first_token, f.preemptions, f.cached_tokens, f.max_itl))
            steps = rep.step_log()
            if len(steps.start):
                inst_col = np.full(len(steps.start), inst, np.int64)
                logs.append(BatchLog(steps.start, steps.end, steps.seqs, inst_col, steps.kv_usage))
        if not logs:  # an LLM pool's log always says its KV use, even with no step
            logs = [BatchLog(*BatchLog.empty().__dict__.values())]
            logs[0].kv_usage = np.zeros(0)
        if not ids:
            empty = np.zeros(0)
            return Settled(
                np.zeros(0, np.int64),
                Served.empty(0),
                concat_logs(logs),
                TokensServed(empty, np.zeros(0, np.int64), np.zeros(0, np.int64), empty),
            )
        return Settled(
            np.concatenate(ids),
            Served(*(np.concatenate(c) for c in zip(*served, strict=True))),
            concat_logs(logs),
            TokensServed(*(np.concatenate(c) for c in zip(*tokens, strict=True))),
        )


__all__ = ["LLMService", "Noise", "Replicas"]

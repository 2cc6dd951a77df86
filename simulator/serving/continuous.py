"""The scheduler of ``batching.kind: continuous``: a pool of LLM replicas, each an engine
stepping token by token over its paged KV cache (:class:`~simulator.serving.llm_replica.Replica`).

Behind the one :class:`~simulator.serving.scheduler.Scheduler` seam: requests come with
their work (prompt and output tokens, prefix group) and the replica the router picked;
each replica steps up to the horizon of what is known, so chunks take the same steps as
one whole run. A replica's steps are its batches (start, end, sequences in the step).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields, replace

import numpy as np

from simulator.ledger import BatchLog, Outcome, Served, TokenGaps, concat_logs
from simulator.rng import child
from simulator.scenario.llm import ContinuousBatching
from simulator.serving.lives import FleetLog, Worker
from simulator.serving.llm_replica import Replica
from simulator.serving.llm_routing import PrefixRouter
from simulator.serving.llm_scaling import Scaling, WarmNodes, settle
from simulator.serving.llm_types import GROUP_KEYS_ABOVE, Finished, Limits
from simulator.serving.served import Settled, TokensServed
from simulator.serving.step_time import Noise, StepModel, step_model, token_step_floor_ms


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
    workers: object | None = None  # the scenario's workers section, where it autoscales
    # prefill and decode apart: the prefill replicas (the first ones), and a prompt's KV
    # transfer time, ms: fixed + per prompt token
    prefill_replicas: int = 0
    transfer_ms: tuple[float, float] = (0.0, 0.0)
    link_queues: bool = True  # each prefill replica's link sends one prompt's KV at a time
    pool_autoscalers: tuple = (None, None)  # the prefill pool's and the decode pool's, where apart
    # a mixed fleet (workers.mix): each replica's step time and limits, by its GPU type
    kinds: tuple[tuple[StepModel, Limits], ...] = ()

    @classmethod
    def of(
        cls,
        batching: ContinuousBatching,
        instance_type: str,
        rng: np.random.Generator,
        router=None,
        speed=None,
        workers=None,
    ) -> LLMService:
        limits = Limits(
            num_blocks=batching.blocks(instance_type),
            block_size=batching.block_size,
            max_num_batched_tokens=batching.max_num_batched_tokens,
            max_num_seqs=batching.max_num_seqs,
            long_prefill_token_threshold=batching.long_prefill_token_threshold,
            prefix_caching=batching.enable_prefix_caching,
        )
        extra = {"speed": speed, "workers": workers}
        d = batching.disaggregation
        if d is not None:
            per_token = batching.spec.kv_bytes_per_token / (d.kv_transfer_gb_s * 1e9) * 1000.0
            extra |= {
                "prefill_replicas": d.prefill_replicas,
                "transfer_ms": (d.kv_transfer_ms, per_token),
                "link_queues": d.kv_link == "per_prefill_replica",
                "pool_autoscalers": (d.prefill_autoscaler, d.decode_autoscaler),
            }
        if router is not None:
            w = router.weights
            extra |= {"balancing": router.balancing, "weights": (w.prefix, w.queue, w.kv)}
        if workers is not None and workers.mix:
            types = workers.types()
            extra["kinds"] = tuple(
                (step_model(batching, t), replace(limits, num_blocks=batching.blocks(t))) for t in types
            )
        return cls(step_model(batching, instance_type), limits, batching.policy, batching.noise_cv, rng, **extra)

    def replica(self, k: int) -> Replica:
        noise = Noise(self.noise_cv, child(self.rng, k)) if self.noise_cv > 0 else None
        path = None if self.speed is None else self.speed.worker(k)
        step, limits = self.kinds[k] if k < len(self.kinds) else (self.step, self.limits)
        rep = Replica(self.policy, step, limits, noise, speed=path)
        if self.balancing in ("scored", "prefix_affinity"):  # the router reads the groups' cached runs
            rep.kv.watch_above = GROUP_KEYS_ABOVE
        return rep


LOOKAHEAD_STEPS = 1024  # a replica's next steps whose noise bounds a closed loop's chunk (Replicas.least_step)


class Replicas:
    """The :class:`~simulator.serving.scheduler.Scheduler` of ``kind: continuous``: one
    replica per queue (``instances[k]`` holds its one global id)."""

    def __init__(self, batching: ContinuousBatching, instances: list[list[int]], service: LLMService):
        if any(len(i) != 1 for i in instances):
            raise ValueError("an LLM replica is one instance: workers.instances must be 1")
        self.service = service
        self.replicas = [service.replica(k) for k in range(len(instances))]
        self.instance = [i[0] for i in instances]
        self.horizon = -math.inf
        self.prefill = service.prefill_replicas
        n = len(self.replicas)
        # the replicas new requests go to (the prefill ones where prefill and decode are
        # apart), and the decode ones: each pool fixed or under its own autoscaler
        self.front, self.back = list(range(self.prefill or n)), list(range(self.prefill, n * bool(self.prefill)))
        self.scalings = self._scalings(service)
        self.fleet = self.scalings[0].log if self.scalings else None
        self.routing = PrefixRouter(service, len(self.replicas))  # the router's view: what each replica holds
        self._unborn: dict[int, Replica] = {}  # replicas an autoscaler may add next, made ahead (least_step)
        # prefill and decode apart: the ``front`` replicas prefill (each request asked
        # for one token there, its real answer kept in ``asked``); what they finish moves to a
        # decode replica (``moving``: arrival time, id, prompt, output), keeping what its
        # prefill left (``prefilled``); a one-token answer settles where it was prefilled
        self.asked: dict[int, tuple[int, int]] = {}
        self.moving: list[tuple[float, int, int, int]] = []
        self.prefilled: dict[int, tuple] = {}
        self.settled_here: dict[int, list[Finished]] = {}  # each prefill replica's, since the last run
        self.link_free: dict[int, float] = {}  # when each prefill replica's link is next free

    def _scalings(self, service: LLMService) -> list[Scaling]:
        """The autoscalers: ``workers.autoscaler`` for a pool doing both, or, prefill and
        decode apart, each pool's own (the prefill pool's evaluated first at a shared
        instant); one fleet log and one warm pool for all."""
        w = service.workers
        if w is None:
            return []
        pools = [(w.autoscaler, self.front, "")]
        if self.prefill:
            pre, dec = service.pool_autoscalers
            pools = [(pre, self.front, "prefill"), (dec, self.back, "decode")]
        if all(a is None for a, _, _ in pools):
            return []
        pool = {k: name for _, ids, name in pools for k in ids}
        gpu = w.types()  # the replicas the fleet starts with; the autoscalers add workers.instance_type
        log = FleetLog([Worker(k, 0.0, 0.0, None, pool=pool[k], gpu=gpu[k]) for k in range(len(self.replicas))])
        nodes = WarmNodes(w.cold_start.warm_pool)
        # the cold starts of a pool doing both or of the decode pool: stream 2^20 + 1; the prefill pool's: + 2
        cold = {"": 1, "decode": 1, "prefill": 2}
        scalings = [
            Scaling(a, w.cold_start, child(service.rng, (1 << 20) + cold[name]), log, ids, nodes, name, w.instance_type)
            for a, ids, name in pools
            if a is not None
        ]
        for sc in scalings:
            for k in sc.ids:
                sc.watch(self.replicas[k])
        return scalings

    def extend(self, t, rid, queue, deadlines, horizon, work=None) -> None:
        """Requests reaching the replicas at ``t`` (time order), each on replica ``queue``
        (None: picked here from the replicas' state as of the request's time), with
        ``work``: prompt tokens, output tokens, prefix group (-1: none), its shared prefix
        tokens, and (with sessions) its session (-1: none) and the prompt tokens that are
        its session's earlier turns."""
        if len(t):
            if work is None:
                raise ValueError("an LLM replica needs each request's tokens")
            prompt, output, group, shared, *rest = work
            session, history = rest if rest and rest[0] is not None else (None, None)
            routed = queue is None and (len(self.front) > 1 or bool(self.scalings))
            for i in range(len(t)):
                g, at = int(group[i]), float(t[i])
                sid = -1 if session is None else int(session[i])
                if self.scalings:
                    self._control(at, inclusive=True)
                if routed:
                    past = 0 if history is None else int(history[i])
                    k = self._pick(at, g, int(shared[i]), int(prompt[i]), sid, past)
                else:
                    k = 0 if queue is None else int(queue[i])
                asked = int(output[i])
                if self.prefill:  # a prefill replica makes the first token; the rest is decoded elsewhere
                    self.asked[int(rid[i])] = (asked, int(prompt[i]))
                    asked = 1
                self.replicas[k].push(int(rid[i]), at, int(prompt[i]), asked, None if g < 0 else g, int(shared[i]), sid)
                self.routing.sent(k, int(rid[i]), g, sid)
        self.horizon = max(self.horizon, horizon)

    def _pick(self, t: float, group: int, shared: int, prompt: int, session: int = -1, history: int = 0) -> int:
        """The replica a request reaching the pool at ``t`` goes to (:meth:`PrefixRouter.pick`),
        among those serving then."""
        ks = self._serving(self.front, t)
        return self.routing.pick(ks, self.replicas, t, group, shared, prompt, session, history)

    def _serving(self, pool: list[int], t: float) -> list[int]:
        """The replicas of ``pool`` (``front`` or ``back``) serving at ``t``."""
        for sc in self.scalings:
            if sc.ids is pool:
                return sc.serving(t)
        return pool

    def _hand_over(self, until: float) -> None:
        """The prefill replicas' finished requests: a one-token answer (or a dropped
        request) settles where it was prefilled; every other request's prompt KV leaves
        for a decode replica when its first token is out and arrives a transfer later.
        With ``link_queues`` a prefill replica's link sends one prompt's KV at a time, in the
        order the first tokens came (``kv_transfer_ms`` is latency on top, not link time).
        The arrivals before ``until`` (every one that can come before it is known once the
        prefill replicas ran the steps that start before it) are handed to the serving
        decode replica with the fewest sequences at that time, in time order."""
        fixed, per_token = self.service.transfer_ms
        for k in self.front:
            f = self.replicas[k].finished()
            here = np.ones(len(f.rid), dtype=bool)
            for i, rid in enumerate(f.rid.tolist()):
                output, prompt = self.asked.pop(rid)
                if f.ignored[i] or output <= 1:
                    continue
                here[i] = False
                self.prefilled[rid] = (f.start[i], f.first_token[i], f.preemptions[i], f.cached_tokens[i], f.max_itl[i])
                sent = float(f.first_token[i])
                if self.service.link_queues:
                    sent = max(sent, self.link_free.get(k, -math.inf))
                    self.link_free[k] = sent + per_token * prompt
                heapq.heappush(self.moving, (sent + per_token * prompt + fixed, rid, prompt, output))
            self.settled_here.setdefault(k, []).append(Finished(*(getattr(f, x.name)[here] for x in fields(Finished))))
        while self.moving and self.moving[0][0] < until:
            at, rid, prompt, output = heapq.heappop(self.moving)
            decode = self._serving(self.back, at)
            for j in decode:
                self.replicas[j].advance(at)
            j = min(decode, key=lambda j: (self._load(j), j))
            self.replicas[j].push(rid, at, prompt, output, first_token=float(self.prefilled[rid][1]))

    def _prefilled_here(self, k: int) -> Finished:
        """What prefill replica ``k`` settled itself since the last run (its part of the
        requests, empty or not)."""
        parts = self.settled_here.pop(k)  # one at least: the run hands over before it settles
        if len(parts) == 1:
            return parts[0]
        return Finished(*(np.concatenate([getattr(p, x.name) for p in parts]) for x in fields(Finished)))

    def _load(self, k: int) -> int:
        r = self.replicas[k]
        return len(r.pending) + len(r.waiting) + len(r.running)

    def _decoded(self, f: Finished) -> Finished:
        """A decode replica's finished requests with what their prefill left: when it
        started, the first token, preemptions on either side, the prompt tokens its prefix
        cache served, and the worst gap between tokens (the transfer's included)."""
        if not len(f.rid):
            return f
        before = [self.prefilled.pop(rid) for rid in f.rid.tolist()]
        start, first, pre, cached, stall = (np.array(c) for c in zip(*before, strict=True))
        return Finished(
            f.rid, start, first, f.done, f.preemptions + pre, cached, f.ignored, np.maximum(f.max_itl, stall)
        )

    def _advance(self, t: float) -> None:
        """Every replica through the steps that start before ``t``; prefill and decode
        apart, the prefill replicas first and what they hand over before ``t`` on."""
        if self.prefill:
            for k in self.front:
                self.replicas[k].advance(t)
            self._forget_finished()
            self._hand_over(t)
        for rep in self.replicas:
            rep.advance(t)
        self._forget_finished()

    def _control(self, t: float, *, inclusive: bool) -> None:
        """The autoscalers' evaluations due before ``t`` (at ``t`` too when ``inclusive``:
        a request arriving at an evaluation's instant comes after it), each on the
        replicas' state after the steps they started before it; pools due at one instant
        in the order of :meth:`_scalings`."""
        while True:
            at = min(sc.next_ms for sc in self.scalings)
            if not (at < t or (inclusive and at == t)):
                return
            self._advance(at)
            for sc in self.scalings:
                if sc.next_ms != at:
                    continue
                for k in sc.evaluate(at, self.replicas):  # the replicas it asked for (ids in order)
                    made = self._unborn.pop(k, None)
                    self.replicas.append(self.service.replica(k) if made is None else made)
                    sc.watch(self.replicas[k])
                    self.instance.append(k)
                    self.routing.in_flight.append({})
                settle(sc.log, range(len(sc.log.workers)), self.replicas, sc.nodes, final=False)

    def _forget_finished(self) -> None:
        self.routing.forget(self.replicas)

    def answer_floors(self) -> dict[int, float]:
        """Each session with a turn on a replica: the earliest that turn can settle there,
        read between chunks from the replica's state. Its next step starts at the
        replica's clock or later, it makes at most one of the turn's tokens, and none
        takes less than the least step that makes a token times that step's noise factor
        (the replica's next ones, drawn already) and the host's fastest speed; nor does
        any request settle before the replica's quiet time (:attr:`Replica.quiet_until`).
        A request pushed later only delays those it finds. A session not here may settle
        as soon as the next step."""
        out = {}
        for k, rep in enumerate(self.replicas):
            held = self.routing.in_flight[k]
            if not any(key < 0 for key in held):
                continue
            quiet = rep.quiet_until if math.isfinite(rep.quiet_until) else -math.inf
            turns = []  # (session, tokens still to make)
            for seq in (*rep.pending, *rep.waiting, *rep.running):
                routed = self.routing.group_of.get(seq.rid)
                if routed is not None and routed[1][-1] < 0:  # a session's key comes last
                    turns.append((-routed[1][-1] - 1, max(seq.output - seq.made, 1)))
            if not turns:
                continue
            floor = token_step_floor_ms(rep.step) * (1.0 if rep.speed is None else float(rep.speed.f.min()))
            longest = max(r for _, r in turns)
            steps = np.cumsum(rep.noise.peek(longest)) if rep.noise is not None else np.arange(1.0, longest + 1)
            for session, r in turns:
                out[session] = max(quiet, rep.t + floor * float(steps[r - 1]))
        return out

    def least_step(self, lo: float) -> tuple[float, float]:
        """``(least, until)``: every step a replica starts from ``lo`` on, among its next
        :data:`LOOKAHEAD_STEPS`, takes at least ``least`` ms (the least step that makes a
        token, times the least of those steps' noise factors, drawn already, and the
        host's fastest speed), so an answer a step gives a turn that reached the pool at
        ``t`` comes at ``t + least`` or later. The replicas an evaluation due at ``lo`` may
        add are counted (made ahead: their factors are their own stream's first ones).
        ``until`` is where that stops holding: the first time a replica could have taken
        more steps than were looked at, or the evaluation after ``lo`` (a replica it adds
        has factors not looked at)."""
        born = len(self.replicas)
        unborn = range(born, born + sum(sc.cfg.max_replicas for sc in self.scalings))
        for k in unborn:  # what an evaluation at ``lo`` can add: made now, kept for it
            if k not in self._unborn:
                self._unborn[k] = self.service.replica(k)
        least = math.inf
        for rep in (*self.replicas, *(self._unborn[k] for k in unborn)):
            floor = token_step_floor_ms(rep.step) * (1.0 if rep.speed is None else float(rep.speed.f.min()))
            if rep.noise is not None:
                floor *= float(rep.noise.peek(LOOKAHEAD_STEPS).min())
            least = min(least, floor)
        until = lo + LOOKAHEAD_STEPS * least
        for sc in self.scalings:  # those due at ``lo`` run in the chunk; the next one ends it
            until = min(until, sc.next_ms if sc.next_ms > lo else sc.next_ms + sc.period_ms)
        return least, until

    def close(self) -> None:
        self.horizon = math.inf

    def run(self) -> Settled:
        ids, served, tokens, logs = [], [], [], []
        if self.scalings:
            if math.isinf(self.horizon):  # no request will come: evaluations while any replica works
                while self.moving or any(r.busy for r in self.replicas):
                    self._control(min(sc.next_ms for sc in self.scalings), inclusive=True)
            else:
                self._control(self.horizon, inclusive=False)
        self._advance(self.horizon)
        if self.fleet is not None:
            settle(
                self.fleet,
                range(len(self.fleet.workers)),
                self.replicas,
                self.scalings[0].nodes,
                final=math.isinf(self.horizon),
            )
        for k, rep in enumerate(self.replicas):  # every replica's part, empty or not: one shape
            f, steps = rep.finished(), rep.step_log()
            if self.prefill:
                f = self._prefilled_here(k) if k in self.front else self._decoded(f)
            n, inst = len(f.rid), self.instance[k]
            ids.append(f.rid)
            served.append(
                Served(
                    t_dispatch=f.start,
                    t_done=f.done,
                    batch_size=np.ones(n, dtype=np.int64),
                    instance=np.full(n, inst, dtype=np.int64),
                    outcome=np.where(f.ignored, Outcome.REJECTED, Outcome.COMPLETED).astype(np.int8),
                    t_dropped=np.where(f.ignored, f.start, np.nan),
                )
            )
            tokens.append(TokensServed(f.first_token, f.preemptions, f.cached_tokens, f.max_itl))
            inst_col = np.full(len(steps.start), inst, np.int64)
            gaps = TokenGaps.of(rep.token_gaps())
            logs.append(
                BatchLog(steps.start, steps.end, steps.seqs, inst_col, steps.kv_usage, steps.prefill_share, gaps=gaps)
            )
        return Settled(
            np.concatenate(ids),
            Served(*(np.concatenate(c) for c in zip(*served, strict=True))),
            concat_logs(logs),
            TokensServed(*(np.concatenate(c) for c in zip(*tokens, strict=True))),
        )


__all__ = ["LLMService", "Replicas"]

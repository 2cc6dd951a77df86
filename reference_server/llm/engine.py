"""The engine: a scheduler of vLLM V1's kind over :class:`~.blocks.BlockManager`, and the
step loop over :class:`~.model.TinyDecoder`.

Each :meth:`Engine.step`:

1. schedules, within ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences:
   the *running* sequences first, in the order they were admitted, each the tokens it still
   has to compute (one for a decode; a prompt's next chunk, at most
   ``long_prefill_token_threshold`` when set); a sequence that needs a block when none is
   free preempts the last running one (or itself), by recompute: its blocks are released
   (their full blocks stay in the prefix cache while they last) and it goes back to the
   front of the waiting queue. Then, if nobody was preempted, *waiting* requests are
   admitted first come, first served while the budget, the sequences and the blocks last;
   the first that does not fit stops admission;
2. runs the model once over every scheduled token (chunked prefills and decodes mixed);
3. samples (greedily) the next token of each sequence whose known tokens are all computed;
   a request ends when it has ``max_tokens`` tokens (EOS is ignored, as vLLM's
   ``ignore_eos``, so a load generator controls the output lengths).

It records each step's work and time (:class:`StepRecord`: what the simulator's step-time
model is fitted on) and each request's times (arrival, first scheduled, first and last
token), on ``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for every process).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from reference_server.llm.blocks import BlockManager, block_hashes
from reference_server.llm.model import DecoderConfig, PagedKV, Scheduled, TinyDecoder


@dataclass(frozen=True)
class EngineConfig:
    """The engine's limits (vLLM's flags of the same names) and its model."""

    model: DecoderConfig = field(default_factory=DecoderConfig)
    num_blocks: int = 512
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    long_prefill_token_threshold: int = 0  # most tokens of one prompt in a step (0: no cap)
    enable_prefix_caching: bool = True
    device: str = "cpu"

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be at least 0")
        if self.max_num_seqs > self.num_blocks:
            raise ValueError(f"max_num_seqs {self.max_num_seqs} is more than the {self.num_blocks} KV blocks")

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt and output) the engine takes."""
        return min(self.model.max_model_len, self.capacity_tokens)


@dataclass
class Request:
    rid: str
    prompt: list[int]
    max_tokens: int
    arrival_ns: int
    tokens: list[int] = field(init=False)  # prompt and output so far
    computed: int = 0  # tokens whose KV is in the cache
    hashes: list[int] = field(default_factory=list)  # chained hashes of its full blocks known so far
    committed: int = 0  # of its blocks, those handed to the prefix cache
    received_ns: int = 0  # when the engine took it in
    scheduled_ns: int = 0  # first scheduled
    first_ns: int = 0
    last_ns: int = 0
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens served by the prefix cache at its first admission

    def __post_init__(self):
        self.tokens = list(self.prompt)

    @property
    def made(self) -> int:
        return len(self.tokens) - len(self.prompt)


@dataclass
class StepRecord:
    """One step's work and times: prompt (or recomputed) tokens in chunks, their attention
    work Σ p·(ctx + p/2), decoding sequences and their context; when the engine's loop
    began the step (``begin_ns``: before it read its pipe and scheduled), the forward pass
    (``start_ns`` to ``end_ns``, and the CPU time the engine's thread spent in it,
    ``cpu_ns``: short of the wall time when the thread lost its core), and when the loop was
    done with it (``done_ns``: its tokens sent; 0 outside the engine's process). A step's
    whole cost to the requests in it is ``done_ns - begin_ns``: what the simulator's step
    time stands for."""

    begin_ns: int
    start_ns: int
    end_ns: int
    prefill_tokens: int
    chunks: int
    attention: float
    decodes: int
    decode_context: int
    running: int
    waiting: int
    done_ns: int = 0
    cpu_ns: int = 0


@dataclass(frozen=True)
class Token:
    """A token produced for request ``rid`` at ``t_ns``; ``finished`` on its last, with the
    request's timings."""

    rid: str
    token: int
    t_ns: int
    finished: bool = False
    info: dict | None = None


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.model = TinyDecoder(cfg.model, cfg.device)
        self.kv = PagedKV(cfg.model, cfg.num_blocks, cfg.block_size, cfg.device)
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size, prefix_caching=cfg.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.preemptions = 0
        self.steps: list[StepRecord] = []
        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else None
        self._sync = sync or (lambda: None)

    # --- input ----------------------------------------------------------------
    def check(self, prompt: list[int], max_tokens: int) -> str | None:
        """Why a request cannot be served (None: it can)."""
        if not prompt:
            return "the prompt is empty"
        if max_tokens < 1:
            return f"max_tokens must be at least 1, not {max_tokens}"
        if len(prompt) + max_tokens > self.cfg.max_model_len:
            return (
                f"the prompt's {len(prompt)} tokens and max_tokens {max_tokens} exceed the engine's "
                f"{self.cfg.max_model_len}-token limit"
            )
        return None

    def add(self, rid: str, prompt: list[int], max_tokens: int, arrival_ns: int | None = None) -> None:
        why = self.check(prompt, max_tokens)
        if why:
            raise ValueError(why)
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already in the engine")
        now = time.perf_counter_ns()
        r = Request(rid, list(prompt), max_tokens, arrival_ns or now, received_ns=now)
        r.hashes = block_hashes(r.tokens, self.cfg.block_size)
        self.requests[rid] = r
        self.waiting.append(r)

    def abort(self, rid: str) -> None:
        r = self.requests.pop(rid, None)
        if r is None:
            return
        if r in self.running:
            self.running.remove(r)
            self.blocks.release(rid)
        elif r in self.waiting:
            self.waiting.remove(r)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    # --- the step -------------------------------------------------------------
    def _schedule(self) -> list[tuple[Request, int]]:
        cfg, bm = self.cfg, self.blocks
        budget, cap = cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(len(r.tokens) - r.computed, budget)
            if cap:
                n = min(n, cap)
            while not bm.grow(r.rid, r.computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            else:
                scheduled.append((r, n))
                budget -= n
                i += 1
                continue
            break
        while not preempted and self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            hit = bm.lookup(r.hashes, len(r.tokens))
            n = min(len(r.tokens) - len(hit) * cfg.block_size, budget)
            if cap:
                n = min(n, cap)
            got = bm.admit(r.rid, r.hashes, len(r.tokens), len(hit) * cfg.block_size + n)
            if got is None:
                break
            self.waiting.popleft()
            r.computed = got
            r.committed = got // cfg.block_size  # those blocks are the cache's already
            if r.preemptions == 0 and r.made == 0:
                r.cached_tokens = got
            self.running.append(r)
            scheduled.append((r, n))
            budget -= n
        return scheduled

    def _preempt(self, r: Request) -> None:
        self.blocks.release(r.rid)
        r.computed = r.committed = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def step(self, begin_ns: int | None = None) -> list[Token]:
        """One step: schedule, run the model, sample. Returns the tokens it produced.
        ``begin_ns``: when the caller's loop began the step (default: now)."""
        begin_ns = begin_ns or time.perf_counter_ns()
        preempted = self.preemptions
        scheduled = self._schedule()
        if not scheduled:  # everything running was preempted: the next step admits them again
            if self.waiting and not self.running and self.preemptions == preempted:
                raise RuntimeError(f"request {self.waiting[0].rid} fits no empty engine (check() lets none in)")
            return []
        cfg, kv = self.cfg, self.kv
        ids, pos, seqs = [], [], []
        prefill = chunks = decodes = context = 0
        attention = 0.0
        for r, n in scheduled:
            c = r.computed
            table = self.blocks.tables[r.rid]
            ids.extend(r.tokens[c : c + n])
            pos.extend(range(c, c + n))
            slots = torch.tensor(kv.slots(table, 0, c + n), device=self.model.device)
            seqs.append(Scheduled(len(ids) - n, n, c, slots, c + n == len(r.tokens)))
            if r.made and n == 1 and c == len(r.tokens) - 1:
                decodes += 1
                context += c + 1
            else:
                prefill += n
                chunks += 1
                attention += n * (c + n / 2.0)
        device = self.model.device
        t0 = time.perf_counter_ns()
        c0 = time.thread_time_ns()
        for r, _ in scheduled:
            if not r.scheduled_ns:
                r.scheduled_ns = t0
        logits = self.model.step(torch.tensor(ids, device=device), torch.tensor(pos, device=device), seqs, kv)
        picks = torch.argmax(logits, dim=-1).tolist()
        self._sync()
        t1 = time.perf_counter_ns()
        cpu_ns = time.thread_time_ns() - c0
        waiting = len(self.waiting)
        record = StepRecord(
            begin_ns, t0, t1, prefill, chunks, attention, decodes, context, len(self.running), waiting, cpu_ns=cpu_ns
        )
        self.steps.append(record)
        out: list[Token] = []
        bs = cfg.block_size
        k = 0
        for (r, n), s in zip(scheduled, seqs, strict=True):
            r.computed += n
            if s.sample:
                token = picks[k]
                k += 1
                r.tokens.append(token)
                if len(r.tokens) % bs == 0:  # its last block is known: hashed
                    r.hashes.extend(block_hashes(r.tokens, bs, r.hashes[-1] if r.hashes else None, len(r.hashes)))
                if not r.first_ns:
                    r.first_ns = t1
                r.last_ns = t1
            full = min(r.computed // bs, len(r.hashes))
            if full > r.committed:
                self.blocks.commit(r.rid, r.hashes[r.committed : full], r.committed)
                r.committed = full
            if s.sample:
                done = r.made >= r.max_tokens
                if done:
                    self.running.remove(r)
                    self.blocks.release(r.rid)
                    del self.requests[r.rid]
                out.append(Token(r.rid, token, t1, done, self._info(r) if done else None))
        return out

    def _info(self, r: Request) -> dict:
        return {
            "arrival_ns": r.arrival_ns,
            "received_ns": r.received_ns,
            "scheduled_ns": r.scheduled_ns,
            "first_ns": r.first_ns,
            "last_ns": r.last_ns,
            "prompt_tokens": len(r.prompt),
            "generation_tokens": r.made,
            "preemptions": r.preemptions,
            "cached_tokens": r.cached_tokens,
        }

    def gauges(self) -> dict:
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_usage": self.blocks.usage,
            "preemptions": self.preemptions,
            "prefix_hits": self.blocks.hits,
            "prefix_queries": self.blocks.queries,
        }

    def run_all(self) -> dict[str, list[int]]:
        """Step until every request is done; each request's output tokens (offline use,
        tests)."""
        outs: dict[str, list[int]] = {rid: [] for rid in self.requests}
        while self.busy:
            for t in self.step():
                outs.setdefault(t.rid, []).append(t.token)
        return outs

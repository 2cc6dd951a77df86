"""The simulator's LLM replica against the real engine's scheduler (issue 30): two
implementations written apart (``simulator/serving/llm_replica.py`` over
``simulator/serving/kv_cache.py``, ``reference_server/llm/engine.py`` over
``reference_server/llm/blocks.py``), given the same requests on the same clock, take the
same steps: the same prompt tokens and decodes in every step, the same sequences
running, the same preemptions and prefix-cache hits for every request, the same times.

The engine runs its real model (a small one: the tokens it samples only name the blocks
the prefix cache hashes) on a virtual clock that advances by the simulator's step time of
each step's work, so both sides see arrivals at the same points between steps."""

from __future__ import annotations

import numpy as np
import pytest

from reference_server.llm.engine import Engine, EngineConfig
from reference_server.llm.model import DecoderConfig
from simulator.serving.llm_replica import Replica
from simulator.serving.llm_types import Limits
from simulator.serving.step_time import LinearStepTime, Work

SMALL = DecoderConfig(width=32, layers=1, heads=2, ffn=64, max_model_len=1024)
STEP = LinearStepTime(c0_ms=1.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.3, kv_ms_per_token=0.001)
SHARED = 40  # a group's shared prefix: two whole blocks of 16 and half of the third


def _workload(rng: np.random.Generator, n: int, rate_per_ms: float, groups: int) -> list[dict]:
    """``n`` requests at ``rate_per_ms`` (Poisson; 0: all at once), prompts of 8-400 tokens
    (at least ``SHARED`` + 8 in a group), 2-80 output tokens; with ``groups``, half of them
    open with their group's shared prefix."""
    prefixes = [rng.integers(1, 256, SHARED).tolist() for _ in range(groups)]
    at = np.cumsum(rng.exponential(1.0 / rate_per_ms, n)) if rate_per_ms else np.zeros(n)
    out = []
    for i in range(n):
        prompt = int(np.clip(rng.gamma(2.0, 60.0), 8, 400))
        group = int(rng.integers(groups)) if groups and rng.random() < 0.5 else -1
        if group >= 0:
            prompt = max(prompt, SHARED + 8)
            tokens = prefixes[group] + rng.integers(1, 256, prompt - SHARED).tolist()
        else:
            tokens = rng.integers(1, 256, prompt).tolist()
        output = int(np.clip(rng.gamma(2.0, 15.0), 2, 80))
        out.append({"at": float(at[i]), "tokens": tokens, "output": output, "group": group})
    return out


def _engine(cfg: EngineConfig, reqs: list[dict]):
    """The engine over ``reqs`` on a virtual clock (ms): each step takes :data:`STEP`'s time
    of its work. Returns its steps (start, end, prompt tokens, decodes, sequences in the
    step, running), each request's (preemptions, cached tokens, output tokens, first and
    last token's time), and the engine."""
    e = Engine(cfg)
    t, i, steps, done, first = 0.0, 0, [], {}, {}
    while i < len(reqs) or e.busy:
        while i < len(reqs) and reqs[i]["at"] <= t:
            e.add(str(i), reqs[i]["tokens"], reqs[i]["output"])
            i += 1
        if not e.busy:
            t = reqs[i]["at"]
            continue
        before = len(e.steps)
        tokens = e.step()
        if len(e.steps) == before:  # everything running was preempted: no step ran
            continue
        r = e.steps[-1]
        work = Work(r.prefill_tokens, r.attention, r.chunks, r.decodes, r.decode_context)
        end = t + STEP.ms(work)
        steps.append((t, end, r.prefill_tokens, r.decodes, r.chunks + r.decodes, r.running))
        t = end
        for tok in tokens:
            first.setdefault(tok.rid, t)
            if tok.finished:
                info = tok.info
                made = info["generation_tokens"]
                done[int(tok.rid)] = (info["preemptions"], info["cached_tokens"], made, first[tok.rid], t)
    return np.array(steps), done, e


def _replica(cfg: EngineConfig, reqs: list[dict]):
    lim = Limits(cfg.num_blocks, cfg.block_size, cfg.max_num_batched_tokens, cfg.max_num_seqs, prefix_caching=True)
    rep = Replica("continuous", STEP, lim)
    for i, r in enumerate(reqs):
        g = r["group"]
        rep.push(i, r["at"], len(r["tokens"]), r["output"], None if g < 0 else g, SHARED if g >= 0 else 0)
    rep.advance()
    s, f = rep.step_log(), rep.finished()
    steps = np.column_stack([s.start, s.end, s.prefill_tokens, s.decodes, s.seqs, s.running])
    done = {
        int(k): (int(p), int(c), float(a), float(b))
        for k, p, c, a, b in zip(f.rid, f.preemptions, f.cached_tokens, f.first_token, f.done, strict=True)
    }
    return steps, done


@pytest.mark.parametrize(
    ("rate_per_ms", "groups", "blocks", "max_seqs"),
    [(0.0, 0, 96, 32), (0.1, 0, 96, 32), (0.1, 3, 128, 32), (0.1, 3, 512, 6)],
    ids=["all-at-once", "poisson", "poisson-shared-prefixes", "sequences-bound"],
)
def test_the_simulators_replica_takes_the_engines_steps(rate_per_ms, groups, blocks, max_seqs):
    reqs = _workload(np.random.default_rng(7), 100, rate_per_ms, groups)
    cfg = EngineConfig(SMALL, num_blocks=blocks, block_size=16, max_num_batched_tokens=256, max_num_seqs=max_seqs)
    got, finished, engine = _engine(cfg, reqs)
    want, settled = _replica(cfg, reqs)
    if max_seqs < 32:  # the sequences' limit binds, not the blocks
        assert engine.preemptions == 0
        assert got[:, 5].max() == max_seqs
    else:  # KV-bound: the tight part of both schedulers is exercised
        assert engine.preemptions > 0
    if groups:
        assert engine.blocks.hits > 0
    assert got.shape == want.shape
    np.testing.assert_array_equal(got[:, 2:], want[:, 2:])  # tokens, decodes, sequences, running
    np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=1e-12)  # the same clock
    assert sorted(finished) == sorted(settled) == list(range(len(reqs)))
    assert {k: v[:2] for k, v in finished.items()} == {k: v[:2] for k, v in settled.items()}  # preemptions, hits
    assert all(v[2] == reqs[k]["output"] for k, v in finished.items())
    times = np.array([finished[k][3:] for k in sorted(finished)])
    np.testing.assert_allclose(times, np.array([settled[k][2:] for k in sorted(settled)]), rtol=1e-12)
    engine.blocks.check()

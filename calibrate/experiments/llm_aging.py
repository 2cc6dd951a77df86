"""Does the engine slow down as its process ages? Three engine processes on the same core:
two aged by ``AGE_S`` of a varied overload (requests of random lengths arriving faster
than it serves them: the knee's churn of allocations), one of them with its heap
collected and trimmed after (``malloc_trim``), and one fresh. Then, in turns of one
second each, both run the same fixed forward (26 decoding sequences of 296 tokens) on
their own model and cache; the ratio of their medians, turn by turn, cancels the host's
drift (minutes) that a before/after comparison would carry.

    python calibrate/experiments/llm_aging.py [AGE_S] [TURNS]   # about 6 minutes
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import numpy as np

D, CTX = 26, 295


def worker(conn, core: int, age_s: float, trim: bool = False, age_core: int | None = None) -> None:
    os.sched_setaffinity(0, {core if age_core is None else age_core})
    import torch

    from reference_server.llm.engine import Engine, EngineConfig
    from reference_server.llm.model import Scheduled

    torch.set_num_threads(1)
    engine = Engine(EngineConfig(num_blocks=512, block_size=16, max_num_batched_tokens=512, max_num_seqs=64))
    rng = np.random.default_rng(os.getpid())
    t_end, k = time.monotonic() + age_s, 0
    while time.monotonic() < t_end:  # the knee's churn: a queue that never empties
        while len(engine.waiting) < 50:
            n = int(np.clip(rng.gamma(2.8, 256 / 2.8), 8, 1024))
            engine.add(f"a{k}", rng.integers(1, 256, n).tolist(), int(np.clip(rng.gamma(2.8, 64 / 2.8), 2, 256)))
            k += 1
        engine.step()
    for rid in list(engine.requests):
        engine.abort(rid)
    engine.steps.clear()
    if trim:  # the heap given back and collected: is it the allocator's state?
        import ctypes
        import gc

        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    os.sched_setaffinity(0, {core})
    model, kv = engine.model, engine.kv
    nb = -(-(CTX + 1) // 16)
    seqs = [Scheduled(i, 1, CTX, torch.tensor(kv.slots(list(range(i * nb, (i + 1) * nb)), 0, CTX + 1)), True)
            for i in range(D)]  # fmt: skip
    tokens, positions = torch.randint(0, 256, (D,)), torch.full((D,), CTX)
    conn.send("ready")
    while conn.recv():
        times, t_end = [], time.monotonic() + 1.0
        while time.monotonic() < t_end:
            t0 = time.perf_counter_ns()
            model.step(tokens, positions, seqs, kv)
            times.append((time.perf_counter_ns() - t0) / 1e6)
        conn.send(float(np.median(times)))


def main(age_s: float, turns: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    # the two aged ones age side by side (a core each), then the fresh one is built
    for age, trim, age_core in ((age_s, False, cores[0]), (age_s, True, core), (0.0, False, None)):
        a, b = ctx.Pipe()
        p = ctx.Process(target=worker, args=(b, core, age, trim, age_core), daemon=True)
        p.start()
        procs.append(p)
        conns.append(a)
        if age == 0.0:
            for c in conns:
                assert c.recv() == "ready"
    ratios, trimmed = [], []
    try:
        for t in range(turns):
            order = np.random.default_rng(t).permutation(3)
            got = {}
            for i in order:
                conns[i].send(True)
                got[i] = conns[i].recv()
            ratios.append(got[0] / got[2])
            trimmed.append(got[1] / got[2])
            print(f"turn {t}: aged {got[0]:.3f} ms, aged and trimmed {got[1]:.3f}, fresh {got[2]:.3f}", flush=True)  # noqa: T201
    finally:
        for c in conns:
            c.send(False)
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    for name, v in (("aged", ratios), ("aged and trimmed", trimmed)):
        r = np.log(v)
        lo, hi = np.exp(np.mean(r) + np.array([-2, 2]) * np.std(r, ddof=1) / np.sqrt(len(r)))
        print(f"{name} / fresh: {np.exp(np.mean(r)):.3f} (mean of {len(r)} turns in log; ±2 s.e. {lo:.3f}-{hi:.3f})")  # noqa: T201


if __name__ == "__main__":
    args = sys.argv[1:]
    main(float(args[0]) if args else 150.0, int(args[1]) if len(args) > 1 else 60)

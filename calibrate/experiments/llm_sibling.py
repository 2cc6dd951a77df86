"""How much does work on the other core slow the engine's forward? The tiny model's
forward (1 sequence of 300 tokens; 26 decoding sequences of 295) on the last core, alone
and beside a process on the first core that spins, serializes JSON, or streams through
memory (three turns each, medians of 40 forwards).

    python calibrate/experiments/llm_sibling.py   # about a minute
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import torch

from reference_server.llm.model import DecoderConfig, PagedKV, Scheduled, TinyDecoder

LOADS = {
    "idle": None,
    "python-spin": "while True: pass",
    "python-json": "import json\nd = {'a': list(range(200))}\nwhile True: json.loads(json.dumps(d))",
    "memory": "import numpy as np\na = np.ones(64 * 2**20 // 8)\nwhile True: a.sum()",
}


def main() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    os.sched_setaffinity(0, {cores[-1]})
    torch.set_num_threads(1)
    cfg = DecoderConfig()
    model, kv = TinyDecoder(cfg), PagedKV(cfg, 512, 16)
    kv.k.normal_()
    kv.v.normal_()

    def bench(d: int, ctx: int, reps: int = 40) -> float:
        nb = -(-(ctx + 1) // 16)
        tables = [list(range(i * nb, (i + 1) * nb)) for i in range(d)]
        seqs = [Scheduled(i, 1, ctx, torch.tensor(kv.slots(t, 0, ctx + 1)), True) for i, t in enumerate(tables)]
        tokens, positions = torch.randint(0, 256, (d,)), torch.full((d,), ctx)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            model.step(tokens, positions, seqs, kv)
            times.append(time.perf_counter_ns() - t0)
        return float(np.median(times)) / 1e6

    res: dict[str, list] = {k: [] for k in LOADS}
    for _ in range(3):
        for name, code in LOADS.items():
            pin = f"import os; os.sched_setaffinity(0, {{{cores[0]}}})\n"
            p = subprocess.Popen([sys.executable, "-c", pin + code]) if code else None
            try:
                time.sleep(0.3)
                res[name].append((bench(1, 300), bench(26, 295)))
            finally:
                if p is not None:
                    p.kill()
                    p.wait()
    idle = np.median(np.array(res["idle"]), axis=0)
    for name, v in res.items():
        m = np.median(np.array(v), axis=0)
        one, many = f"{m[0]:.3f} ms ({m[0] / idle[0]:.2f}x)", f"{m[1]:.3f} ms ({m[1] / idle[1]:.2f}x)"
        print(f"{name:12s} 1 sequence {one}  26 sequences {many}")  # noqa: T201


if __name__ == "__main__":
    main()

"""Does this machine slow down under sustained load (a burst budget, heat) or stay put?
The tiny model's forward at a fixed knee-like shape (26 decoding sequences of 296 tokens)
back to back on one core for ``MINUTES``, while a second process keeps the other core busy
(as a calibration's front end and load generator do); the median forward of every 10 s.

    python calibrate/experiments/llm_sustained.py [MINUTES]   # 6 by default
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import torch

from reference_server.llm.model import DecoderConfig, PagedKV, Scheduled, TinyDecoder

D, CTX, WINDOW_S = 26, 295, 10.0


def main(minutes: float) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[-1]})
    other = cores[0] if len(cores) > 1 else None
    torch.set_num_threads(1)
    cfg = DecoderConfig()
    model, kv = TinyDecoder(cfg), PagedKV(cfg, 512, 16)
    kv.k.normal_()
    kv.v.normal_()
    nb = -(-(CTX + 1) // 16)
    seqs = [Scheduled(i, 1, CTX, torch.tensor(kv.slots(list(range(i * nb, (i + 1) * nb)), 0, CTX + 1)), True)
            for i in range(D)]  # fmt: skip
    tokens, positions = torch.randint(0, 256, (D,)), torch.full((D,), CTX)
    spin = f"import os; os.sched_setaffinity(0, {{{other}}})\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin]) if other is not None else None
    try:
        t_end = time.monotonic() + minutes * 60.0
        start = time.monotonic()
        while time.monotonic() < t_end:
            window, w_end = [], time.monotonic() + WINDOW_S
            while time.monotonic() < w_end:
                t0 = time.perf_counter_ns()
                model.step(tokens, positions, seqs, kv)
                window.append((time.perf_counter_ns() - t0) / 1e6)
            at = time.monotonic() - start
            line = f"{at:6.0f} s  median {np.median(window):.3f} ms  p90 {np.percentile(window, 90):.3f}"
            print(line, flush=True)  # noqa: T201
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 6.0)

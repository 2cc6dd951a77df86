"""Light load runs the instance's forward slower: is it the host's clock (calibrate/README,
"The host's clock")? In the six ResNet runs of 2026-12-06 a batch's forward
(``compute_infer``) at 20% of capacity ran 6.5-12% slower, size for size, than at 50-85%,
and at 30% 4-9% slower; the instance's idle just before the batch explains about half, its
busy share of the last 25-1,000 ms not the rest. The tiny LLM engine showed the same on
some hosts, and polling when idle took it away. Change one thing: the instance's idle.
Asleep on its pipe (``--instance-idle sleep``, as every calibration so far) its core halts
between batches; polling (``spin``) the core is busy at every load.

A third mode keeps the *other* core busy instead: the instance asleep, and a spinning
process at nice 19 on the front end's core (``neighbour``), which takes almost none of the
front end's CPU but keeps its vCPU from halting; a fourth (``stream``) the same with a
process that copies 32 MB arrays over and over instead: memory traffic, which keeps a
host's memory and cache clocks up where the spinning loop (all in its first-level cache)
does not.

Per round, each mode a fresh server (in a random order), on it slices of 4 s at 20%
and 80% of ``CAPACITY_RPS`` (two of each, in a random order, their first 0.25 s left out,
the calibration's design). Prints the median forward pass (ms) by batch size, per mode and
load, and the 20% level's over the 80% level's for the sizes both formed (their mean ratio:
1.00 where the load does not matter).

    python calibrate/experiments/instance_idle.py [ROUNDS [SEED [MODES]]]   # 3 rounds of 4: about 5 minutes
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pandas as pd

from calibrate.loadgen import Slice, run_slices
from calibrate.payloads import image_payloads
from calibrate.servers import get_json, server

SERVER_ARGS = ["--resolution", "64", "--width", "48", "--max-batch-size", "8", "--max-queue-delay-ms", "2"]
CAPACITY_RPS = 320.0  # the default ResNet's capacity on the 2-core VMs (cpu-resnet64-xeon)
SHARES = (0.2, 0.8)
MODES = ("sleep", "spin", "neighbour", "stream")
SLICE_S, WARMUP_S = 4.0, 0.25
say = print


@contextlib.contextmanager
def spinner(cores: list[int], *, memory: bool = False):
    """A process at nice 19 on ``cores`` while the block runs: spinning, or (``memory``)
    copying a 32 MB array over and over."""
    work = "np.copyto(b, a)" if memory else "pass"
    code = (
        f"import os; import numpy as np; os.sched_setaffinity(0, {set(cores)!r}); os.nice(19)\n"
        f"a = np.ones(4 << 20); b = np.empty_like(a)\nwhile True: {work}"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def main(rounds: int = 3, seed: int = 5, modes: tuple[str, ...] = MODES) -> None:
    rng = np.random.default_rng(seed)
    payloads = image_payloads(32, side=64, rng=rng)
    before = os.sched_getaffinity(0)
    parts = []
    try:
        for rnd in range(rounds):
            for idle in rng.permutation(list(modes)):
                mode = "spin" if idle == "spin" else "sleep"
                with server([*SERVER_ARGS, "--instance-idle", mode]) as url, contextlib.ExitStack() as stack:
                    cfg = get_json(url + "/v2/models/resnet/config")["parameters"]["servesim"]
                    os.sched_setaffinity(0, cfg["frontend_cores"])  # off the instance's core
                    if idle in ("neighbour", "stream"):
                        stack.enter_context(spinner(cfg["frontend_cores"], memory=idle == "stream"))
                    levels = [k for k in range(len(SHARES)) for _ in range(2)]
                    plan = [
                        Slice(rnd, int(k), SHARES[k] * CAPACITY_RPS, seed=int(rng.integers(1 << 31)))
                        for k in rng.permutation(levels)
                    ]
                    got = run_slices(url, "resnet", plan, payloads, slice_s=SLICE_S, warmup_s=WARMUP_S)
                    parts.append(got.requests.assign(round=rnd, idle=str(idle)))
                    say(f"round {rnd} {idle}: {len(got.requests)} requests", flush=True)
    finally:
        os.sched_setaffinity(0, before)
    every = pd.concat(parts, ignore_index=True)
    ok = every[(every["status"] == 200) & ~every["warmup"]]
    batches = ok.drop_duplicates(["round", "idle", "slice", "dispatched_at_ns"]).assign(
        share=lambda d: d["level"].map(dict(enumerate(SHARES))), fwd=lambda d: d["compute_infer_us"] / 1e3
    )
    t = batches.pivot_table(index=["idle", "share"], columns="batch_size", values="fwd", aggfunc="median")
    n = batches.pivot_table(index=["idle", "share"], columns="batch_size", values="fwd", aggfunc="size")
    say("median forward (ms) by batch size:")
    say(t.round(2).to_string())
    say("batches:")
    say(n.fillna(0).astype(int).to_string())
    say("20% over 80%, size for size (sizes with 20 batches at both), per round:")
    by = batches.groupby(["idle", "round", "share", "batch_size"])["fwd"].agg(["median", "size"])
    for (idle, rnd), g in by.groupby(level=["idle", "round"]):
        light, heavy = g.xs(0.2, level="share"), g.xs(0.8, level="share")
        both = light.index.intersection(heavy.index)
        both = [s for s in both if light.loc[s, "size"] >= 20 and heavy.loc[s, "size"] >= 20]
        r = (light.loc[both, "median"] / heavy.loc[both, "median"]).to_numpy() if both else np.array([np.nan])
        say(f"  {idle} round {rnd}: {np.mean(r):.3f} over sizes {[int(s[-1]) for s in both]}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *([tuple(sys.argv[3].split(","))] if len(sys.argv) > 3 else []))

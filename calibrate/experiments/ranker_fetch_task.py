"""The ranker's feature fetch in the handler's own task (calibrate/README, "The fetch in the
handler's own task"): the server as it is against the server at ``--before`` (by default
the commit before the change, whose one lane ran as a task of its own under
``asyncio.gather``), the same load generator, rates and seeds. Each condition is a fresh
redis-server and server (the earlier one from a temporary git worktree on PYTHONPATH), in
a random order per round, the load generator on the front end's core as `servesim
calibrate run` keeps it; 20 s a rate after a 5 s warm-up. Per condition and rate: latency
p50/p99 and the fetch's p50/p90/p99 and maximum, ms, each round's and the rounds' mean.

    python calibrate/experiments/ranker_fetch_task.py   # ~6 minutes, from the repository root
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ranker_client_core import figures, measure, show

BEFORE = "794341b"  # the last commit whose fetch ran its one lane as a task of its own


@contextlib.contextmanager
def server_at(rev: str | None):
    """The server's code at ``rev`` (None: as it is) for the servers started inside."""
    if rev is None:
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True)
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(tree)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = old
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, capture_output=True)


def compare(conditions: dict[str, str | None], rates: list[float], secs: float, rounds: int, by: str, **kw):
    """Each condition (a name and the commit of its server, None: as it is) measured at
    ``rates`` for ``secs`` each, in a random order per round; the rows of :func:`figures`."""
    rng = np.random.default_rng(0)
    rows = []
    for rnd in range(rounds):
        for k in rng.permutation(len(conditions)):
            name, rev = list(conditions.items())[k]
            with server_at(rev):
                rows += figures(measure(False, rates, secs, seed=rnd), round=rnd, **{by: name}, **kw)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="240,600,840,1000", help="Open-loop rates, req/s, comma-separated.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default=BEFORE, help="The commit to compare with.")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    conditions = {"own task (before)": a.before, "handler's task": None}
    show(compare(conditions, rates, 20.0, a.rounds, "fetch"), "fetch")


if __name__ == "__main__":
    main()

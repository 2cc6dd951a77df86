"""How far one overhead measurement strays (calibrate/README, "The light level's TTFT,
request by request"): the calibration measures a request's own overhead once, from 40
lone requests over 4 s on an engine not yet aged (3.14-4.13 ms in nine runs, 6.28 in one).
Per fresh server (as the calibration starts it): the overhead measured at once, then after
30 s of overload (the calibration's aging at the committed profile's offer), three times.

    python calibrate/experiments/llm_overhead_spread.py [SERVERS]   # about a minute a server
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from calibrate.llm_server import ENGINE, age_engine, measured_overhead, server_args
from calibrate.servers import beside_llm_front_end, server

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")


def main(servers: int) -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    fresh, aged = [], []
    for k in range(servers):
        with (
            server(server_args(ENGINE), command="serve-llm", health="/health") as url,
            beside_llm_front_end(url),
        ):
            fresh.append(measured_overhead(url, seed=k))
            age_engine(url, doc, profile["knee"]["offered_rps"], 30.0, seed=100 + k)
            aged.append([measured_overhead(url, seed=10 * k + j) for j in range(3)])
        print(f"server {k + 1}: fresh {fresh[-1]:.2f} ms; aged {', '.join(f'{a:.2f}' for a in aged[-1])}")  # noqa: T201
    a = np.ravel(aged)
    print(  # noqa: T201
        f"fresh: {np.mean(fresh):.2f} ms mean, sd {np.std(fresh, ddof=1):.2f} ({servers}); aged: {a.mean():.2f} mean, "
        f"sd {a.std(ddof=1):.2f} ({len(a)}), within a server sd {np.mean(np.std(aged, axis=1, ddof=1)):.2f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)

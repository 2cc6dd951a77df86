"""A client on the front end's core reads a batch's answers late (``event_loop.read_behind_ms``).

When a batch comes back, the server's event loop resumes its requests one after another and
writes each response. The load generator runs on the same core (the default run pins the
instance to the other one). It does not get the core while the loop writes the rest of the
batch, or gets part of it: on eleven ResNet runs, a request's time outside the server
(``latency_ms - request_us``) grows by 0.17-0.31 ms for each response of its batch written
after its own (0.4-0.65 of the loop's time per response), at every load alike
(calibrate/README, "The client reads a batch's answers late"). Heavier loads make bigger
batches, so this is time the light level's pure delay does not hold.

:func:`later_responses` counts, for each request, the responses of its batch written after
its own (the server's clocks give the order its handlers resumed); :func:`fit_read_behind`
is the least-squares slope of the time outside the server on that count within each level
(a level's own mean apart), which the simulator adds per later response.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NEEDS = ("received_at_ns", "request_us", "dispatched_at_ns", "batch_size", "latency_ms", "slice", "level")
MIN_REQUESTS = 200  # with a later response: fewer, and the slope is not fitted


def later_responses(df: pd.DataFrame) -> pd.Series:
    """Per request: how many responses of its batch the loop wrote after its own (0 for a
    batch of one; NaN without the server's clocks). The order is the handlers' resumption,
    when each one's ``request_us`` ended."""
    if not all(c in df for c in NEEDS):
        return pd.Series(np.nan, index=df.index)
    ok = df.dropna(subset=["received_at_ns", "request_us", "dispatched_at_ns", "batch_size"])
    written = ok["received_at_ns"] + ok["request_us"] * 1e3
    rank = written.groupby([ok["slice"], ok["dispatched_at_ns"]]).rank(method="first")
    size = written.groupby([ok["slice"], ok["dispatched_at_ns"]]).transform("size")
    return (size - rank).reindex(df.index)


def fit_read_behind(df: pd.DataFrame, cap_ms: float) -> float | None:
    """The time outside the server per later response of the batch (ms, 0 to ``cap_ms``,
    the loop's own time per response: the client cannot wait longer than the writes it
    waits for); None without the server's clocks or too few requests with one."""
    later = later_responses(df)
    ok = later.notna()
    if (later[ok] > 0).sum() < MIN_REQUESTS:
        return None
    x = later[ok].to_numpy(dtype=float)
    y = (df.loc[ok, "latency_ms"] - df.loc[ok, "request_us"] / 1e3).to_numpy()
    level = df.loc[ok, "level"].to_numpy()
    x = x - pd.Series(x).groupby(level).transform("mean").to_numpy()
    y = y - pd.Series(y).groupby(level).transform("mean").to_numpy()
    if not (x * x).sum() > 0:
        return None
    return float(np.clip((x * y).sum() / (x * x).sum(), 0.0, cap_ms))

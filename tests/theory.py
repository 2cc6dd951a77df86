"""Queueing theory the simulator is checked against: Erlang C and Pollaczek–Khinchine.

All times in ms, rates per ms.
"""

from __future__ import annotations

import math

from scipy import optimize


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load ``a = λ/μ`` (< c).

    Computed from the Erlang B recursion, which is stable for large ``c``.
    """
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1 - rho + rho * b)


def mmc_sojourn_sf(t: float, c: int, lam: float, mu: float) -> float:
    """P(T > t) for the sojourn time T = W + S of FCFS M/M/c.

    W is 0 with probability 1 − C, else Exp(θ) with θ = cμ − λ; S ~ Exp(μ) independent.
    """
    pw = erlang_c(c, lam / mu)
    theta = c * mu - lam
    if math.isclose(theta, mu):
        conv = (1 + mu * t) * math.exp(-mu * t)
    else:
        conv = (theta * math.exp(-mu * t) - mu * math.exp(-theta * t)) / (theta - mu)
    return (1 - pw) * math.exp(-mu * t) + pw * conv


def mmc_sojourn_quantile(p: float, c: int, lam: float, mu: float) -> float:
    """The p-quantile (0 < p < 1) of the M/M/c sojourn time."""
    hi = 1.0 / mu
    while mmc_sojourn_sf(hi, c, lam, mu) > 1 - p:
        hi *= 2
    return optimize.brentq(lambda t: mmc_sojourn_sf(t, c, lam, mu) - (1 - p), 0.0, hi, xtol=1e-12, rtol=1e-12)


def mmc_mean_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of M/M/c: C(c, a) / (cμ − λ)."""
    return erlang_c(c, lam / mu) / (c * mu - lam)


def pk_mean_wait(lam: float, mean_s: float, var_s: float) -> float:
    """Pollaczek–Khinchine mean wait of M/G/1: λ E[S²] / (2 (1 − ρ))."""
    rho = lam * mean_s
    return lam * (var_s + mean_s**2) / (2 * (1 - rho))


def mg1_priority_waits(lams: list[float], means: list[float], second_moments: list[float]) -> list[float]:
    """Mean wait in queue per class of non-preemptive priority M/G/1 (Cobham), class 0 first.

    W_k = R / ((1 − σ_{k−1})(1 − σ_k)), with R = Σ λ_i E[S_i²] / 2 the mean residual work
    and σ_k = Σ_{i≤k} ρ_i.
    """
    r = sum(lam * m2 for lam, m2 in zip(lams, second_moments, strict=True)) / 2
    out, sigma = [], 0.0
    for lam, mean in zip(lams, means, strict=True):
        before = sigma
        sigma += lam * mean
        out.append(r / ((1 - before) * (1 - sigma)))
    return out


def mmc_priority_waits(c: int, lams: list[float], mu: float) -> list[float]:
    """Mean wait in queue per class of non-preemptive priority M/M/c, every class served at
    rate ``mu``: W_k = C(c, a) / (cμ) / ((1 − σ_{k−1})(1 − σ_k)), σ_k = Σ_{i≤k} λ_i / (cμ)."""
    a = sum(lams) / mu
    w0 = erlang_c(c, a) / (c * mu)
    out, sigma = [], 0.0
    for lam in lams:
        before = sigma
        sigma += lam / (c * mu)
        out.append(w0 / ((1 - before) * (1 - sigma)))
    return out


def mm1_random_environment_mean_sojourn(lam: float, mu: float, factors, holds, levels: int = 4000) -> float:
    """Mean sojourn time of an M/M/1 queue in a Markovian random environment.

    The environment holds state ``i`` for an exponential time of mean ``holds[i]`` and then
    jumps to one of the others, chosen uniformly; in state ``i`` the server works at rate
    ``mu / factors[i]``; arrivals are Poisson at ``lam`` throughout (Yechiali and Naor,
    1971; a quasi-birth-death process, Neuts 1981). The generator is solved exactly on
    ``levels`` queue lengths (the mass beyond is negligible for a stable queue) and the
    mean follows by Little's law.
    """
    import numpy as np
    from scipy import sparse
    from scipy.sparse.linalg import spsolve

    f = np.asarray(factors, dtype=float)
    h = np.asarray(holds, dtype=float)
    k = len(f)
    n = levels * k
    rows, cols, vals = [], [], []

    def add(a, b, rate):
        rows.append(a)
        cols.append(b)
        vals.append(rate)

    for q in range(levels):
        for i in range(k):
            s = q * k + i
            if q + 1 < levels:
                add(s, s + k, lam)
            if q > 0:
                add(s, s - k, mu / f[i])
            for j in range(k):
                if j != i:
                    add(s, q * k + j, 1.0 / h[i] / (k - 1))
    g = sparse.csr_matrix((vals, (rows, cols)), shape=(n, n))
    g = g - sparse.diags(np.asarray(g.sum(axis=1)).ravel())
    # pi G = 0 with sum(pi) = 1: replace one balance equation by the normalisation
    a = g.T.tolil()
    a[0, :] = 1.0
    b = np.zeros(n)
    b[0] = 1.0
    pi = spsolve(a.tocsr(), b)
    mean_in_system = float((np.repeat(np.arange(levels), k) * pi).sum())
    return mean_in_system / lam


def take_all_batch_mean_sojourn(lam: float, service, k: int, levels: int = 500) -> float:
    """Mean time in system of a single server serving take-all batches (a bulk-service queue
    M/G^[1,k]/1, Neuts 1967): when it frees up it takes every waiting request, up to ``k``,
    as one batch that all leave together after ``service(b)`` (deterministic, for a batch of
    ``b``); idle, it starts a batch of one at the next arrival. Poisson arrivals at ``lam``.

    The queue left behind at departures is an embedded Markov chain: from ``q`` waiting, a
    batch of ``b = min(q, k)`` (1 after an idle spell) leaves ``q - b`` plus the Poisson
    arrivals during ``service(b)``. Solved exactly on ``levels`` states (the mass beyond is
    negligible for a stable queue); then by renewal reward over the cycles between
    departures, the mean time in system is the expected area under the number in system
    per cycle, ``q·S + λS²/2`` (``S·(1 + λS/2)`` after an idle spell), over the expected
    requests leaving per cycle.
    """
    import numpy as np
    from scipy.stats import poisson

    q = np.arange(levels)
    b = np.where(q > 0, np.minimum(q, k), 1)
    left = np.where(q > 0, q - b, 0)
    s = np.array([service(int(x)) for x in b], dtype=float)
    p = np.zeros((levels, levels))
    for i in range(levels):
        probs = poisson.pmf(np.arange(levels - left[i]), lam * s[i])
        p[i, left[i] :] = probs
        p[i, -1] += 1.0 - probs.sum()  # the tail, on the last level
    a = p.T - np.eye(levels)
    a[0, :] = 1.0
    rhs = np.zeros(levels)
    rhs[0] = 1.0
    pi = np.linalg.solve(a, rhs)
    area = np.where(q > 0, q, 1) * s + lam * s * s / 2
    return float((pi * area).sum() / (pi * b).sum())


def round_robin_mm_mean_sojourn(lam: float, mu: float, n: int) -> float:
    """Mean sojourn at one of ``n`` exponential servers (rate ``mu``) dealt a Poisson
    stream (rate ``lam``) in turn: each sees Erlang-``n`` interarrival times, a GI/M/1
    queue whose sojourn is exponential with rate mu(1 - sigma), sigma the root in (0, 1)
    of sigma = A*(mu(1 - sigma)), A*(s) = (lam / (lam + s))^n (Kleinrock, vol. 1, 6.4)."""
    from scipy.optimize import brentq

    if not lam / n < mu:
        raise ValueError("unstable: lam / n must be below mu")
    sigma = brentq(lambda x: (lam / (lam + mu * (1 - x))) ** n - x, 1e-12, 1 - 1e-12)
    return 1.0 / (mu * (1.0 - sigma))

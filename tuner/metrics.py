"""Tuning-quality metrics (ALCOP Fig. 13, and the methodology score P).

best-in-k: the best throughput found in the first k trials divided by the best throughput of
exhaustive search over the same recorded space. Failed trials have throughput 0. Averaged as
the mean over seeds, then the geometric mean over datasets.

P = (strategy - random) / (optimum - random), with random search's exact expectation: for k
draws without replacement from N schedules whose normalised throughputs sorted descending are
t_1 >= ... >= t_N, P(best = t_i) = C(N-i, k-1) / C(N, k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln
from scipy.stats import gmean


def best_so_far(throughputs: Sequence[float]) -> np.ndarray:
    """Running maximum of per-trial throughputs (0 for failures)."""
    return np.maximum.accumulate(np.asarray(throughputs, dtype=np.float64))


def best_in_k(throughputs: Sequence[float], optimum: float, k: int) -> float:
    """Best of the first k trials over the exhaustive optimum (a shorter run counts as is)."""
    if optimum <= 0:
        raise ValueError("the optimum throughput must be positive")
    first = np.asarray(throughputs[:k], dtype=np.float64)
    return float(first.max() / optimum) if len(first) else 0.0


def random_search_expectation(normalised: Sequence[float], k: int) -> float:
    """Exact E[max of k draws without replacement] over the whole space's normalised values."""
    t = np.sort(np.asarray(normalised, dtype=np.float64))[::-1]
    n = len(t)
    if k >= n:
        return float(t[0])
    i = np.arange(1, n + 1)
    # log C(N-i, k-1) - log C(N, k); zero probability where N-i < k-1
    valid = (n - i) >= (k - 1)
    log_p = np.full(n, -np.inf)
    m = n - i[valid]
    log_p[valid] = (
        gammaln(m + 1)
        - gammaln(k)
        - gammaln(m - k + 2)
        - (gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))
    )
    return float(np.sum(np.exp(log_p) * t))


def p_score(strategy: float, random: float, optimum: float = 1.0) -> float:
    """(strategy - random) / (optimum - random); 0 when random already reaches the optimum."""
    gap = optimum - random
    return float((strategy - random) / gap) if gap > 1e-12 else 0.0


def geomean(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=np.float64)
    if np.any(v <= 0):
        return 0.0
    return float(gmean(v))

"""Tuning-quality metrics (ALCOP Fig. 13, and the methodology score P).

best-in-k: the best throughput found in the first k trials divided by the best throughput of
exhaustive search over the same recorded space. Failed trials have throughput 0. Averaged as
the mean over seeds, then the geometric mean over datasets.

P = (strategy - random) / (optimum - random), with random search's exact expectation: for k
draws without replacement from N schedules whose normalised throughputs sorted descending are
t_1 >= ... >= t_N, P(best = t_i) = C(N-i, k-1) / C(N, k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


# Below this gap between random search and the optimum, random already reaches it: a P
# score there is undefined (0/0), not 0.
NO_GAP = 1e-12


def p_score(strategy: float, random: float, optimum: float = 1.0) -> float | None:
    """(strategy - random) / (optimum - random); None where random already reaches the
    optimum (it read 0 there, as if the search were exactly as good as random)."""
    gap = optimum - random
    return float((strategy - random) / gap) if gap > NO_GAP else None


def p_score_se(se: float, random: float, optimum: float = 1.0) -> float | None:
    """The standard error of p_score for a strategy's standard error `se` (None where the
    P score is undefined)."""
    gap = optimum - random
    return float(se / gap) if gap > NO_GAP else None


def mean_p_score(
    per_dataset: Mapping[str, Mapping[str, Any]],
) -> tuple[float | None, float | None]:
    """The P score over datasets (each a mapping with `p_score`, `p_se` and `random`) and its
    standard error: the mean over the datasets where random search does not already reach
    the optimum at that budget. There every search reaches it too and its P score says
    nothing of the search (counted as 0 in the mean, it pulled the mean towards 0: a space
    smaller than the budget). None where no dataset has a gap left: undefined, where it read
    0.00 as if every search were exactly as good as random."""
    scored = [v for v in per_dataset.values() if 1.0 - v["random"] > NO_GAP]
    if not scored:
        return None, None
    d = len(scored)
    mean = float(np.mean([v["p_score"] for v in scored]))
    return mean, float(np.sqrt(np.sum(np.square([v["p_se"] for v in scored]))) / d)


def geomean(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=np.float64)
    if np.any(v <= 0):
        return 0.0
    return float(gmean(v))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The mean of b - a over paired seeds (the same seed, design and draws in both runs) and
    its standard error. Pairing removes what the seeds share: two runs of one search differ
    by far less than either one's spread over seeds, which is the unpaired error."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    if len(d) == 0:
        raise ValueError("no paired seeds")
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    return float(d.mean()), se


def paired_geomean_difference(
    a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]]
) -> tuple[float, float]:
    """G(b) - G(a), G the geometric mean over datasets of the mean over seeds (the benchmark's
    headline figure), with its standard error from the seeds' paired differences: by the delta
    method on log G = mean over datasets of log(mean), each dataset's log-ratio error that of
    the per-seed differences of the values relative to their means."""
    if set(a) != set(b) or not a:
        raise ValueError("the two runs must cover the same datasets")
    g_a = geomean([float(np.mean(a[name])) for name in a])
    g_b = geomean([float(np.mean(b[name])) for name in a])
    variance = 0.0
    for name in a:
        x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
        if len(x) != len(y):
            raise ValueError(f"{name}: {len(x)} seeds against {len(y)}")
        _, se = paired_difference(x / max(x.mean(), 1e-12), y / max(y.mean(), 1e-12))
        variance += se**2
    return g_b - g_a, float(np.sqrt(g_a * g_b) * np.sqrt(variance) / len(a))

"""Acquisition: which unmeasured configurations are worth a trial, and a diverse batch of them.

Expected improvement over the best measurement (higher is better) balances a high predicted
mean against a large uncertainty, and it is multiplied by the probability that the
configuration runs at all (constrained EI, as BaCO does), so the search stays out of the
failing region without that region distorting the performance model.

A batch is chosen greedily with the "kriging believer" (Ginsbourger et al.): after each pick
the surrogate is conditioned on its own prediction there, which shrinks the uncertainty
around the pick and so the expected improvement of its neighbours; the next pick goes
elsewhere unless the neighbourhood is still clearly the best bet. A batch of 8 is then not 8
neighbours of one point. Each pick is the best of every candidate of its pool given the picks
before it; the candidates far down the first ranking are scored only when they could still
win (believer_batch).
"""

from __future__ import annotations

import numpy as np
from scipy.special import erfcx, ndtr

from pipetune.tuner.surrogate import Fantasies, Surrogate

# The standard normal's density, log density and distribution function, as scipy.stats.norm
# computes them (the same expressions), without its per-call argument handling: the
# acquisition evaluates them over the whole space once per pick of a batch.
_SQRT_2PI = np.sqrt(2.0 * np.pi)
_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def _norm_logpdf(z: np.ndarray) -> np.ndarray:
    return -(z**2) / 2.0 - _LOG_SQRT_2PI


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-(z**2) / 2.0) / _SQRT_2PI


def log_expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """log E[max(f - best, 0)] for f ~ N(mean, sd^2), accurate far below the incumbent too.

    EI = sd * h(z), h(z) = phi(z) + z Phi(z), z = (mean - best) / sd. Where the improvement is
    unlikely, EI underflows to 0 for most of a space and the argmax would be decided by row
    order; its logarithm keeps ranking them (LogEI, Ament et al., NeurIPS 2023). For z < -5,
    h(z) = phi(z) * (1 - z Phi(z) / -phi(z)) is evaluated through the Mills ratio
    Phi(z) / phi(z) = erfcx(-z / sqrt 2) * sqrt(pi / 2).
    """
    z = (mean - best) / sd
    out = np.empty_like(z)
    far = z < -5.0
    near = ~far
    zn = z[near]
    out[near] = np.log(np.maximum(_norm_pdf(zn) + zn * ndtr(zn), 1e-300))
    zf = z[far]
    mills = erfcx(-zf / np.sqrt(2.0)) * np.sqrt(np.pi / 2.0)
    inner = 1.0 + zf * mills  # = h(z) / phi(z), about 1 / z^2: cancels for very negative z
    with np.errstate(divide="ignore", invalid="ignore"):
        out[far] = np.where(
            inner > 1e-9,
            _norm_logpdf(zf) + np.log(np.maximum(inner, 1e-300)),
            _norm_logpdf(zf) - 2.0 * np.log(-zf),  # the asymptote h(z) ~ phi(z) / z^2
        )
    return out + np.log(sd)


def constrained_score(mean: np.ndarray, sd: np.ndarray, best: float, p_ok: np.ndarray):
    """log(EI * P(runs)): expected improvement where the configuration runs at all."""
    return log_expected_improvement(mean, sd, best) + np.log(np.maximum(p_ok, 1e-12))


# Candidates per pool the believer starts from. Only its speed depends on this: a pool is
# widened whenever a row left out could still beat its best candidate (see believer_batch).
FIRST_CANDIDATES = 256


def believer_batch(
    surrogate: Surrogate,
    best: float,
    features: np.ndarray,
    offset: np.ndarray,
    p_ok: np.ndarray,
    pools: list[np.ndarray],
    first_score: np.ndarray,
    pending: np.ndarray | None = None,
) -> list[int]:
    """One pick from each pool in turn (rows of `features`), each one conditioning the
    surrogate on its own prediction before the next.

    The surrogate was fit to residuals r = y - offset (offset: a prior mean per row, or
    zeros); `best` is the incumbent (the best y measured; before any success, the best
    predicted). Each pool holds unvisited rows in descending order of `first_score` (indexed
    by row), their `constrained_score` before any pick. A row picked once is not picked again;
    a pool with nothing left falls back to the union of the pools.

    Exact over the whole pools, without scoring every row at every pick. Where believing can
    only shrink the spread (a GP), a row's score never rises during a batch: its mean stays,
    its spread shrinks and the incumbent only rises, so its first score bounds every later
    one. The believer starts from each pool's FIRST_CANDIDATES best rows and widens a pool
    (four times as many rows) while the best row left out could still beat its pick.
    """
    candidates = np.zeros(0, dtype=np.int64)  # rows, in the order they joined
    index_of = np.full(len(features), -1, dtype=np.int64)  # row -> place among candidates
    taken = np.zeros(0, dtype=bool)
    shown: dict[int, int] = {}  # id(pool) -> how many of its first rows are candidates
    fantasies: Fantasies | None = None

    def show(pool: np.ndarray, count: int) -> None:
        nonlocal candidates, taken, fantasies
        segment = pool[shown.get(id(pool), 0) : count]
        shown[id(pool)] = max(count, shown.get(id(pool), 0))
        new = segment[index_of[segment] < 0]
        if not len(new):
            return
        index_of[new] = np.arange(len(candidates), len(candidates) + len(new))
        candidates = np.concatenate([candidates, new])
        taken = np.concatenate([taken, np.zeros(len(new), dtype=bool)])
        if fantasies is None:
            fantasies = surrogate.fantasies(features[new])
        else:
            fantasies.extend(features[new])

    def used_up(pool: np.ndarray) -> bool:
        where = index_of[pool]
        return bool((where >= 0).all() and taken[where].all())

    if pending is not None and len(pending):
        # Proposed earlier and not measured yet: believed first, as the batch's own picks are.
        show(pending, len(pending))
        for row in pending.tolist():
            assert fantasies is not None
            i = int(index_of[row])
            taken[i] = True
            best = max(best, float(fantasies.mean[i] + offset[row]))
            fantasies.believe(i)
    for pool in pools:
        show(pool, FIRST_CANDIDATES)
    anywhere: np.ndarray | None = None
    picked: list[int] = []
    for pool in pools:
        if used_up(pool):  # e.g. the trust region: then the best row anywhere
            if anywhere is None:
                anywhere = np.unique(np.concatenate(pools))
                anywhere = anywhere[np.argsort(-first_score[anywhere], kind="stable")]
            pool = anywhere
            show(pool, FIRST_CANDIDATES)
        assert fantasies is not None
        if not fantasies.spread_only_shrinks:  # scores may rise: no bound, score every row
            show(pool, len(pool))
        while True:
            seen = shown[id(pool)]
            mean = fantasies.mean + offset[candidates]
            score = constrained_score(mean, fantasies.sd, best, p_ok[candidates])
            idx = index_of[pool[:seen]]
            idx = idx[~taken[idx]]
            left_out = float(first_score[pool[seen]]) if seen < len(pool) else -np.inf
            if (len(idx) and score[idx].max() > left_out) or seen >= len(pool):
                break
            show(pool, 4 * seen)
        if not len(idx):
            break  # every row is taken
        i = int(idx[np.argmax(score[idx])])  # ties: the first in the pool's order
        taken[i] = True
        picked.append(int(candidates[i]))
        # Believe the model: the pick's outcome is its predicted mean.
        best = max(best, float(mean[i]))
        fantasies.believe(i)
    return picked

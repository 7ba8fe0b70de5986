"""Acquisition: which unmeasured configurations are worth a trial, and a diverse batch of them.

Expected improvement over the best measurement (higher is better) balances a high predicted
mean against a large uncertainty, and it is multiplied by the probability that the
configuration runs at all (constrained EI, as BaCO does), so the search stays out of the
failing region without that region distorting the performance model.

A batch is chosen greedily with the "kriging believer" (Ginsbourger et al.): after each pick
the surrogate is conditioned on its own prediction there, which shrinks the uncertainty
around the pick and so the expected improvement of its neighbours; the next pick goes
elsewhere unless the neighbourhood is still clearly the best bet. A batch of 8 is then not 8
neighbours of one point.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erfcx, ndtr

from pipetune.tuner.surrogate import Surrogate

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


def believer_batch(
    surrogate: Surrogate,
    best: float,
    features: np.ndarray,
    offset: np.ndarray,
    p_ok: np.ndarray,
    pools: list[np.ndarray],
) -> list[int]:
    """One pick from each pool in turn (rows of `features`), each one conditioning the
    surrogate on its own prediction before the next.

    The surrogate was fit to residuals r = y - offset (offset: a prior mean per row, or
    zeros); `best` is the best y measured (-inf before any success: then the best prior mean
    among the candidates is the incumbent). Rows in the pools must be unvisited; a row picked
    once is not picked again. A pool with nothing left falls back to any candidate.
    """
    candidates = np.unique(np.concatenate(pools))
    position = {int(r): i for i, r in enumerate(candidates)}
    fantasies = surrogate.fantasies(features[candidates])
    picked: list[int] = []
    taken = np.zeros(len(candidates), dtype=bool)
    for pool in pools:
        mean = fantasies.mean + offset[candidates]
        if not np.isfinite(best):
            best = float(mean.max())
        score = constrained_score(mean, fantasies.sd, best, p_ok[candidates])
        score[taken] = -np.inf
        choose = np.full(len(candidates), -np.inf)
        idx = np.array([position[int(r)] for r in pool], dtype=np.int64)
        idx = idx[~taken[idx]]
        if len(idx) == 0:  # the local pool is used up: take the best anywhere
            idx = np.flatnonzero(~taken)
            if len(idx) == 0:
                break
        choose[idx] = score[idx]
        i = int(np.argmax(choose))
        taken[i] = True
        picked.append(int(candidates[i]))
        # Believe the model: the pick's outcome is its predicted mean.
        best = max(best, float(mean[i]))
        fantasies.believe(i)
    return picked

"""L-BFGS-B on box bounds: scipy's own routine (`scipy.optimize._lbfgsb.setulb`), driven by a
loop written here instead of through `scipy.optimize.minimize`.

Why by hand: the GP's hyperparameter fits (tuner/surrogate.py) are a proposal round's largest
cost, a few thousand evaluations of an objective of 30-200 us each over a task, and
`minimize`'s machinery around each evaluation (its ScalarFunction wrapper: copies, array
checks, the memoised Jacobian) cost 70-75 us more per evaluation on this project's VM on a
slow day, plus a fraction of a millisecond to set up each fit (benchmarks/RESULTS.md,
"L-BFGS-B without minimize's wrapper"). The loop below is the one that
`scipy.optimize._lbfgsb_py._minimize_lbfgsb` runs (scipy 1.15 and later), less what the
fits do not use (callbacks, finite differences, the inverse-Hessian operator): the same
iterates, bit for bit, and the same number of evaluations (tests/test_tuner_lbfgsb.py
checks both against `minimize`).

setulb is private to scipy. Its arguments changed at scipy 1.15 (a C port of the Fortran), so
the loop is used only where a one-off check at first use finds it gives `minimize`'s answer on
a small problem; anywhere else (an older scipy, a future change of the routine) every fit goes
through `minimize` as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

Objective = Callable[[np.ndarray], tuple[float, np.ndarray]]

# minimize's defaults for L-BFGS-B that the fits leave as they are.
HISTORY = 10  # maxcor: the correction pairs kept
GTOL = 1e-5  # a projected gradient this small ends the search
MAX_LINE_SEARCH = 20  # maxls
MAX_ITERATIONS = 15000  # maxiter, and maxfun for evaluations
# setulb's task codes (scipy >= 1.15): 3 asks for f and g at x, 1 reports a new iterate, 4
# converged, 5 stopped (a limit); its second slot says why.
_EVALUATE, _NEW_ITERATE, _STOP = 3, 1, 5
_TOO_MANY_ITERATIONS, _TOO_MANY_EVALUATIONS = 504, 502


@dataclass(frozen=True)
class Minimum:
    x: np.ndarray
    fun: float
    nfev: int


def minimize_bounded(
    fun: Objective, x0: np.ndarray, bounds: Sequence[tuple[float, float]], ftol: float
) -> Minimum:
    """Minimise `fun` (value and gradient) from x0 within finite `bounds` by L-BFGS-B, as
    `minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"ftol": ftol})`
    would."""
    if _direct_loop_matches():
        return _direct(fun, x0, bounds, ftol)
    return _through_minimize(fun, x0, bounds, ftol)


def _through_minimize(
    fun: Objective, x0: np.ndarray, bounds: Sequence[tuple[float, float]], ftol: float
) -> Minimum:
    result = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"ftol": ftol})
    return Minimum(np.asarray(result.x), float(result.fun), int(result.nfev))


def _direct(
    fun: Objective, x0: np.ndarray, bounds: Sequence[tuple[float, float]], ftol: float
) -> Minimum:
    from scipy.optimize import _lbfgsb  # private: see the module's docstring

    n, m = len(x0), HISTORY
    low = np.array([b[0] for b in bounds], dtype=np.float64)
    high = np.array([b[1] for b in bounds], dtype=np.float64)
    kinds = np.full(n, 2, dtype=np.int32)  # bounded below and above
    x = np.clip(np.array(x0, dtype=np.float64), low, high)
    f = np.array(0.0)
    g = np.zeros(n)
    work = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
    iwork = np.zeros(3 * n, dtype=np.int32)
    task, line_task = np.zeros(2, dtype=np.int32), np.zeros(2, dtype=np.int32)
    lsave, isave, dsave = (
        np.zeros(4, dtype=np.int32),
        np.zeros(44, dtype=np.int32),
        np.zeros(29),
    )
    factr = ftol / np.finfo(float).eps
    # minimize evaluates at x0 when it sets up, and answers setulb's first request from that.
    at_start: tuple[float, np.ndarray] | None = fun(x)
    start = x.copy()
    evaluations, iterations = 1, 0
    while True:
        _lbfgsb.setulb(
            m, x, low, high, kinds, f, g, factr, GTOL, work, iwork, task, lsave, isave, dsave,
            MAX_LINE_SEARCH, line_task,
        )  # fmt: skip
        if task[0] == _EVALUATE:
            if at_start is not None and np.array_equal(x, start):
                value, grad = at_start
            else:
                value, grad = fun(x)
                evaluations += 1
            at_start = None
            f = np.array(float(value))
            g = np.array(grad, dtype=np.float64)
        elif task[0] == _NEW_ITERATE:
            iterations += 1
            if iterations >= MAX_ITERATIONS:
                task[0], task[1] = _STOP, _TOO_MANY_ITERATIONS
            elif evaluations > MAX_ITERATIONS:
                task[0], task[1] = _STOP, _TOO_MANY_EVALUATIONS
        else:
            return Minimum(x, float(f), evaluations)


def _rosenbrock(x: np.ndarray) -> tuple[float, np.ndarray]:
    a, b = x[:-1], x[1:]
    value = float(np.sum(100.0 * (b - a**2) ** 2 + (1 - a) ** 2))
    grad = np.zeros_like(x)
    grad[:-1] = -400.0 * a * (b - a**2) - 2 * (1 - a)
    grad[1:] += 200.0 * (b - a**2)
    return value, grad


@functools.cache
def _direct_loop_matches() -> bool:
    """Whether the loop gives minimize's iterates on a bounded Rosenbrock problem whose
    optimum sits on a bound (once per process)."""
    x0 = np.array([-1.2, 1.0, 0.5, -0.3])
    bounds = [(-2.0, 2.0), (-2.0, 0.9), (-2.0, 2.0), (-2.0, 2.0)]
    try:
        direct = _direct(_rosenbrock, x0, bounds, 1e-9)
    except Exception:  # any change of the private routine: use minimize
        return False
    reference = _through_minimize(_rosenbrock, x0, bounds, 1e-9)
    return bool(np.array_equal(direct.x, reference.x) and direct.nfev == reference.nfev)

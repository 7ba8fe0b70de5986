"""tuner/lbfgsb.py: L-BFGS-B driven without `minimize`'s wrapper gives `minimize`'s answers."""

from __future__ import annotations

import numpy as np
import pytest
import scipy
from scipy.optimize import minimize

from pipetune.tuner import lbfgsb
from pipetune.tuner.matern_gp import neg_log_posterior, pair_sq_diffs, standardise
from pipetune.tuner.surrogate import MAP_FTOL, GaussianProcess

SCIPY = tuple(int(part) for part in scipy.__version__.split(".")[:2])


def _map_objectives():
    """MAP objectives of the kinds a search fits (smooth, rough, mostly noise; 5 to 100
    points, 3 to 15 knobs, one of them with a failure-like outlier) and the fits' two fixed
    starts for each."""
    rng = np.random.default_rng(5)
    for n, d, roughness in ((5, 3, 2.0), (16, 8, 3.0), (40, 15, 8.0), (100, 6, 1.0), (30, 4, 0.0)):
        X = rng.random((n, d))
        signal = np.sin(roughness * X @ rng.standard_normal(d)) if roughness else 0.0
        y = signal + 0.05 * rng.standard_normal(n)
        y[0] += 5.0
        gp = GaussianProcess(d, seed=0)
        t, _, _ = standardise(y)
        D2 = pair_sq_diffs(X)

        def objective(theta, D2=D2, t=t, gp=gp):
            return neg_log_posterior(theta, D2, t, gp.log_ls_mean, gp.log_ls_var)

        yield objective, gp._bounds(), (gp.start.theta, gp._rough_start())


def test_the_fits_take_minimizes_steps_bit_for_bit():
    """Same minimum, same point to the last bit, same number of evaluations as `minimize`
    from every start: the search is the same, only cheaper. Before scipy 1.15 (pyproject's
    floor is older) the routine took other arguments: there the loop must not be taken, and
    the fits go through `minimize` itself."""
    direct = lbfgsb._direct_loop_matches()
    if SCIPY >= (1, 15) and not direct:
        pytest.fail(f"scipy {scipy.__version__}: the loop's self-check failed (see below)")
    if SCIPY < (1, 15):
        assert not direct, f"scipy {scipy.__version__}: the loop took an older routine"
    fits = 0
    for objective, bounds, starts in _map_objectives():
        for start in starts:
            ours = lbfgsb.minimize_bounded(objective, start, bounds, MAP_FTOL)
            theirs = minimize(
                objective, start, jac=True, method="L-BFGS-B", bounds=bounds,
                options={"ftol": MAP_FTOL},
            )  # fmt: skip
            assert np.array_equal(ours.x, theirs.x)
            assert ours.fun == theirs.fun
            assert ours.nfev == theirs.nfev
            fits += 1
    assert fits == 10


def test_a_start_outside_the_bounds_is_clipped_as_minimize_clips_it():
    objective, bounds, _ = next(_map_objectives())
    start = np.full(len(bounds), 50.0)  # above every upper bound
    ours = lbfgsb.minimize_bounded(objective, start, bounds, MAP_FTOL)
    theirs = minimize(
        objective, start, jac=True, method="L-BFGS-B", bounds=bounds, options={"ftol": MAP_FTOL}
    )
    assert np.array_equal(ours.x, theirs.x)
    assert ours.nfev == theirs.nfev


def test_the_loop_is_used_on_the_scipy_releases_it_was_written_for():
    """scipy 1.15 to 1.18 have the routine's present arguments: there the fits take the loop
    (a later release is checked at first use and may fall back)."""
    if not (1, 15) <= SCIPY <= (1, 18):
        pytest.skip(f"scipy {scipy.__version__} is not one the loop was checked against")
    lbfgsb._direct_loop_matches.cache_clear()
    assert lbfgsb._direct_loop_matches()


@pytest.mark.parametrize("change", ["arguments", "answers"])
def test_a_routine_that_changed_falls_back_to_minimize(monkeypatch, change):
    """Where scipy's private routine no longer takes these arguments, or answers otherwise,
    every fit goes through `minimize`: slower, never wrong. (The loop itself stands in for
    the routine here: scipy's own minimize calls the same routine.)"""
    real = lbfgsb._direct

    def changed(fun, x0, bounds, ftol):
        if change == "arguments":
            raise TypeError("setulb() takes 18 positional arguments but 17 were given")
        found = real(fun, x0, bounds, ftol)
        return lbfgsb.Minimum(found.x + 1e-3, found.fun, found.nfev)

    monkeypatch.setattr(lbfgsb, "_direct", changed)
    lbfgsb._direct_loop_matches.cache_clear()
    try:
        assert not lbfgsb._direct_loop_matches()
        objective, bounds, starts = next(_map_objectives())
        ours = lbfgsb.minimize_bounded(objective, starts[0], bounds, MAP_FTOL)
        theirs = minimize(
            objective, starts[0], jac=True, method="L-BFGS-B", bounds=bounds,
            options={"ftol": MAP_FTOL},
        )  # fmt: skip
        assert np.array_equal(ours.x, theirs.x)
    finally:
        lbfgsb._direct_loop_matches.cache_clear()

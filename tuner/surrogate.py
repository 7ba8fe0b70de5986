"""Surrogates of a kernel's performance with an uncertainty, and a model of where it fails.

`GaussianProcess` (the one the search uses; benchmarks/RESULTS.md, "surrogate choice", has the
measurement behind that choice): a GP (tuner/matern_gp.py) with a Matérn 5/2 kernel, one
length scale per feature (a knob that does not matter gets a long one), a learned noise level,
on standardised targets, hyperparameters fit by maximum a posteriori, and a predictive spread
never narrower than its own leave-one-out errors say it should be. `ExtraTrees` is the
alternative that was measured: the mean and spread over the trees of an extremely randomised
forest (SMAC's random-forest surrogate).

`FailureModel` is a classifier of the region where configurations fail (too much shared
memory, launch limits): failed trials are learned there, not as fake latencies, so they do
not distort the performance model (BaCO's feasibility model).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from pipetune.tuner.lbfgsb import minimize_bounded
from pipetune.tuner.matern_gp import (
    Kernel,
    Posterior,
    hessian_of_neg_log_posterior,
    neg_log_hyperprior,
    neg_log_posterior,
    pair_sq_diffs,
    standardise,
)

if TYPE_CHECKING:
    # (Imported where a forest is made: scikit-learn's import was half of the service's
    # start, which fits no forest until a task's strategy asks for one.)
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor


class Fantasies:
    """A surrogate's predictions at candidates, conditioned pick by pick on its own prediction
    at the pick (the kriging believer, tuner/acquisition.py). More candidates can be added at
    any point (`extend`): they are predicted as if they had been there from the start.

    This generic form refits a copy of the surrogate on its data plus the believed points
    after every pick; `GaussianProcess` has an exact and much cheaper one (`GPFantasies`)."""

    # Whether believing a pick can only shrink every candidate's spread (and leaves the means
    # alone): then a candidate's expected improvement never rises during a batch, and the
    # believer may leave out candidates whose first score is already below its pick's.
    spread_only_shrinks = False

    def __init__(self, surrogate: Surrogate, X_c: np.ndarray):
        self._model = surrogate
        self._X_c = X_c
        self._X_seen, self._y_seen = surrogate.training_data
        self.mean, self.sd = surrogate.predict(X_c)

    def believe(self, i: int) -> None:
        """Condition on candidate i's outcome being its predicted mean."""
        self._X_seen = np.vstack([self._X_seen, self._X_c[i : i + 1]])
        self._y_seen = np.append(self._y_seen, self.mean[i])
        self._model = self._model.condition(self._X_seen, self._y_seen)
        self.mean, self.sd = self._model.predict(self._X_c)

    def extend(self, X_new: np.ndarray) -> None:
        """Add candidates (after the present ones), conditioned on the picks believed so far."""
        self._X_c = np.vstack([self._X_c, X_new])
        self.mean, self.sd = self._model.predict(self._X_c)


class Surrogate(ABC):
    training_data: tuple[np.ndarray, np.ndarray]  # what the last fit saw: X and y

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray) -> None:
        """Fit to features X and targets y (higher is better), optimising hyperparameters."""

    @abstractmethod
    def condition(self, X: np.ndarray, y: np.ndarray) -> Surrogate:
        """A copy conditioned on other data with the same hyperparameters (for fantasies)."""

    @abstractmethod
    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation at X."""

    def fantasies(self, X_c: np.ndarray) -> Fantasies:
        """Predictions at candidates X_c that can believe picks among them (kriging believer)."""
        return Fantasies(self, X_c)

    def log_evidence(self) -> float:
        """Log marginal likelihood of the fitted targets in their own units (model choice)."""
        raise NotImplementedError


# When L-BFGS-B stops a MAP fit: once an iteration gains less than 1e-6 of the objective (about
# 1e-4 nats at the 100 nats of a hundred trials), where scipy's default (2.2e-9) polished the
# estimate a thousand times finer than anything that uses it can tell (the search compares
# fits by 0.5 nats and more), at a quarter of the fits' evaluations. 1e-5 saved a third, but
# on the 15-knob GEMM space of the development set it stopped slow but real progress along
# flat directions often enough to cost 0.015 of best-in-100 (benchmarks/RESULTS.md, "the GP's
# MAP fits stopped where they stop mattering").
MAP_FTOL = 1e-6


class GaussianProcess(Surrogate):
    """Hyperparameters are MAP estimates under the dimension-scaled priors of Hvarfner et al.
    ("Vanilla Bayesian optimization performs great in high dimensions", ICML 2024; BoTorch's
    default): log length scale ~ N(sqrt(2) + log(d) / 2, 3) on [0, 1] features, log noise
    variance ~ N(-4, 1). Maximum likelihood alone, on a few dozen points and one length scale
    per knob, collapses to tiny length scales that explain every point as independent (the GP
    then knows nothing between its data and the search turns random); the prior prevents it.
    A fit depends on the data and on the fits before it (warm starts, see `fit`): a session's
    fits are the same whenever it replays the same trials. The GP itself (tuner/matern_gp.py)
    is scikit-learn's `GaussianProcessRegressor` with this kernel and `normalize_y`, computed
    without its per-call machinery.
    """

    # Where each hyperparameter may go: amplitude (of standardised targets), length scales
    # (in the [0, 1] feature units) and noise variance.
    AMPLITUDE_BOUNDS = (1e-2, 1e2)
    LENGTH_SCALE_BOUNDS = (1e-2, 1e3)
    NOISE_BOUNDS = (1e-6, 1.0)

    def __init__(self, n_features: int, seed: int, length_scale: float | None = None, sd=1.0):
        """Before any fit the GP is its prior: mean 0, standard deviation `sd` everywhere,
        correlated over `length_scale` (in the [0, 1] feature units; default: the prior's
        mode)."""
        self.seed = seed
        self.n_features = n_features
        self.log_ls_mean = np.sqrt(2.0) + 0.5 * np.log(n_features)
        self.log_ls_var = 3.0
        ls = np.exp(self.log_ls_mean) if length_scale is None else length_scale
        self.start = Kernel(sd**2, np.full(n_features, float(ls)), np.exp(-4.0) * sd**2)
        self.kernel = self.start
        self.posterior: Posterior | None = None
        self.training_data = (np.zeros((0, n_features)), np.zeros(0))
        self._estimated_on = 0  # data size at the last hyperparameter estimate
        self._checked_on = 0  # data size at the last estimate that also ran the rough start
        self.cv_scale = 1.0  # the posterior spread's factor from leave-one-out (see fit)
        # The log evidence of the last fit: the log likelihood plus the hyperprior's log
        # density (constants dropped) at its hyperparameters, the MAP objective's value there,
        # whether they were re-estimated by this fit or kept from the last one: two fits are
        # compared on the same footing (bo.py), whichever of them was re-estimated.
        self._log_evidence_std = 0.0

    def _bounds(self) -> list[tuple[float, float]]:
        return (
            [tuple(np.log(self.AMPLITUDE_BOUNDS))]
            + [tuple(np.log(self.LENGTH_SCALE_BOUNDS))] * self.n_features
            + [tuple(np.log(self.NOISE_BOUNDS))]
        )  # type: ignore[list-item]

    def _neg_log_prior(self) -> float:
        """The hyperprior's -log density at the present kernel, as `neg_log_posterior` adds
        it to the -log likelihood (constants dropped)."""
        return neg_log_hyperprior(self.kernel.theta, self.log_ls_mean, self.log_ls_var)

    def _rough_start(self) -> np.ndarray:
        """Short length scales (0.3 of every knob's range): a rough function."""
        rough = self.start.theta.copy()
        rough[1 : 1 + self.n_features] = np.log(0.3)
        return rough

    def _map(self, X: np.ndarray, y: np.ndarray, starts: list[np.ndarray]) -> tuple[Kernel, float]:
        """L-BFGS-B on -log likelihood - log prior (`neg_log_posterior`) from each start in
        `starts`; the best posterior wins. Returns the kernel and the objective's minimum."""
        D2 = pair_sq_diffs(X)
        t, _, _ = standardise(y)

        def objective(theta):
            return neg_log_posterior(theta, D2, t, self.log_ls_mean, self.log_ls_var)

        bounds = self._bounds()
        results = [minimize_bounded(objective, start, bounds, MAP_FTOL) for start in starts]
        best = min(results, key=lambda r: r.fun)
        return Kernel.from_theta(best.x), float(best.fun)

    def fit(self, X, y, new_share: int = 10):
        # Hyperparameters are re-estimated once 1/new_share of the data (a tenth) came since
        # the last estimate (every round early on); in between the GP is conditioned on the
        # new data with the last estimate, which changes little and saves most of a round's
        # time.
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        grown = len(y) - self._estimated_on >= max(1, len(y) // new_share)
        optimise = len(y) >= 3 and (self._estimated_on < 3 or grown)
        if optimise:
            # Where L-BFGS-B starts (the better posterior wins):
            # - the first estimate: from the prior's mode (long length scales, a smooth
            #   function) and from short ones (a rough function). From the first alone the fit
            #   can settle in the mode that calls every difference noise (amplitude at its
            #   floor, noise near 1), and the search then knows nothing.
            # - later: from the last estimate, where the optimum moves little as the data grow
            #   and L-BFGS-B converges in a fraction of the evaluations; and whenever the data
            #   have doubled since the rough start last ran, from the rough start as well, so
            #   that a rougher mode that the data have come to favour (a knob that has begun
            #   to matter) is not missed while the warm starts follow the old one. The rough
            #   start beat the prior's mode by more than 0.5 nats in 13 of 59 such refits; the
            #   prior's mode, once past, is where the warm starts come from. Running both fixed
            #   starts at every doubling instead cost 14-38% more of the fits' evaluations
            #   for the same search (benchmarks/RESULTS.md, "the rough start at a doubling").
            first = self._estimated_on < 3
            check = first or len(y) >= 2 * self._checked_on
            if check:
                self._checked_on = len(y)
            self._estimated_on = len(y)
            starts = [self.start.theta if first else self.kernel.theta]
            if check:
                starts.append(self._rough_start())
            self.kernel, minimum = self._map(X, y, starts)
        self.posterior = Posterior(self.kernel, X, y)
        if optimise:
            self._log_evidence_std = -minimum
        else:
            self._log_evidence_std = self.posterior.log_likelihood - self._neg_log_prior()
        self.training_data = (X, y)
        self.cv_scale = _spread_factor(self.posterior)

    def condition(self, X, y):
        other = copy.copy(self)
        other.posterior = Posterior(self.kernel, np.asarray(X), np.asarray(y))
        return other

    @property
    def estimated(self) -> bool:
        """Whether the hyperparameters were estimated from data (not the starting guess)."""
        return self._estimated_on >= 3

    def with_kernel(self, kernel: Kernel) -> GaussianProcess:
        """A copy conditioned on the same data under other hyperparameters (no estimate)."""
        other = copy.copy(self)
        other.kernel = kernel
        X, y = self.training_data
        other.posterior = Posterior(kernel, X, y)
        other.cv_scale = _spread_factor(other.posterior)
        return other

    def hyperparameter_draws(self, count: int, rng: np.random.Generator) -> list[Kernel]:
        """Hyperparameters drawn from the Laplace approximation of their posterior given the
        data: a normal around the present estimate whose precision is the MAP objective's
        Hessian there. Its eigenvalues are floored at the length-scale prior's precision, so
        that no direction is drawn wider than that prior (a flat likelihood, or an estimate
        that is not an exact optimum, would leave a direction unbounded). Within the
        bounds. On few data they spread widely; as the data grow they close in on the
        estimate."""
        X, y = self.training_data
        t, _, _ = standardise(y)
        theta = self.kernel.theta
        H = hessian_of_neg_log_posterior(
            theta, pair_sq_diffs(X), t, self.log_ls_mean, self.log_ls_var
        )
        if H is None or not np.all(np.isfinite(H)):
            return [self.kernel] * count
        values, vectors = np.linalg.eigh(H)
        root = vectors / np.sqrt(np.maximum(values, 1.0 / self.log_ls_var))
        low, high = np.array(self._bounds()).T
        return [
            Kernel.from_theta(np.clip(theta + root @ rng.standard_normal(len(theta)), low, high))
            for _ in range(count)
        ]

    def predict(self, X):
        if self.posterior is None:
            return self.predict_explained(X)[:2]
        mean, sd = self.posterior.predict(X)  # in blocks: no V over a whole space
        return mean, self._spread(sd)

    def _spread(self, sd: np.ndarray) -> np.ndarray:
        """The posterior's spread widened by the leave-one-out factor (floored above 0)."""
        return np.maximum(sd * self.cv_scale, 1e-9)

    def predict_explained(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`predict`, and the rows' V = L^-1 k(X_train, X) from the same pass (the believer's
        rank-one updates need it; no rows before any fit)."""
        if self.posterior is None:  # the prior: mean 0, the kernel's own spread
            sd = np.maximum(np.sqrt(self.kernel.variance(len(X))), 1e-9)
            return np.zeros(len(X)), sd, np.zeros((0, len(X)))
        mean, sd, V = self.posterior.predict_explained(X)
        return mean, self._spread(sd), V

    def fantasies(self, X_c: np.ndarray) -> GPFantasies:
        return GPFantasies(self, X_c)

    def log_evidence(self) -> float:
        assert self.posterior is not None, "fit first"
        # The value is for the standardised targets: p(y) = p(y_std) / std^n.
        n = len(self.posterior.y)
        return float(self._log_evidence_std - n * np.log(self.posterior.y_std))


def _spread_factor(posterior: Posterior) -> float:
    """The factor on a GP's predictive spread (`GaussianProcess.cv_scale`). The marginal
    likelihood sets the spread on few points as if the kernel were right; where the GP's own
    held-out errors are larger than it predicts, they widen it. An overconfident model stops a
    search from exploring; a cautious one costs less."""
    return max(1.0, float(np.sqrt(np.mean(posterior.loo_z_scores() ** 2))))


class GPFantasies(Fantasies):
    """The kriging believer on a GP, exactly and without refitting: believing the posterior
    mean at a pick leaves every posterior mean where it was (the observation equals its own
    expectation) and shrinks each candidate's variance by a rank-one term, its posterior
    covariance with the pick (given the picks before it) squared over the pick's predictive
    variance (noise included). The hyperparameters and the targets' standardisation are those
    of the last fit, as the believer intends. Each pick costs O(candidates x (data + picks))
    instead of a GP refit, and a candidate added later costs the same per pick believed."""

    spread_only_shrinks = True

    def __init__(self, gp: GaussianProcess, X_c: np.ndarray):
        self._gp = gp
        self._kernel = gp.kernel
        if gp.posterior is None:  # the prior: no data to condition on yet
            self._scale, n_data = 1.0, 0
        else:
            self._scale, n_data = gp.posterior.y_std * gp.cv_scale, len(gp.posterior.L)
        self._X = np.zeros((0, X_c.shape[1]))
        self._V = np.zeros((n_data, 0))  # L^-1 k(X_train, X): what the data explain
        self._U = np.zeros((0, 0))  # row k: the variance update of the k-th pick, per candidate
        # Per pick: its features, its column of V, the earlier picks' updates at it, and the
        # root of its predictive variance when it was believed (what its update divides by).
        self._picks: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = []
        self.mean = np.zeros(0)
        self._var = np.zeros(0)
        self.sd = np.zeros(0)
        self.extend(X_c)

    def _update(self, X: np.ndarray, V: np.ndarray, U: np.ndarray, k: int) -> np.ndarray:
        """Pick k's variance update at rows X (V: their columns of L^-1 k(X_train, X); U:
        their updates by the picks before k): the posterior covariance of f there with f at
        the pick, given the earlier picks (the white-noise term is zero between distinct
        inputs), in the targets' units, over the root of the pick's predictive variance."""
        x_p, v_p, earlier_at_p, root = self._picks[k]
        c = self._scale**2 * (self._kernel.cross(X, x_p[None, :])[:, 0] - V.T @ v_p)
        for m in range(k):  # given the picks before this one, in the order believed
            c = c - U[m] * earlier_at_p[m]
        return c / root

    def extend(self, X_new: np.ndarray) -> None:
        mean, sd, V = self._gp.predict_explained(X_new)
        U = np.zeros((len(self._picks), len(X_new)))
        var = sd.astype(np.float64) ** 2
        for k in range(len(self._picks)):
            U[k] = self._update(X_new, V, U, k)
            var = np.maximum(var - U[k] ** 2, 0.0)
        if self._picks:
            sd = np.maximum(np.sqrt(var), 1e-9)
        self._X = np.vstack([self._X, X_new])
        self._V = np.hstack([self._V, V])
        self._U = np.hstack([self._U, U]) if len(self._picks) else np.zeros((0, len(self._X)))
        self.mean = np.concatenate([self.mean, mean])
        self._var = np.concatenate([self._var, var])
        self.sd = np.concatenate([self.sd, sd])

    def believe(self, i: int) -> None:
        root = float(np.sqrt(self._var[i]))
        self._picks.append((self._X[i].copy(), self._V[:, i].copy(), self._U[:, i].copy(), root))
        u = self._update(self._X, self._V, self._U, len(self._picks) - 1)
        self._U = np.vstack([self._U, u[None, :]])
        self._var = np.maximum(self._var - u**2, 0.0)
        self.sd = np.maximum(np.sqrt(self._var), 1e-9)


class ExtraTrees(Surrogate):
    def __init__(self, n_features: int, seed: int, n_trees: int = 64):
        self.seed = seed
        self.n_trees = n_trees
        self.forest: ExtraTreesRegressor | None = None
        self.training_data = (np.zeros((0, n_features)), np.zeros(0))

    def fit(self, X, y):
        from sklearn.ensemble import ExtraTreesRegressor

        self.training_data = (np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64))
        self.forest = ExtraTreesRegressor(
            n_estimators=self.n_trees, bootstrap=True, random_state=self.seed, n_jobs=1
        ).fit(X, y)

    def condition(self, X, y):
        other = ExtraTrees(X.shape[1], self.seed, self.n_trees)
        other.fit(X, y)
        return other

    def predict(self, X):
        assert self.forest is not None, "fit first"
        per_tree = np.stack([t.predict(X) for t in self.forest.estimators_])
        return per_tree.mean(axis=0), np.maximum(per_tree.std(axis=0), 1e-9)


SURROGATES = {"gp": GaussianProcess, "extra_trees": ExtraTrees}


class FailureModel:
    """P(a configuration runs) from the trials so far: 1 until a trial has failed."""

    def __init__(self, seed: int, n_trees: int = 24):
        self.seed = seed
        self.n_trees = n_trees
        self.classifier: ExtraTreesClassifier | None = None

    def fit(self, X: np.ndarray, ok: np.ndarray, weight: np.ndarray | None = None) -> None:
        ok = np.asarray(ok, dtype=bool)
        if ok.all() or not ok.any():
            # One class only: nothing to separate. All failed is handled by the caller (it
            # keeps exploring); all succeeded means no failure region is known yet.
            self.classifier = None
            return
        from sklearn.ensemble import ExtraTreesClassifier

        self.classifier = ExtraTreesClassifier(
            n_estimators=self.n_trees, random_state=self.seed, n_jobs=1
        ).fit(X, ok, sample_weight=weight)

    def p_ok(self, X: np.ndarray) -> np.ndarray:
        if self.classifier is None:
            return np.ones(len(X))
        column = list(self.classifier.classes_).index(True)
        return self.classifier.predict_proba(X)[:, column]

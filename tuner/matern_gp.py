"""Exact Gaussian-process regression with a Matérn 5/2 kernel (one length scale per feature)
plus white noise, on standardised targets: the numbers scikit-learn's
`GaussianProcessRegressor(kernel=C * Matern(nu=2.5) + White, normalize_y=True)` computes
(tests/test_tuner_bo.py compares them), in a few numpy and LAPACK calls.

Written here rather than called through scikit-learn because a proposal round fits and
queries GPs dozens of times and scikit-learn's kernel objects, parameter validation and
cloning cost as much per call as the arithmetic (benchmarks/RESULTS.md, "the GP without
scikit-learn's machinery"); the tuner's service replicas spend most of their CPU here.

No triangular solve against many right-hand sides (BLAS's trsm): the inverse of the Cholesky
factor (LAPACK's dtrtri, or dpotri for the covariance's inverse) and a matrix product instead.
OpenBLAS's trsm runs at a fraction of its gemm's speed on some CPUs (on an AVX-512 Xeon, 2.4
GFLOP/s against gemm's 30 for 64 training points and a space of 2,840 rows, four to six
times slower than the inverse and product; benchmarks/RESULTS.md, "the GP without
triangular solves"), and gemm is what every BLAS tunes first. The training sets are a few
hundred points at most, where the explicit triangular inverse loses nothing that matters.

- `Kernel`: the hyperparameters and the covariance they define.
- `neg_log_posterior`: the objective the hyperparameters are fit on (MAP), with its gradient.
- `Posterior`: the GP conditioned on training data; predictions, leave-one-out z-scores.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import lapack
from scipy.spatial.distance import cdist, pdist, squareform

SQRT5 = np.sqrt(5.0)
GP_JITTER = 1e-10  # added to the training covariance's diagonal (scikit-learn's `alpha`)
LOG_NOISE_PRIOR_MEAN = -4.0  # log noise variance ~ N(-4, 1)
# Rows per block when predicting over a whole space (`Posterior.predict`): the cross
# covariance and its solve are (training points x rows) each, with as many temporaries, so
# that one pass over a space of 262,144 rows at 100 trials held a gigabyte; blocks bound it
# to a few megabytes whatever the space's size.
PREDICT_BLOCK_ROWS = 4096


@dataclass(frozen=True)
class Kernel:
    """amplitude * Matern52(length_scales) + noise * [x == x'] (the noise only on the training
    covariance's diagonal and in a prediction's own variance)."""

    amplitude: float
    length_scales: np.ndarray
    noise: float

    @property
    def theta(self) -> np.ndarray:
        """Log amplitude, log length scales, log noise (scikit-learn's order)."""
        return np.log(np.hstack([self.amplitude, self.length_scales, self.noise]))

    @classmethod
    def from_theta(cls, theta: np.ndarray) -> Kernel:
        values = np.exp(np.asarray(theta, dtype=np.float64))
        return cls(float(values[0]), values[1:-1], float(values[-1]))

    def _matern(self, r: np.ndarray) -> np.ndarray:
        """amplitude * (1 + s + s^2 / 3) * exp(-s), s = sqrt(5) r, in place where it can be:
        over a whole space (candidates x training points) each temporary the expression
        allocates is megabytes, and allocating them cost a third of the time. The same
        operations in the same order: the same bits (tests/test_tuner_bo.py)."""
        s = np.multiply(r, SQRT5)
        square = np.multiply(s, s)
        square /= 3.0
        k = np.negative(s)
        np.exp(k, out=k)
        s += 1.0
        s += square
        k *= s
        k *= self.amplitude
        return k

    def cross(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Covariance of f between the rows of X and of Y (no noise: distinct inputs)."""
        ls = self.length_scales
        return self._matern(cdist(X / ls, Y / ls, metric="euclidean"))

    def train(self, X: np.ndarray) -> np.ndarray:
        """The training covariance: f's among the rows of X, plus noise and jitter."""
        K = squareform(self._matern(pdist(X / self.length_scales, metric="euclidean")))
        K.flat[:: len(X) + 1] = self.amplitude + self.noise + GP_JITTER
        return K

    def variance(self, n: int) -> np.ndarray:
        """A new observation's own variance at each of n rows: f's plus the noise."""
        return np.full(n, self.amplitude + self.noise)


@functools.lru_cache(maxsize=4)  # a fit evaluates one n many times; rounds move on
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows i < j of every distinct pair of n training points, and where (j, i) lies in an
    n x n Fortran-ordered array (the lower triangle LAPACK reads and writes)."""
    rows, cols = np.triu_indices(n, 1)
    for a in (rows, cols):
        a.flags.writeable = False
    lower = cols + rows * n
    lower.flags.writeable = False
    return rows, cols, lower


def pair_sq_diffs(X: np.ndarray) -> np.ndarray:
    """The squared difference per feature of every pair of distinct rows i < j of X (the
    order of np.triu_indices): what `neg_log_posterior` needs of the training inputs."""
    rows, cols, _ = _pairs(len(X))
    return (X[rows] - X[cols]) ** 2


def neg_log_posterior(
    theta: np.ndarray, D2: np.ndarray, t: np.ndarray, log_ls_mean: float, log_ls_var: float
) -> tuple[float, np.ndarray]:
    """-log marginal likelihood - log prior of standardised targets `t`, and its gradient in
    theta (log amplitude, log length scales, log noise variance); priors: log length scale ~
    N(log_ls_mean, log_ls_var), log noise ~ N(LOG_NOISE_PRIOR_MEAN, 1), constants dropped.
    D2: `pair_sq_diffs` of the training inputs. The kernel is symmetric and its diagonal
    known, so only the distinct pairs are computed (exp and sqrt are most of the cost)."""
    n = len(t)
    rows, cols, lower = _pairs(n)
    amplitude, noise = np.exp(theta[0]), np.exp(theta[-1])
    inv_ls2 = np.exp(-2.0 * theta[1:-1])
    r2 = D2 @ inv_ls2
    r = np.sqrt(r2)
    e = np.exp(-SQRT5 * r)
    poly = 1.0 + SQRT5 * r
    k = amplitude * (poly + (5.0 / 3.0) * r2) * e  # the kernel at each pair
    K = np.zeros((n, n), order="F")
    K.ravel(order="K")[lower] = k  # the lower triangle: all dpotrf reads
    K.flat[:: n + 1] = amplitude + noise + GP_JITTER
    # LAPACK directly (Cholesky, solves): scipy.linalg's wrappers check and copy their
    # arguments on each of the hundreds of calls a fit makes.
    L, info = lapack.dpotrf(K, lower=1, clean=0, overwrite_a=1)
    if info != 0:
        return np.inf, np.zeros_like(theta)  # as scikit-learn: an impossible theta
    alpha, _ = lapack.dpotrs(L, t, lower=1)
    # K^-1's lower triangle (all the gradient reads), by dpotri: 2n^3/3 flops, not the 2n^3 of
    # two triangular solves against the identity (and no trsm; see the module's docstring).
    K_inv, _ = lapack.dpotri(L, lower=1)
    lml = -0.5 * t @ alpha - np.log(np.diagonal(L)).sum() - 0.5 * n * np.log(2 * np.pi)
    # d lml / d theta = tr(W dK/dtheta) / 2 with W = alpha alpha^T - K^-1: the diagonal's
    # share, and each distinct pair's twice.
    w = alpha[rows] * alpha[cols] - K_inv.ravel(order="K")[lower]
    trace_w = float(alpha @ alpha - np.trace(K_inv))
    grad = np.empty_like(theta)
    grad[0] = 0.5 * amplitude * trace_w + w @ k
    # d k / d log l_k = amplitude * 5/3 (1 + sqrt5 r) exp(-sqrt5 r) (x_k - x'_k)^2 / l_k^2
    grad[1:-1] = ((w * (amplitude * (5.0 / 3.0)) * poly * e) @ D2) * inv_ls2
    grad[-1] = 0.5 * noise * trace_w
    dev = theta[1:-1] - log_ls_mean
    value = -lml + neg_log_hyperprior(theta, log_ls_mean, log_ls_var)
    grad = -grad
    grad[1:-1] += dev / log_ls_var
    grad[-1] += theta[-1] - LOG_NOISE_PRIOR_MEAN
    return float(value), grad


def neg_log_hyperprior(theta: np.ndarray, log_ls_mean: float, log_ls_var: float) -> float:
    """The hyperprior's -log density at theta (constants dropped): normal in each log length
    scale, and in the log noise about LOG_NOISE_PRIOR_MEAN with unit variance."""
    dev = theta[1:-1] - log_ls_mean
    value = float(np.sum(dev**2)) / (2 * log_ls_var)
    return value + float(theta[-1] - LOG_NOISE_PRIOR_MEAN) ** 2 / 2


def hessian_of_neg_log_posterior(
    theta: np.ndarray, D2: np.ndarray, t: np.ndarray, log_ls_mean: float, log_ls_var: float
) -> np.ndarray | None:
    """The Hessian of `neg_log_posterior` in theta, by forward differences of its analytic
    gradient (symmetrised); None where the covariance is not positive definite there."""
    step = 1e-4
    _, at = neg_log_posterior(theta, D2, t, log_ls_mean, log_ls_var)
    H = np.empty((len(theta), len(theta)))
    for i in range(len(theta)):
        moved = theta.copy()
        moved[i] += step
        value, grad = neg_log_posterior(moved, D2, t, log_ls_mean, log_ls_var)
        if not np.isfinite(value):
            return None
        H[i] = (grad - at) / step
    return 0.5 * (H + H.T)


def standardise(y: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Targets scaled to mean 0 and standard deviation 1 (1 where they are all equal)."""
    if len(y) and np.all(y == y[0]):
        # Exactly: np.mean of equal values can miss them by a rounding error, and np.std
        # then makes that error the unit (1e-15 of them) and every target +-1.
        return np.zeros(len(y)), float(y[0]), 1.0
    mean = float(np.mean(y))
    std = float(np.std(y))
    std = std if std != 0.0 else 1.0
    return (y - mean) / std, mean, std


class Posterior:
    """The GP with `kernel` conditioned on (X, y), y standardised first."""

    def __init__(self, kernel: Kernel, X: np.ndarray, y: np.ndarray):
        self.kernel = kernel
        self.X = np.asarray(X, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.float64)
        t, self.y_mean, self.y_std = standardise(self.y)
        L, info = lapack.dpotrf(kernel.train(self.X), lower=1, clean=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"training covariance not positive definite ({info})")
        self.L = L
        self.alpha, _ = lapack.dpotrs(L, t, lower=1)
        n = len(t)
        self.log_likelihood = float(
            -0.5 * t @ self.alpha - np.log(np.diagonal(L)).sum() - 0.5 * n * np.log(2 * np.pi)
        )

    @functools.cached_property
    def L_inv(self) -> np.ndarray:
        """The inverse of the training covariance's Cholesky factor (lower triangular): what
        the spread at new rows and the leave-one-out residuals are computed with."""
        L_inv, _ = lapack.dtrtri(self.L, lower=1)  # never singular: dpotrf succeeded
        return L_inv

    def explain(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """At rows X, in the standardised units: the posterior mean, the predictive variance
        (noise included) and V = L^-1 k(X_train, X), what the data explain of each row."""
        K_cross = self.kernel.cross(self.X, X)
        mean = self.alpha @ K_cross
        V = self.L_inv @ K_cross  # L^-1 k(X_train, X), by gemm (see the module's docstring)
        variance = self.kernel.variance(len(X)) - np.einsum("ij,ij->j", V, V)
        return mean, np.maximum(variance, 0.0), V

    def mean(self, X: np.ndarray) -> np.ndarray:
        """The posterior mean at X in the targets' units (without the spread, which costs
        a triangular solve over every row), in blocks of PREDICT_BLOCK_ROWS rows as `predict`
        (its cross covariance is as large as `predict`'s)."""
        mean = np.empty(len(X))
        for start in range(0, len(X), PREDICT_BLOCK_ROWS):
            block = slice(start, start + PREDICT_BLOCK_ROWS)
            mean[block] = self.alpha @ self.kernel.cross(self.X, X[block])
        return self.y_std * mean + self.y_mean

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation (noise included) at X, in the targets' units, in
        blocks of PREDICT_BLOCK_ROWS rows (each row's figures depend on that row alone)."""
        mean = np.empty(len(X))
        sd = np.empty(len(X))
        for start in range(0, len(X), PREDICT_BLOCK_ROWS):
            block = slice(start, start + PREDICT_BLOCK_ROWS)
            mean[block], sd[block], _ = self.predict_explained(X[block])
        return mean, sd

    def predict_explained(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`predict`, and V (`explain`) from the same pass over the rows."""
        mean, variance, V = self.explain(X)
        return self.y_std * mean + self.y_mean, self.y_std * np.sqrt(variance), V

    def loo_z_scores(self) -> np.ndarray:
        """Each training point's leave-one-out residual over its leave-one-out predictive
        standard deviation, in closed form (Rasmussen and Williams, eq. 5.12): with K the
        training covariance (noise included) and alpha = K^-1 t, the residual is alpha_i /
        [K^-1]_ii and the variance 1 / [K^-1]_ii. The mean of their squares is the posterior
        scale that leave-one-out cross-validation would choose (Sundararajan and Keerthi,
        2001): above 1, the GP is more confident than its errors on its own data."""
        K_inv_diag = np.einsum("ij,ij->j", self.L_inv, self.L_inv)  # diag(L^-T L^-1)
        return self.alpha / np.sqrt(K_inv_diag)

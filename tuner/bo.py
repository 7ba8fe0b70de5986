"""Model-based search with an uncertainty: `bo` (knob-only) and, with a prior mean, the
machinery behind `analytical+xgb` and transfer from another GPU.

One round:
1. Until there is something to model, a design that represents the space (tuner/design.py).
   With a prior mean (the analytical model, or the same kernel measured on another GPU) there
   is something to model from the start: the first batch is the prior's best guesses.
2. A surrogate of log throughput with an uncertainty (tuner/surrogate.py), fit to the
   successful trials only; with a prior it models the residual (measurement - b * prior, b
   the least-squares slope of the measurements on the prior), so the measurements correct
   the prior where they are and the prior ranks elsewhere.
3. A classifier of the failing region, fit to every trial (failed or not).
4. Expected improvement times P(runs) over every unvisited configuration (the spaces are a
   few thousand to tens of thousands of rows: exact, no annealing needed; past CANDIDATE_POOL
   unvisited rows, over a seeded sample of them and the trust region's rows, `_scored_rows`),
   and a diverse batch by the kriging believer (tuner/acquisition.py), every pick of it the
   best of its whole pool given the picks before it. Picks come from the whole space and from the
   configurations within a few knob changes of the best one measured (a trust region, as in
   local-search BO such as TuRBO and BaCO's local acquisition search), alternately one trial
   at a time and one in three from the whole space in a batch (`_pools`): the global picks
   explore, the local ones refine, and neither starves. The region's radius
   follows TuRBO's rule: it starts at two knob changes, shrinks by one after three local
   trials in a row fail to beat the best measurement, and grows by one after two in a row
   do (between one and three), so that a refinement that keeps missing narrows to single
   knob changes, and one that keeps winning looks further. Without a prior and on few
   trials, a batch's picks after its first are made under hyperparameters drawn from their
   posterior, as single trials are each made under a fresh estimate (`_batch`).
5. A prior that the measurements contradict is dropped: each round the GP on the residuals
   and the GP on the measurements alone are compared by their marginal likelihood, and the
   better explanation of the data drives the round (the fallback a transfer needs). The
   comparison waits until the measurements can judge the prior: the first trials are the
   prior's own best guesses, which span a sliver of its range, and among them its ranking
   says little (a restriction of range: their slope on the prior is near zero whether the
   prior is right or wrong). Until the slope is known better than the prior belief about
   it, the prior stays, and the GP on the measurements alone (needed only to compare) is not
   fitted; while the prior leads by a decisive margin, that GP's hyperparameters are
   re-estimated only as the data double (on the benchmark sets the proposals are the same),
   and while it trails by one, the prior's GP's are; where the slope is clipped to 0 the prior
   adds nothing, and its GP is not fitted at all.

Everything is deterministic given the seed and the history (scikit-learn models are seeded,
BLAS runs on one thread during a round), so the service can replay a session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from pipetune.tuner.acquisition import believer_batch, constrained_score
from pipetune.tuner.design import design_rows
from pipetune.tuner.encoding import KnobEncoding
from pipetune.tuner.strategy_base import Observation, Strategy
from pipetune.tuner.surrogate import SURROGATES, FailureModel, GaussianProcess, Surrogate

N_INIT = 8  # design points before the first model (no prior); also one service batch
MIN_FIT = 3  # successful trials before the surrogate's hyperparameters are fit
LOCAL_KNOB_CHANGES = 2  # the trust region's starting radius, in knob changes
RADIUS_RANGE = (1, 3)
# In a batch, the slots that draw from the whole space: the first and every third after it
# (one trial at a time, every other trial; see `_pools`).
GLOBAL_EVERY = 3
# TuRBO's rule, on knob changes: the radius grows after SUCCESSES local trials in a row
# improve the best measurement, and shrinks after FAILURES in a row do not.
SUCCESSES, FAILURES = 2, 3
# Before any measurement a prior's error is unknown: assume 10% (0.1 in log throughput),
# correlated over half of each knob's range. This only spreads the first batch; from the
# first measurements on, the GP's own fit replaces it.
PRIOR_SD = 0.1
PRIOR_LENGTH_SCALE = 0.5
# The slope b of the measurements on a prior (its scale on this GPU) is believed to be
# N(1, SLOPE_SD^2) before any measurement: two standard deviations span the [0, 2] it is
# clipped to. The data's least-squares estimate updates it by their relative precisions.
SLOPE_SD = 0.5
# Repeated timings of one kernel differ by about a percent: differences among measurements
# below that say nothing about the slope (three equal timings are not a slope of exactly 0).
MEASUREMENT_SD = 0.01  # in log throughput
# Log evidence by which the prior's model must lead for the plain GP's hyperparameters to be
# refreshed less often: twice Jeffreys' "decisive" (ln 100).
LEAD_MARGIN = 10.0
OBSERVED_WEIGHT = 10.0  # a trial on this GPU outweighs a recorded failure on another one
# Found once: a bare `threadpool_limits()` looks for the loaded BLAS libraries on every call
# (about 6 ms, as much as a round's acquisition).
_THREADPOOLS = ThreadpoolController()
# Rows of the feature matrix one prediction over the unvisited space indexes at once.
PREDICT_ROWS = 8192
# The most unvisited rows a round scores whole; past it, a sample of this many and the trust
# region (`BayesianStrategy._scored_rows`). Above the largest space of the development set
# (17,956 configurations) and pipetune's own schedule spaces (a few thousand schedules), whose
# rounds are therefore the same as before it.
CANDIDATE_POOL = 1 << 16


def one_blas_thread_per_caller() -> None:
    """BLAS on one thread for the rest of the process. Each round's own limit (next_batch)
    saves the process-wide count and restores it: with sessions proposing in several threads
    at once (the service's proposer), the first to finish restored every core's threads under
    another still proposing, whose sums then depended on the timing."""
    _THREADPOOLS.limit(limits=1)


def _predict_rows(model: Surrogate, features: np.ndarray, rows: np.ndarray) -> tuple[Any, Any]:
    """model.predict(features[rows]), a block of rows at a time: indexing them all at once
    copied the feature matrix each round (0.8 GB for 200,000 configurations of a 500-valued
    categorical knob, one-hot). Each row's prediction depends on that row alone."""
    mean, sd = np.empty(len(rows)), np.empty(len(rows))
    for start in range(0, len(rows), PREDICT_ROWS):
        block = slice(start, start + PREDICT_ROWS)
        mean[block], sd[block] = model.predict(features[rows[block]])
    return mean, sd


@dataclass(frozen=True)
class PriorMean:
    """A prior guess of log throughput for every row of a space (higher is better).

    A transfer prior also says which rows it has a record of (`recorded`) and which of those
    failed there (`failed`): they teach the failure classifier, with less weight than the
    trials made here. `values` is filled for every row (see tuner/transfer.py). `sampled`: the
    record is a sample of the space (a tuning task's trials), so a row it lacks was not
    measured there, rather than not valid there.
    """

    values: np.ndarray
    source: str
    recorded: np.ndarray | None = None
    failed: np.ndarray | None = None
    sampled: bool = False


class BayesianStrategy(Strategy):
    name = "bo"

    def __init__(
        self,
        space: Any,
        rng: np.random.Generator,
        *,
        seed: int,
        prior: PriorMean | None = None,
        surrogate: str = "gp",
        n_init: int = N_INIT,
        name: str | None = None,
        local: bool = True,
        target: str = "log",
    ):
        """`surrogate`, `local` and `target` select the alternatives that were measured against
        the defaults (benchmarks/RESULTS.md): an extra-trees surrogate, no trust-region picks,
        a Yeo-Johnson transform of log throughput (HEBO's warping)."""
        super().__init__(space, rng)
        if prior is not None and surrogate != "gp":
            raise ValueError("a prior needs the GP surrogate (its likelihood decides the fallback)")
        if name is not None:
            self.name = name
        self.seed = seed
        self.prior = prior
        self.n_init = n_init
        self.local = local
        self.target = target
        self.encoding = KnobEncoding.of(space)
        self.features = self.encoding.features
        n_features = self.features.shape[1]
        self.surrogate_kind = surrogate
        self._plain: Surrogate = SURROGATES[surrogate](n_features, seed)
        self._residual: Surrogate | None = None
        if prior is not None:
            if len(prior.values) != len(self.encoding):
                raise ValueError(
                    f"prior {prior.source}: {len(prior.values)} values for a space of "
                    f"{len(self.encoding)}"
                )
            self._residual = GaussianProcess(
                n_features, seed, length_scale=PRIOR_LENGTH_SCALE, sd=PRIOR_SD
            )
        self.failures = FailureModel(seed)
        self._design: list[int] | None = None
        self.last_used_prior: bool | None = None  # which model drove the last round
        self.radius = LOCAL_KNOB_CHANGES
        self._local_rows: set[int] = set()  # trials proposed from the trust region
        self._judged = 0  # observations the radius has been updated from
        self._best_judged = -np.inf  # the best log throughput among them
        self._streak = 0  # > 0: local successes in a row; < 0: local failures in a row
        self._lead = 0.0  # log evidence of the prior's GP minus the plain one's, last round

    # ---- design ------------------------------------------------------------------------

    def _design_rows(self, n: int, exclude: set[int]) -> list[int]:
        if self._design is None:
            self._design = design_rows(self.encoding, max(2 * self.n_init, 16), self.seed)
        picked = [r for r in self._design if r not in exclude][:n]
        if len(picked) < n:  # the design is used up (many failures): random unvisited rows
            seen = exclude | set(picked)
            for r in self.rng.permutation(len(self.encoding)).tolist():
                if r not in seen:
                    picked.append(r)
                    if len(picked) == n:
                        break
        return picked

    # ---- one round ---------------------------------------------------------------------

    def next_batch(self, n, exclude, history):
        with _THREADPOOLS.limit(limits=1):  # reproducible sums, and one core per session
            return self._next_batch(n, exclude, history)

    def _update_radius(self, history: list[Observation]) -> None:
        """Judge the trust-region trials measured since the last round, in order: a success
        improves on every measurement before it."""
        best = self._best_judged
        for o in history[self._judged :]:
            value = -np.inf if o.failed else -np.log(o.latency_s)
            if o.row in self._local_rows:
                won = value > best
                self._streak = max(self._streak, 0) + 1 if won else min(self._streak, 0) - 1
                if self._streak >= SUCCESSES:
                    self.radius, self._streak = min(self.radius + 1, RADIUS_RANGE[1]), 0
                elif self._streak <= -FAILURES:
                    self.radius, self._streak = max(self.radius - 1, RADIUS_RANGE[0]), 0
            best = max(best, value)
        self._judged, self._best_judged = len(history), best

    def _next_batch(self, n: int, exclude: set[int], history: list[Observation]) -> list[int]:
        self._update_radius(history)
        rows = np.array([o.row for o in history], dtype=np.int64)
        ok = np.array([not o.failed for o in history], dtype=bool)
        n_ok = int(ok.sum())
        if self.prior is None and (len(exclude) < self.n_init or n_ok < 2):
            return self._design_rows(n, exclude)
        if self.prior is not None and n_ok == 0 and len(history) >= self.n_init:
            # Everything the prior pointed to failed here: with no measurement to fit, the
            # GP's mean is the prior's ranking, and with no success the failure classifier
            # has one class (it learns nothing), so the search would go on down that ranking,
            # failing, to the end of its budget (a GPU that cannot run the prior's favourite
            # kind of schedule). The space-filling design finds what runs, as `bo` starts.
            return self._design_rows(n, exclude)
        y = -np.log(np.array([o.latency_s for o in history if not o.failed], dtype=np.float64))
        ok_rows = rows[ok]
        X_ok = self.features[ok_rows]
        offset = np.zeros(len(self.encoding))
        model = self._plain
        use_prior = False
        y_plain = self._transform(y)
        judged = self.prior is not None and self._prior_judged(y, ok_rows)
        # The GP of the measurements alone is what a prior is judged against: while the
        # prior cannot be judged it is not needed, and while the prior leads it decisively
        # its hyperparameters are refreshed only when the data have doubled (its evidence
        # with older ones is a little lower: a lead of LEAD_MARGIN covers that).
        if n_ok >= 2 and (self.prior is None or judged):
            if self._lead > LEAD_MARGIN and isinstance(self._plain, GaussianProcess):
                self._plain.fit(X_ok, y_plain, new_share=2)
            else:
                self._plain.fit(X_ok, y_plain)
        if self._residual is not None and self.prior is not None:
            scale = self._scale(y, ok_rows)
            prior = scale * self.prior.values
            residual = y - prior[ok_rows]
            # A prior whose slope on the measurements is clipped to 0 adds nothing: the GP of
            # the residuals would model the measurements alone, as the plain one does, and
            # their evidence would differ only by where each fit stopped (a coin toss that
            # kept a backwards prior in play). The prior is not used then, and its GP is not
            # fitted: neither leads.
            useless = judged and scale == 0.0
            if n_ok >= 1 and not useless:
                # While the measurements alone explain the data decisively better, the
                # prior's GP is re-estimated only as the data double (as the plain one is
                # while the prior leads: the margin covers the older estimate's lower
                # evidence).
                trailing = self._lead < -LEAD_MARGIN
                self._residual.fit(X_ok, residual, new_share=2 if trailing else 10)
            use_prior = not judged
            if useless:
                self._lead = 0.0
            elif judged:
                self._lead = self._residual.log_evidence() - self._plain.log_evidence()
                use_prior = self._lead >= 0
            if use_prior:
                model, offset = self._residual, prior
        self.last_used_prior = use_prior
        head: list[int] = []  # design rows that complete the initial design (a prior lost)
        if self.prior is not None and not use_prior:
            # The prior lost: its trials cluster where it pointed, which represents the space
            # no better than one corner. Complete the initial design first, as `bo` would
            # have started.
            # (Proposed, not measured: a design row still pending is not missing.)
            designed = len(set(self._design_rows(self.n_init, set())) & exclude)
            if designed < self.n_init:
                head = self._design_rows(min(n, self.n_init - designed), exclude)
                if len(head) == n:
                    return head
                # The rest of the batch from the model, the design rows believed as pending:
                # returned alone, they were a short batch (6 of 8, hundreds of rows left),
                # and the service's workers idled for a round.
                exclude, n = exclude | set(head), n - len(head)
        if not use_prior:
            y = y_plain
        self._fit_failures(rows, ok)
        # The rows not proposed yet, in order: a mask rather than setdiff1d, which sorts the
        # whole space every round.
        open_rows = np.ones(len(self.encoding), dtype=bool)
        open_rows[np.fromiter(exclude, dtype=np.int64, count=len(exclude))] = False
        unvisited = np.flatnonzero(open_rows)
        if len(unvisited) == 0:
            return head
        pending = np.setdiff1d(
            np.fromiter(exclude, dtype=np.int64, count=len(exclude)), rows, assume_unique=True
        )
        in_region = None  # the trust region around the best measurement, over every row
        if n_ok:
            incumbent = int(ok_rows[np.argmax(y)])
            in_region = self.encoding.knob_changes(incumbent) <= self.radius
        scored = self._scored_rows(unvisited, in_region, len(history), len(exclude))
        p_ok = self._p_ok(scored, pending, whole=len(scored) == len(unvisited))
        mean_r, sd = _predict_rows(model, self.features, scored)
        mean = mean_r + offset[scored]
        best = float(y.max()) if n_ok else float(mean.max())
        score = constrained_score(mean, sd, best, p_ok[scored])
        global_pool = scored[np.argsort(-score, kind="stable")]
        local_pool = np.array([], dtype=np.int64)
        if in_region is not None:
            local = np.flatnonzero(in_region[scored])
            local_pool = scored[local[np.argsort(-score[local], kind="stable")]]
        pools = self._pools(min(n, len(unvisited)), len(history), global_pool, local_pool)
        first_score = np.full(len(self.encoding), -np.inf)
        first_score[scored] = score
        picked = self._batch(
            model,
            best,
            offset,
            p_ok,
            pools,
            first_score,
            pending,
            global_pool,
            len(history),
        )
        self._local_rows.update(r for r, p in zip(picked, pools, strict=False) if p is local_pool)
        return head + picked

    def _scored_rows(
        self, unvisited: np.ndarray, in_region: np.ndarray | None, n_history: int, n_exclude: int
    ) -> np.ndarray:
        """The unvisited rows a round scores: all of them, up to CANDIDATE_POOL; past it, a
        seeded uniform sample of CANDIDATE_POOL of them together with the unvisited rows of
        the trust region (a sample of CANDIDATE_POOL of those too, where it is larger), in
        row order.

        Why a sample is enough: the global pick is the best of its pool, and the best of
        65,536 rows drawn at random is in the acquisition's top 0.01% of any space with
        probability 1 - (1 - 1e-4)^65536 = 0.9986; the trust region, where the local picks
        refine the best measurement, is scored whole up to CANDIDATE_POOL rows (it is the
        rows within a few knob changes of one configuration; sampled alike past that). What
        it saves: scoring every row of a space of a million configurations took 5-7 s a
        round on one core, the GP's predictions, the failure classifier's and the sort of
        every score (benchmarks/RESULTS.md, "spaces of a million configurations"). The
        development set's spaces (at most 17,956 rows) and pipetune's own are below the
        threshold: scored whole, as before.

        Seeded by the session's seed, history and proposals, so a replay draws the same."""
        if len(unvisited) <= CANDIDATE_POOL:
            return unvisited
        rng = np.random.default_rng([self.seed, n_history, n_exclude, 11])
        sample = rng.choice(unvisited, size=CANDIDATE_POOL, replace=False)
        if in_region is not None:
            region = unvisited[in_region[unvisited]]
            if len(region) > CANDIDATE_POOL:
                region = rng.choice(region, size=CANDIDATE_POOL, replace=False)
            sample = np.concatenate([sample, region])
        return np.unique(sample)

    def _p_ok(self, scored: np.ndarray, pending: np.ndarray, whole: bool) -> np.ndarray:
        """P(runs) per row, where a round reads it: the scored rows and the pending ones
        (the believer conditions on them). Over the whole space where every unvisited row
        is scored (`whole`); else only there (0 elsewhere, never read), a block of rows at a
        time, as `_predict_rows`."""
        if whole:
            return self.failures.p_ok(self.features)
        needed = np.union1d(scored, pending)
        p_ok = np.zeros(len(self.encoding))
        for start in range(0, len(needed), PREDICT_ROWS):
            block = needed[start : start + PREDICT_ROWS]
            p_ok[block] = self.failures.p_ok(self.features[block])
        return p_ok

    def _batch(
        self,
        model: Surrogate,
        best: float,
        offset: np.ndarray,
        p_ok: np.ndarray,
        pools: list[np.ndarray],
        first_score: np.ndarray,
        pending: np.ndarray,
        global_pool: np.ndarray,
        n_history: int,
    ) -> list[int]:
        """The batch by the kriging believer (tuner/acquisition.py): each pick the best of its
        pool given the picks before it. In a search without a prior, while the GP has fewer
        successful trials than twice its hyperparameters, the picks after the batch's first
        are each made under hyperparameters drawn from their posterior
        (`GaussianProcess.hyperparameter_draws`) instead of the estimate, and each pick
        believes the picks before it, as in the plain believer.

        Why: one trial at a time the hyperparameters are re-estimated before every pick, and
        on few data successive estimates differ (which knobs matter, how rough the space is);
        a batch makes all its picks under one. Re-estimating them only every eight trials cost
        single-trial search 0.011 at k=20 on the development set, half of what batches of eight
        lose there, and the draws win back about half of that (benchmarks/RESULTS.md,
        "hyperparameters drawn for a batch's picks"). On more data the draws gained nothing
        measurable, at up to three times the proposal CPU. With a prior (the analytical
        model, another GPU's measurements) they lost: where the prior drove the round they
        made the search leave its best guesses sooner, and where it had lost to the
        measurements they gained nothing."""
        if (
            self.prior is not None
            or len(pools) < 2
            or not isinstance(model, GaussianProcess)
            or not model.estimated
            or len(model.training_data[1]) >= 2 * len(model.kernel.theta)
        ):
            return believer_batch(
                model, best, self.features, offset, p_ok, pools, first_score, pending=pending
            )
        # Seeded by the session's seed and history: a replay draws the same.
        rng = np.random.default_rng([self.seed, n_history, 7])
        picked: list[int] = []
        kernels = [None, *model.hyperparameter_draws(len(pools) - 1, rng)]
        for pool, kernel in zip(pools, kernels, strict=True):
            surrogate, score, ordered = model, first_score, pool
            if kernel is not None:
                surrogate = model.with_kernel(kernel)
                mean, sd = _predict_rows(surrogate, self.features, pool)
                score = np.full(len(self.encoding), -np.inf)
                score[pool] = constrained_score(mean + offset[pool], sd, best, p_ok[pool])
                ordered = pool[np.argsort(-score[pool], kind="stable")]
            ahead = np.concatenate([pending, np.array(picked, dtype=np.int64)])
            got = believer_batch(
                surrogate, best, self.features, offset, p_ok, [ordered], score, pending=ahead
            )
            if not got:  # the trust region is used up: the best row anywhere
                got = believer_batch(
                    model, best, self.features, offset, p_ok, [global_pool], first_score, ahead
                )
            if not got:
                break
            picked.append(got[0])
        return picked

    def _pools(self, n: int, n_history: int, global_pool, local_pool) -> list[np.ndarray]:
        """Which pool each slot of the batch draws from. One trial at a time, the trials
        alternate between the whole space and the trust region. In a batch, the first slot
        and every GLOBAL_EVERY-th after it draw from the whole space and the others from the
        trust region (of eight: three and five).

        Why fewer global picks in a batch: one at a time, each global pick (the model's bet
        where it knows least) is measured before the next is made, and a miss corrects the
        model; in a batch the later global bets are made by the same unjudged model, while a
        local pick refines near a measured best, where the model's errors matter least. On
        the development set at batch 8 (60 seeds), a third of the slots global instead of
        half gained 0.004-0.010 from k=16 to k=50 and lost nothing at k=100; a quarter or one
        slot global gained as much at k=32 and lost at k=16 or k=100, and a quarter of the
        slots local lost 0.005-0.012 (benchmarks/RESULTS.md, "fewer global picks in a
        batch" and "a batch alternates as single trials do"). The believer keeps the local
        picks apart."""
        if not self.local or not len(local_pool):
            return [global_pool] * n
        if n == 1:
            return [local_pool if n_history % 2 == 1 else global_pool]
        return [global_pool if j % GLOBAL_EVERY == 0 else local_pool for j in range(n)]

    def _slope(self, y: np.ndarray, ok_rows: np.ndarray) -> tuple[float, float] | None:
        """The least-squares slope of the measurements on the prior and its variance, or None
        while it cannot be estimated (fewer than MIN_FIT successes, or one prior value)."""
        assert self.prior is not None
        p = self.prior.values[ok_rows]
        if len(y) < MIN_FIT or np.ptp(p) == 0:
            return None
        pc = p - p.mean()
        sxx = float(pc @ pc)
        slope = float(pc @ (y - y.mean())) / sxx
        residual = y - y.mean() - slope * pc
        noise = max(float(residual @ residual) / max(len(y) - 2, 1), MEASUREMENT_SD**2)
        return slope, noise / sxx

    def _prior_judged(self, y: np.ndarray, ok_rows: np.ndarray) -> bool:
        """Whether the measurements say more about the prior's slope than the belief before
        them: only then may the model comparison drop the prior."""
        fit = self._slope(y, ok_rows)
        return fit is not None and fit[1] < SLOPE_SD**2

    def _scale(self, y: np.ndarray, ok_rows: np.ndarray) -> float:
        """How strongly the prior's differences carry over: the slope of the measurements on
        the prior (a linear prior mean, as in universal kriging), between 0 (no information)
        and 2. Another GPU (or the model) may rank alike but spread the configurations wider
        or narrower. The least-squares estimate and the belief N(1, SLOPE_SD^2) are combined
        by their precisions (the conjugate normal update), so that a few trials among the
        prior's best, whose slope is noise, leave it near 1, and many trials set it."""
        fit = self._slope(y, ok_rows)
        if fit is None:
            return 1.0
        slope, variance = fit
        belief = 1.0 / SLOPE_SD**2
        return float(np.clip((slope / variance + belief) / (1.0 / variance + belief), 0.0, 2.0))

    def _transform(self, y: np.ndarray) -> np.ndarray:
        if self.target == "log" or len(y) < 3 or np.ptp(y) == 0:
            return y
        # Imported here: scikit-learn's import is about half of the service's start (1.5 of
        # 3.1 s), and only this target transform of the knob-only strategies needs it.
        from sklearn.preprocessing import PowerTransformer

        return PowerTransformer(method="yeo-johnson").fit_transform(y[:, None])[:, 0]

    def _fit_failures(self, rows: np.ndarray, ok: np.ndarray) -> None:
        X, labels, weight = self.features[rows], ok, np.full(len(rows), OBSERVED_WEIGHT)
        if self.prior is not None and self.prior.recorded is not None:
            assert self.prior.failed is not None
            known = np.flatnonzero(self.prior.recorded)
            X = np.vstack([X, self.features[known]])
            labels = np.concatenate([labels, ~self.prior.failed[known]])
            weight = np.concatenate([weight, np.ones(len(known))])
        self.failures.fit(X, labels, weight)

"""Model-based search (`bo`, `analytical+xgb`, `auto`): the registry, the initial design, the
failure model, diverse batches, transfer from another GPU and its fallback.

The spaces here are synthetic (test plumbing, not measurements): a foreign space of a few
knobs whose latency is a known function, so each property can be checked exactly.
"""

from __future__ import annotations

import functools
import itertools
import typing

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import ndtr
from shared_datasets import SHARED

from pipetune.model.space import Space
from pipetune.model.wire import DEFAULT_STRATEGY, StrategyName, TaskCreate
from pipetune.model.workloads import gemm
from pipetune.tuner import bo
from pipetune.tuner.acquisition import constrained_score, log_expected_improvement
from pipetune.tuner.bench import run_strategy_rows
from pipetune.tuner.bo import BayesianStrategy, PriorMean
from pipetune.tuner.design import design_rows
from pipetune.tuner.encoding import KnobEncoding
from pipetune.tuner.metrics import random_search_expectation
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.strategies import KNOB_ONLY, STRATEGY_MAP, make_strategy
from pipetune.tuner.strategy_base import Observation, Strategy
from pipetune.tuner.transfer import TransferError, completed_by_model, recorded_prior

CONV_3090 = SHARED / "convolution_RTX_3090.kt-cache.json.gz"

KNOBS = {
    "bx": [16, 32, 64, 128, 256],
    "by": [1, 2, 4, 8],
    "tx": [1, 2, 3, 4],
    "ty": [1, 2, 3, 4],
    "flag": [0, 1],
    "method": ["a", "b", "c"],
}


def synthetic(name: str = "synthetic", shift: float = 0.0, fail_big: bool = True):
    """A smooth landscape with one optimum (bx=64, by=4, tx=2, ty=3, flag=1, method b) and,
    if fail_big, a failing region that borders the optimum (bx * by * tx * ty too large, as
    shared memory would be)."""
    configs, objective = [], []
    for values in itertools.product(*KNOBS.values()):
        c = dict(zip(KNOBS, values, strict=True))
        if c["bx"] * c["by"] > 512:
            continue  # not in the space at all (a restriction)
        ms = 1.0 + (np.log2(c["bx"]) - np.log2(64) - shift) ** 2 * 0.3
        ms += (np.log2(c["by"]) - 2) ** 2 * 0.2 + (c["tx"] - 2) ** 2 * 0.1
        ms += (c["ty"] - 3) ** 2 * 0.15 + (1 - c["flag"]) * 0.3
        ms += {"a": 0.4, "b": 0.0, "c": 0.6}[c["method"]]
        if fail_big and c["bx"] * c["by"] * c["tx"] * c["ty"] > 1536:
            ms = np.inf
        configs.append(c)
        objective.append(ms)
    return RecordedConfigs(name, dict(KNOBS), configs, np.array(objective))


@pytest.fixture(scope="module")
def recorded():
    return synthetic()


@pytest.fixture(scope="module")
def space(recorded):
    return ForeignSpace(recorded)


def _observe(recorded, rows):
    out = []
    for r in rows:
        ms = float(recorded.objective_ms[r])
        ok = bool(np.isfinite(ms))
        out.append(Observation(row=r, latency_s=ms * 1e-3 if ok else None, failed=not ok))
    return out


# ---- the registry -----------------------------------------------------------------------


def test_registry_and_wire_contract_agree():
    assert set(STRATEGY_MAP) == set(typing.get_args(StrategyName))
    assert DEFAULT_STRATEGY == "auto" and DEFAULT_STRATEGY in STRATEGY_MAP
    assert TaskCreate.model_fields["strategy"].default == DEFAULT_STRATEGY
    assert set(KNOB_ONLY) == {"grid", "random", "xgb", "bo", "auto"}


def test_auto_picks_the_analytical_prior_for_our_kernels_and_bo_otherwise(h100, space):
    ours = Space.enumerate(gemm(256, 128, 512), h100)
    mine = make_strategy("auto", ours, seed=0)
    assert isinstance(mine, BayesianStrategy) and mine.prior is not None
    assert mine.prior.source == "analytical model"
    foreign = make_strategy("auto", space, seed=0)
    assert isinstance(foreign, BayesianStrategy) and foreign.prior is None


def test_unknown_and_misplaced_strategies_are_refused(space):
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("nope", space, seed=0)
    with pytest.raises(ValueError, match="foreign space"):
        make_strategy("analytical+xgb", space, seed=0)
    prior = PriorMean(np.zeros(len(space)), "x")
    with pytest.raises(ValueError, match="takes no recorded prior"):
        make_strategy("random", space, seed=0, prior=prior)


# ---- encoding and initial design --------------------------------------------------------


def test_encoding_orders_numbers_and_one_hots_categories(space):
    enc = KnobEncoding.of(space)
    # 5 ordered knobs as one column each, the 3-value categorical knob as 3 columns
    assert enc.features.shape == (len(space), 5 + 3)
    assert enc.features.min() == 0.0 and enc.features.max() == 1.0
    onehot = enc.features[:, 5:]
    assert np.all(onehot.sum(axis=1) == 1)


def test_a_numeric_knob_is_ordered_by_value_whatever_order_its_values_are_listed_in(recorded):
    # A Kernel Tuner cache may list a knob's values in any order: as listed ([256, 16, ...])
    # they were the search's ordinal features, so the same measurements gave bo 0.884 of the
    # optimum at k=10 on pnpoly (RTX 3090) instead of 0.959 with the values sorted.
    shuffled = {k: list(reversed(v)) if k in ("bx", "tx") else v for k, v in KNOBS.items()}
    listed = RecordedConfigs("shuffled", shuffled, recorded.configs, recorded.objective_ms)
    ours, theirs = ForeignSpace(recorded), ForeignSpace(listed)
    assert np.array_equal(KnobEncoding.of(theirs).features, KnobEncoding.of(ours).features)
    rows = run_strategy_rows(make_strategy("bo", ours, 0), recorded.objective_ms, 24, 8)
    assert run_strategy_rows(make_strategy("bo", theirs, 0), listed.objective_ms, 24, 8) == rows


def test_the_design_is_distinct_seeded_and_covers_every_knob(space):
    enc = KnobEncoding.of(space)
    rows = design_rows(enc, 8, seed=3)
    assert len(set(rows)) == 8 and all(0 <= r < len(space) for r in rows)
    for j, radix in enumerate(enc.radices):
        seen = set(enc.value_index[rows, j].tolist())
        # 8 representative points take every value of a knob with at most 4 values present,
        # and at least 4 different values of a bigger one
        assert len(seen) >= min(4, len(np.unique(enc.value_index[:, j]))), (j, radix, seen)
    assert design_rows(enc, 8, seed=3) == rows  # seeded
    assert len({tuple(design_rows(enc, 8, seed=s)) for s in range(6)}) > 1  # and varies by seed
    assert sorted(design_rows(enc, len(space) + 5, seed=0)) == list(range(len(space)))


def test_distances_from_the_compact_columns_are_the_one_hot_features_distances(space):
    # The design measures configurations apart by the L1 distance of their features; it
    # reads them from one column per knob (a categorical knob's rank), not from the one-hot
    # matrix, which is as wide as the knobs have values.
    from scipy.spatial.distance import cdist

    enc = KnobEncoding.of(space)
    assert enc.scaled.shape == (len(space), 5) and enc.categories.shape == (len(space), 1)
    rows, to = np.arange(0, len(space), 3), np.array([0, 7, len(space) - 1])
    expected = cdist(enc.features[rows], enc.features[to], metric="cityblock")
    np.testing.assert_allclose(enc.l1_distances(rows, to), expected, rtol=1e-12)
    whole = cdist(enc.features, enc.features[to], metric="cityblock")
    np.testing.assert_allclose(enc.l1_distances(slice(None), to), whole, rtol=1e-12)


def _wide_recorded(n: int = 20_000) -> RecordedConfigs:
    """n configurations of two 4-valued numeric knobs and a 500-valued text knob (one-hot:
    the features are n x 503 doubles, 80 MB at 20,000), a smooth objective."""
    rng = np.random.default_rng(1)
    knobs = {"x": list(range(4)), "y": list(range(4)), "kind": [f"k{i}" for i in range(500)]}
    xs, ys, kinds = rng.integers(4, size=n), rng.integers(4, size=n), rng.integers(500, size=n)
    configs = [
        {"x": int(x), "y": int(y), "kind": f"k{k}"} for x, y, k in zip(xs, ys, kinds, strict=True)
    ]
    objective = 1.0 + 0.1 * (xs - 2.0) ** 2 + 0.1 * (ys - 1.0) ** 2 + 0.01 * (kinds % 7)
    return RecordedConfigs("wide", knobs, configs, objective)


def _peak_bytes(call: typing.Callable[[], typing.Any]) -> tuple[typing.Any, int]:
    """call()'s answer and the most memory it held at once beyond what was held before
    (numpy reports its arrays to tracemalloc)."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        answer = call()
        return answer, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_the_design_of_a_many_valued_categorical_knob_stays_small():
    # The design used to copy the one-hot feature matrix for each pick; from the compact
    # columns a pick's distances are one per configuration. The picks are those of the
    # herding computed from the whole features (the reference below), the same distances.
    enc = KnobEncoding.of(ForeignSpace(_wide_recorded()))
    assert enc.features.shape[1] > 500 and enc.categories.shape[1] == 1
    rows, peak = _peak_bytes(lambda: design_rows(enc, 6, seed=0))
    assert peak < enc.features.nbytes / 2, peak  # before: a copy of it per pick
    assert rows == _herding_from_features(enc, 6, seed=0)


def test_the_one_hot_features_are_built_in_place():
    # Built as columns and stacked, the one-hot matrix was held twice at once.
    space = ForeignSpace(_wide_recorded())
    enc, peak = _peak_bytes(lambda: KnobEncoding.of(space))
    assert peak < 1.3 * enc.features.nbytes, (peak, enc.features.nbytes)
    assert np.all(enc.features[:, 2:].sum(axis=1) == 1.0)
    assert np.array_equal(
        enc.features[np.arange(len(enc)), 2 + enc.categories[:, 0]], np.ones(len(enc))
    )
    assert np.array_equal(enc.scaled, enc.features[:, :2])


def test_a_search_round_does_not_copy_the_feature_matrix():
    # Each round predicted over features[unvisited] (and, with hyperparameters drawn for a
    # batch's picks, over features[pool]): a copy of the whole one-hot matrix, twice the
    # memory of the search. Predicted a block of rows at a time, the same predictions.
    recorded = _wide_recorded(50_000)  # (200 MB of features: several blocks of rows)
    strategy = make_strategy("auto", ForeignSpace(recorded), seed=0)
    features = strategy.features.nbytes
    history: list[Observation] = []
    peaks = []
    for _ in range(3):
        seen = list(history)
        batch, peak = _peak_bytes(
            functools.partial(strategy.next_batch, 8, {o.row for o in seen}, seen)
        )
        peaks.append(peak)
        history += _observe(recorded, batch)
    assert max(peaks) < features / 2, (peaks, features)


def _herding_from_features(enc: KnobEncoding, n: int, seed: int) -> list[int]:
    """design_rows as written before it read the compact columns: every distance from the
    one-hot feature matrix."""
    from scipy.spatial.distance import cdist

    from pipetune.tuner.design import REFERENCE_ROWS

    f = enc.features
    rng = np.random.default_rng(seed)
    reference = f[rng.permutation(len(enc))[:REFERENCE_ROWS]]
    pairs = cdist(reference, reference, metric="cityblock")[np.triu_indices(len(reference), 1)]
    scale = float(np.median(pairs)) or 1.0
    kernel_mean = np.exp(-cdist(f, reference, metric="cityblock") / scale).mean(axis=1)
    tie_break = rng.permutation(len(enc)) / len(enc) * 1e-9
    summed, taken, rows = np.zeros(len(enc)), np.zeros(len(enc), dtype=bool), []
    for t in range(n):
        score = kernel_mean - summed / (t + 1) + tie_break
        score[taken] = -np.inf
        row = int(np.argmax(score))
        taken[row] = True
        rows.append(row)
        summed += np.exp(-np.abs(f - f[row]).sum(axis=1) / scale)
    return rows


def _knob_distance(enc: KnobEncoding, rows) -> float:
    """How far a sample's knob values are from the space's, summed over the knobs (total
    variation between the two distributions of each knob's values)."""
    total = 0.0
    for j, radix in enumerate(enc.radices):
        sample = np.bincount(enc.value_index[rows, j], minlength=radix) / len(rows)
        whole = np.bincount(enc.value_index[:, j], minlength=radix) / len(enc)
        total += 0.5 * np.abs(sample - whole).sum()
    return total


def _pyramid() -> RecordedConfigs:
    """A constrained space (a + b + c <= 11 of a 12^3 grid) whose boundary layer fails, as
    configurations at the edge of a shared-memory or thread limit do."""
    knobs = {k: list(range(12)) for k in "abc"}
    configs = [dict(zip(knobs, v, strict=True)) for v in itertools.product(range(12), repeat=3)]
    configs = [c for c in configs if sum(c.values()) <= 11]
    objective = np.array([np.inf if sum(c.values()) == 11 else 1.0 for c in configs])
    return RecordedConfigs("pyramid", knobs, configs, objective)


@pytest.mark.parametrize("which", ["synthetic", "pyramid"])
def test_the_design_represents_the_space_better_than_random_samples(which):
    """Each knob's values in the design are distributed as in the space: closer than random
    samples of the same size are, on average, by a wide margin."""
    enc = KnobEncoding.of(ForeignSpace(synthetic() if which == "synthetic" else _pyramid()))
    rng = np.random.default_rng(0)
    designed = np.mean([_knob_distance(enc, design_rows(enc, 8, seed=s)) for s in range(10)])
    sampled = np.mean([_knob_distance(enc, rng.permutation(len(enc))[:8]) for _ in range(200)])
    assert designed < 0.6 * sampled, (designed, sampled)


def test_the_design_does_not_favour_the_edge_of_a_constrained_space():
    """A design snapped from a grid-filling sequence to the nearest configuration picks the
    edge of a constrained space more often than it occurs (every grid point beyond the edge
    snaps onto it), and at the edge configurations fail. This one picks it at most as often
    as the edge's share of the space."""
    recorded = _pyramid()
    enc = KnobEncoding.of(ForeignSpace(recorded))
    edge = ~np.isfinite(recorded.objective_ms)
    share = np.mean([edge[design_rows(enc, 8, seed=s)].mean() for s in range(20)])
    assert share <= edge.mean(), (share, edge.mean())


def test_the_design_is_the_same_computed_in_blocks(monkeypatch):
    """The space's kernel mean is computed in blocks of rows (a space of 262,144
    configurations held half a gigabyte of distances at once): the same numbers, bit for
    bit, so the same design, as one pass over the space."""
    enc = KnobEncoding.of(ForeignSpace(_pyramid()))
    whole = design_rows(enc, 12, seed=4)
    monkeypatch.setattr("pipetune.tuner.design.BLOCK_ROWS", 7)  # many blocks, a ragged last
    assert design_rows(enc, 12, seed=4) == whole
    monkeypatch.setattr("pipetune.tuner.design.BLOCK_ROWS", len(enc))
    assert design_rows(enc, 12, seed=4) == whole


# ---- the search -------------------------------------------------------------------------


def test_bo_finds_the_optimum_of_a_smooth_space(recorded, space):
    norm = recorded.throughput / recorded.optimum
    found = []
    for seed in range(10):
        rows = run_strategy_rows(
            make_strategy("bo", space, seed), recorded.objective_ms, budget=40, batch=4
        )
        found.append(norm[rows].max())
    # 40 of 1,632 configurations: random search expects about 0.69 here. Over ten seeds, not
    # three: one seed in ten or so stops at a second-best basin (0.77-0.8) whatever the
    # believer's details, so a three-seed minimum was a coin toss.
    assert sum(f > 0.9 for f in found) >= 8 and np.mean(found) > 0.94, found


def test_failures_train_the_classifier_not_the_performance_model(recorded, space):
    failing = ~np.isfinite(recorded.objective_ms)
    rows = run_strategy_rows(
        make_strategy("bo", space, seed=1), recorded.objective_ms, budget=16, batch=8
    )
    strategy = make_strategy("bo", space, seed=1)
    history = _observe(recorded, rows)
    assert any(o.failed for o in history)
    strategy.next_batch(8, {o.row for o in history}, history)
    # the GP saw the successful trials only; the classifier saw all of them
    ok = sum(not o.failed for o in history)
    assert len(strategy._plain.posterior.y) == ok < len(history)
    assert strategy.failures.classifier is not None
    p_ok = strategy.failures.p_ok(strategy.features)
    assert p_ok[failing].mean() < p_ok[~failing].mean()


@pytest.mark.skipif(not CONV_3090.exists(), reason="shared datasets are not next to this checkout")
def test_guided_trials_stay_out_of_the_failing_region_of_a_real_space():
    """Kernel Tuner's convolution on an RTX 3090 (measured by others): 23% of the space fails
    (too much shared memory), next to the fastest configurations. Over ten seeds (on three,
    one seed's unlucky trust region decides it: 0.083 with half the batch local, 0.135 with
    five of eight; over ten 0.063 and 0.072)."""
    from pipetune.clients.cli.bench_cmds import recorded_dataset

    configs = recorded_dataset(CONV_3090).configs
    failing = ~np.isfinite(configs.objective_ms)
    rates = []
    for seed in range(10):
        rows = run_strategy_rows(
            make_strategy("bo", ForeignSpace(configs), seed), configs.objective_ms, 48, 8
        )
        rates.append(failing[rows[16:]].mean())  # after the design and the first model batch
    assert np.mean(rates) < failing.mean() / 2, (rates, failing.mean())


def test_log_expected_improvement_is_the_integral_of_the_normal_distribution_function():
    """EI = sd * h(z), h(z) = the integral of Phi up to z: the log is right near the best
    measurement and far below it (z down to -30, EI about 1e-200), where EI itself would
    underflow and the ranking would fall to row order."""
    z = np.concatenate([np.linspace(-4.9, 4.0, 50), np.linspace(-30.0, -5.1, 30)])
    sd, best = 0.3, 1.0
    got = log_expected_improvement(best + z * sd, np.full_like(z, sd), best)
    h = [quad(ndtr, -np.inf, v, epsabs=0, epsrel=1e-12, limit=200)[0] for v in z]
    assert np.allclose(got, np.log(sd * np.array(h)), rtol=0, atol=1e-9)
    assert np.all(np.diff(got[50:]) > 0)  # still ranks where EI is below 1e-300


def test_a_batch_is_not_eight_neighbours_of_one_point(recorded, space):
    """The kriging believer spreads a batch: more knob changes between its picks than the
    top 8 of the same acquisition, and never 8 picks within one knob change of one point."""
    enc = KnobEncoding.of(space)

    def spread(batch):
        near = np.zeros(len(space), dtype=np.int64)
        for row in batch:
            near += enc.knob_changes(row) <= 1
        pairs = [enc.knob_changes(a)[b] for a, b in itertools.combinations(batch, 2)]
        return near.max(), np.mean(pairs)

    believer, top8 = [], []
    for seed in range(4):
        strategy = make_strategy("bo", space, seed=seed)
        history = _observe(recorded, design_rows(enc, 12, seed=seed))
        seen = {o.row for o in history}
        batch = strategy.next_batch(8, seen, history)
        assert len(set(batch)) == 8 and not seen & set(batch)
        unvisited = np.setdiff1d(np.arange(len(space)), list(seen))
        mean, sd = strategy._plain.predict(strategy.features[unvisited])
        best = max(-np.log(o.latency_s) for o in history if not o.failed)
        p_ok = strategy.failures.p_ok(strategy.features)[unvisited]
        greedy = unvisited[np.argsort(-constrained_score(mean, sd, best, p_ok))[:8]]
        believer.append(spread(batch))
        top8.append(spread(greedy))
    assert max(b[0] for b in believer) < 8
    assert np.mean([b[1] for b in believer]) > np.mean([t[1] for t in top8])


def test_a_batch_alternates_between_the_space_and_the_trust_region_as_single_trials_do(
    recorded, space
):
    """Trial by trial, picks alternate between the whole space and the configurations within
    the trust region's radius of the best measurement; a batch of 8 draws its first slot and
    every third after it from the whole space (three), the others from the trust region
    (five), and the believer keeps its local picks apart."""
    enc = KnobEncoding.of(space)
    for seed in range(3):
        strategy = make_strategy("bo", space, seed=seed)
        history = _observe(recorded, design_rows(enc, 12, seed=seed))
        seen = {o.row for o in history}
        ok = [o for o in history if not o.failed]
        incumbent = min(ok, key=lambda o: o.latency_s).row
        batch = strategy.next_batch(8, seen, history)
        local = [r in strategy._local_rows for r in batch]
        assert local == [False, True, True, False, True, True, False, True]
        near = enc.knob_changes(incumbent)
        assert all(near[r] <= strategy.radius for r in batch if r in strategy._local_rows)
        assert len(set(batch)) == 8
        # One trial at a time, the 13th (after 12) is global and the 14th local.
        single = make_strategy("bo", space, seed=seed)
        assert single.next_batch(1, seen, history)[0] not in single._local_rows
        one_more = _observe(recorded, design_rows(enc, 13, seed=seed))
        single = make_strategy("bo", space, seed=seed)
        (pick,) = single.next_batch(1, {o.row for o in one_more}, one_more)
        assert pick in single._local_rows


def test_the_trust_region_shrinks_after_local_failures_and_grows_after_successes(space):
    """TuRBO's rule on knob changes: three trust-region trials in a row that do not beat
    the best measurement so far make the region one knob change smaller, two in a row that
    do make it one larger, within RADIUS_RANGE; trials from the whole space do not count."""
    strategy = BayesianStrategy(space, np.random.default_rng(0), seed=0)
    start = strategy.radius
    assert start == bo.LOCAL_KNOB_CHANGES
    strategy._local_rows = set(range(1, 20))

    def trial(row: int, ms: float | None) -> Observation:
        return Observation(row=row, latency_s=None if ms is None else ms * 1e-3, failed=ms is None)

    history = [trial(0, 1.0), trial(100, 0.5)]  # the best is 0.5 ms (not a local trial)
    history += [trial(1, 0.6), trial(2, None), trial(3, 0.7)]  # three local misses
    strategy._update_radius(history)
    assert strategy.radius == start - 1
    history += [trial(101, 0.4), trial(4, 0.3), trial(102, 0.35), trial(5, 0.2)]
    strategy._update_radius(history)  # two local wins in a row (the global trials between)
    assert strategy.radius == start
    history += [trial(6, 0.1), trial(7, 0.05), trial(8, 0.01), trial(9, 0.005)]
    strategy._update_radius(history)
    assert strategy.radius == bo.RADIUS_RANGE[1]  # grown once, then at its bound
    history += [trial(r, 9.0) for r in range(10, 19)]  # nine misses: three steps, bounded
    strategy._update_radius(history)
    assert strategy.radius == bo.RADIUS_RANGE[0]


def test_proposals_depend_only_on_seed_and_history(recorded, space):
    def run():
        return run_strategy_rows(
            make_strategy("bo", space, seed=5), recorded.objective_ms, budget=24, batch=8
        )

    assert run() == run()


# ---- transfer ---------------------------------------------------------------------------


def test_recorded_prior_aligns_by_knob_values_and_keeps_failures(recorded):
    other = synthetic("other_gpu", shift=0.0)
    reordered = RecordedConfigs(
        other.name, other.tune_params, other.configs[::-1], other.objective_ms[::-1]
    )
    prior = recorded_prior(reordered, recorded.configs, recorded.knob_names)
    assert prior.recorded.all()
    assert np.array_equal(prior.failed, ~np.isfinite(recorded.objective_ms))
    ok = ~prior.failed
    assert np.allclose(prior.values[ok], -np.log(recorded.objective_ms[ok]))
    with pytest.raises(TransferError, match="same kernel"):
        wrong = RecordedConfigs("w", {"x": [1]}, [{"x": 1}], np.array([1.0]))
        recorded_prior(wrong, recorded.configs, recorded.knob_names)


def test_a_sparse_prior_is_completed_by_the_model_moved_onto_its_scale():
    # Five rows recorded (one failed there), four not: the model guesses those, shifted by
    # the median gap between the recorded successes and the model (2.0, despite one outlier).
    model = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    recorded = np.array([True, True, True, True, True, False, False, False, False])
    failed = np.array([False, False, False, False, True, False, False, False, False])
    values = np.array([3.0, 4.0, 5.0, 16.0, 3.0, 0.0, 0.0, 0.0, 0.0])
    sparse = PriorMean(values, source="task 1 on a100", recorded=recorded, failed=failed)
    completed = completed_by_model(sparse, model)
    assert np.array_equal(completed.values[recorded], values[recorded])
    assert np.allclose(completed.values[~recorded], model[~recorded] + 2.0)
    assert np.array_equal(completed.recorded, recorded) and np.array_equal(completed.failed, failed)
    assert completed.source == "task 1 on a100 and the analytical model"
    full = PriorMean(values, source="x", recorded=np.ones(9, bool), failed=failed)
    assert completed_by_model(full, model) is full  # nothing to complete
    with pytest.raises(TransferError, match="rows"):
        completed_by_model(sparse, model[:4])


def test_a_sampled_prior_on_a_foreign_space_guesses_its_unmeasured_rows_from_its_trials(
    recorded, space
):
    # The prior measured every third row of the same space: `bo` fills the rest with a fit
    # to them (not the worst value), close to the truth on a smooth synthetic space.
    rows = np.arange(0, len(recorded.configs), 3)
    sample = RecordedConfigs(
        "sample",
        recorded.tune_params,
        [recorded.configs[r] for r in rows],
        recorded.objective_ms[rows],
    )
    prior = recorded_prior(sample, recorded.configs, recorded.knob_names, sampled=True)
    assert prior.sampled and prior.recorded.sum() == len(rows)
    strategy = make_strategy("bo", space, seed=0, prior=prior)
    filled = strategy.prior.values
    truth = -np.log(recorded.objective_ms)
    unmeasured = ~prior.recorded & np.isfinite(truth)
    assert strategy.prior.source == "sample and a fit to its trials"
    assert np.array_equal(filled[prior.recorded], prior.values[prior.recorded])
    assert np.ptp(prior.values[unmeasured]) == 0  # without the fit: all the worst value
    assert np.corrcoef(filled[unmeasured], truth[unmeasured])[0, 1] > 0.8
    exhaustive = recorded_prior(sample, recorded.configs, recorded.knob_names)
    assert make_strategy("bo", space, seed=0, prior=exhaustive).prior is exhaustive


def test_a_faithful_prior_finds_the_optimum_in_the_first_batch(recorded, space):
    prior = recorded_prior(synthetic("other", shift=0.0), recorded.configs, recorded.knob_names)
    norm = recorded.throughput / recorded.optimum
    for seed in range(3):
        rows = run_strategy_rows(
            make_strategy("bo", space, seed, prior=prior), recorded.objective_ms, 8, 8
        )
        assert norm[rows].max() == 1.0
        assert not (~np.isfinite(recorded.objective_ms[rows])).any()


def test_a_contradicted_prior_is_dropped(recorded, space):
    # The "other GPU" ranks the space backwards: the measurements must win.
    lying = PriorMean(
        np.log(np.where(np.isfinite(recorded.objective_ms), recorded.objective_ms, 1.0)),
        source="backwards",
    )
    strategy = make_strategy("bo", space, seed=0, prior=lying)
    rows = run_strategy_rows(strategy, recorded.objective_ms, budget=40, batch=8)
    assert strategy.last_used_prior is False
    norm = recorded.throughput / recorded.optimum
    assert norm[rows].max() > random_search_expectation(norm, 40)
    honest = make_strategy(
        "bo", space, seed=0, prior=recorded_prior(recorded, recorded.configs, recorded.knob_names)
    )
    run_strategy_rows(honest, recorded.objective_ms, budget=24, batch=8)
    assert honest.last_used_prior is True


def test_a_prior_whose_slope_is_clipped_to_zero_never_drives_a_round(recorded, space):
    """Measurements that fall as the prior rises give a negative slope, clipped to 0: the
    prior's part is then nothing and its GP models the measurements alone, as the rival does.
    Which of the two fits has the higher evidence is then a matter of where each fit stopped,
    and it must not keep the prior in play (it did, in some rounds of these seeds)."""
    lying = PriorMean(
        np.log(np.where(np.isfinite(recorded.objective_ms), recorded.objective_ms, 1.0)),
        source="backwards",
    )
    clipped_rounds = 0
    for seed in range(4):
        strategy = make_strategy("bo", space, seed=seed, prior=lying)
        history: list[Observation] = []
        exclude: set[int] = set()
        for _ in range(5):
            rows = strategy.next_batch(8, exclude, history)
            ok_rows = np.array([o.row for o in history if not o.failed], dtype=np.int64)
            y = np.array([-np.log(o.latency_s) for o in history if not o.failed])
            if len(y) and strategy._prior_judged(y, ok_rows) and strategy._scale(y, ok_rows) == 0:
                clipped_rounds += 1
                assert strategy.last_used_prior is False
                # Nothing to compare: the prior's GP was not fitted (it would model the
                # measurements alone, as the plain one does), and neither GP leads.
                assert strategy._residual is not None
                assert len(strategy._residual.training_data[1]) < len(y)
                assert strategy._lead == 0.0
            history += _observe(recorded, rows)
            exclude.update(rows)
    assert clipped_rounds >= 8  # the case is exercised, not skipped


def test_a_prior_far_behind_refreshes_its_own_hyperparameters_only_as_the_data_double(
    recorded, space
):
    # The prior's GP mirrors the rule for the plain one: while the measurements alone explain
    # the data decisively better, its hyperparameters are re-estimated only once the data
    # have doubled; in between it is conditioned on every trial with the last estimate.
    rng = np.random.default_rng(0)
    faithful = recorded_prior(recorded, recorded.configs, recorded.knob_names)
    # Errors as large as its signal: the measurements soon explain the data far better.
    spread = float(np.std(faithful.values))
    noisy = PriorMean(faithful.values + spread * rng.standard_normal(len(space)), source="noisy")
    trailing_rounds = 0
    for seed in range(3):
        strategy = make_strategy("bo", space, seed=seed, prior=noisy)
        assert isinstance(strategy, BayesianStrategy) and strategy._residual is not None
        history: list[Observation] = []
        for _ in range(8):
            lead, estimated_on = strategy._lead, strategy._residual._estimated_on
            fitted_on = len(strategy._residual.training_data[1])
            rows = strategy.next_batch(8, {o.row for o in history}, history)
            n_ok = sum(not o.failed for o in history)
            refitted = len(strategy._residual.training_data[1]) != fitted_on
            if lead < -bo.LEAD_MARGIN and refitted:
                trailing_rounds += 1
                refreshed = strategy._residual._estimated_on
                assert refreshed == estimated_on or refreshed >= 2 * estimated_on
                assert len(strategy._residual.training_data[1]) == n_ok  # every trial
            history += _observe(recorded, rows)
    assert trailing_rounds >= 3  # the case is exercised, not skipped


def test_a_prior_that_ranks_alike_but_spreads_wider_is_rescaled(recorded, space):
    faithful = recorded_prior(recorded, recorded.configs, recorded.knob_names)
    wide = PriorMean(
        3.0 * faithful.values, "three times as spread", faithful.recorded, faithful.failed
    )
    strategy = make_strategy("bo", space, seed=0, prior=wide)
    rows = run_strategy_rows(strategy, recorded.objective_ms, budget=16, batch=8)
    history = _observe(recorded, rows)
    y = np.array([-np.log(o.latency_s) for o in history if not o.failed])
    ok_rows = np.array([o.row for o in history if not o.failed])
    # An exact fit: only the timing-noise floor (tuner/bo.py) lets the belief in a slope of 1
    # pull the estimate, by about 1e-4 here.
    assert strategy._scale(y, ok_rows) == pytest.approx(1 / 3, rel=1e-3)
    assert strategy.last_used_prior is True


def _scikit_learn_kernel(kernel):
    """scikit-learn's kernel with the hyperparameters of a tuner/matern_gp.py Kernel."""
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    return ConstantKernel(kernel.amplitude) * Matern(
        length_scale=kernel.length_scales, nu=2.5
    ) + WhiteKernel(kernel.noise)


def _scikit_learn_gp(kernel, X, y):
    from sklearn.gaussian_process import GaussianProcessRegressor

    reference = GaussianProcessRegressor(
        kernel=_scikit_learn_kernel(kernel), normalize_y=True, optimizer=None
    )
    return reference.fit(X, y)


def test_the_map_objective_is_scikit_learns_likelihood_plus_the_prior():
    """The surrogate fits its hyperparameters on its own numpy objective (a tenth of the
    cost): it must be scikit-learn's -log marginal likelihood plus the prior, value and
    gradient, or the fits (and so the search) would drift from what was measured."""
    from pipetune.tuner.matern_gp import neg_log_posterior, pair_sq_diffs
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(7)
    for n, d in ((2, 1), (5, 3), (23, 9), (130, 4), (170, 3)):  # both ways to invert
        X = rng.random((n, d))
        y = np.sin(3 * X).sum(axis=1) + 0.1 * rng.standard_normal(n)
        gp = GaussianProcess(d, seed=0)
        reference = _scikit_learn_gp(gp.start, X, y)
        t = (y - y.mean()) / y.std()
        D2 = pair_sq_diffs(X)
        for _ in range(5):
            theta = rng.uniform(-2.0, 2.0, d + 2)
            lml, grad = reference.log_marginal_likelihood(theta, eval_gradient=True)
            dev = theta[1:-1] - gp.log_ls_mean
            penalty = np.sum(dev**2) / (2 * gp.log_ls_var) + (theta[-1] + 4.0) ** 2 / 2
            value, mine = neg_log_posterior(theta, D2, t, gp.log_ls_mean, gp.log_ls_var)
            assert value == pytest.approx(-lml + penalty, rel=1e-9)
            expected = -np.asarray(grad)
            expected[1:-1] += dev / gp.log_ls_var
            expected[-1] += theta[-1] + 4.0
            assert np.allclose(mine, expected, rtol=1e-7, atol=1e-9)


def test_the_matern_kernel_in_place_is_the_expression_bit_for_bit():
    """Kernel._matern works in place over a whole space's covariances; it must give the bits
    the plain expression amplitude * ((1 + s + s^2 / 3) * exp(-s)) gives, so that sessions
    replay (and searches stay what they were)."""
    from pipetune.tuner.matern_gp import SQRT5, Kernel

    rng = np.random.default_rng(11)
    for shape in ((7, 2840), (120, 300), (1, 1)):
        r = rng.random(shape) * 4.0
        kernel = Kernel(float(rng.uniform(0.01, 100.0)), np.ones(3), 0.01)
        s = r * SQRT5
        expected = kernel.amplitude * ((1.0 + s + s**2 / 3.0) * np.exp(-s))
        before = r.copy()
        assert np.array_equal(kernel._matern(r), expected)
        assert np.array_equal(r, before)  # its argument is left as it was


def test_gp_predictions_over_a_space_are_the_same_in_blocks(monkeypatch):
    """A GP's predictions over a whole space are computed in blocks of rows (the cross
    covariance and its solve are training points x rows, with as many temporaries): each
    row's mean and spread are those of one pass over every row, bit for bit, with BLAS on
    one thread as a proposal round runs it (bo.BayesianStrategy.next_batch). On several
    threads OpenBLAS splits a product's columns among them, and the columns at a split are
    computed by its edge kernels, whose last bits may differ (a 2-core VM's split of 1,000
    columns did): which is why a round runs on one."""
    from pipetune.tuner import matern_gp
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(9)
    X, X_c = rng.random((25, 4)), rng.random((1000, 4))
    gp = GaussianProcess(4, seed=0)
    gp.fit(X, np.cos(4 * X).sum(axis=1))
    with bo._THREADPOOLS.limit(limits=1):
        one_pass_mean, one_pass_sd, _ = gp.predict_explained(X_c)
        monkeypatch.setattr(matern_gp, "PREDICT_BLOCK_ROWS", 64)  # 16 blocks, a ragged last
        mean, sd = gp.predict(X_c)
    assert np.array_equal(mean, one_pass_mean) and np.array_equal(sd, one_pass_sd)
    # On any number of threads the two agree to rounding.
    assert np.allclose(gp.predict(X_c)[1], one_pass_sd, rtol=1e-12, atol=0)


def test_the_gp_mean_over_a_space_is_computed_in_blocks(monkeypatch):
    """The posterior mean alone (a sampled prior's guess for every row of a space, from up
    to 1,024 of its trials: tuner/transfer.py) holds a cross covariance of training points x
    rows as `predict` does, gigabytes over a space of 262,144 rows at once: it must go in
    blocks too, with the same figures."""
    import tracemalloc

    from pipetune.tuner import matern_gp
    from pipetune.tuner.matern_gp import Kernel, Posterior

    rng = np.random.default_rng(4)
    X, X_c = rng.random((200, 4)), rng.random((20_000, 4))
    posterior = Posterior(Kernel(1.0, np.full(4, 0.5), 0.01), X, np.cos(4 * X).sum(axis=1))
    with bo._THREADPOOLS.limit(limits=1):
        K_cross = posterior.kernel.cross(posterior.X, X_c)
        one_pass = posterior.y_std * (posterior.alpha @ K_cross) + posterior.y_mean
        del K_cross
        monkeypatch.setattr(matern_gp, "PREDICT_BLOCK_ROWS", 1000)  # 20 blocks
        tracemalloc.start()
        try:
            mean = posterior.mean(X_c)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert np.array_equal(mean, one_pass)
    one_cross = 200 * 20_000 * 8  # bytes of the whole cross covariance
    assert peak < one_cross / 2


def test_the_gp_explains_new_rows_with_the_inverse_factor_as_a_triangular_solve_would():
    """What the data explain of new rows (V = L^-1 k(X_train, X), the spread's and the
    believer's input) is computed with the Cholesky factor's inverse and a matrix product,
    not a triangular solve: the same figures as the solve to rounding, on an ill-conditioned
    covariance too (near-duplicate training rows, the least noise the fit allows)."""
    from scipy.linalg import solve_triangular

    from pipetune.tuner.matern_gp import Kernel, Posterior
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(12)
    X = rng.random((60, 5))
    X[30:] = X[:30] + 1e-4 * rng.random((30, 5))  # pairs of near-duplicates
    y = np.sin(3 * X).sum(axis=1)
    X_c = rng.random((500, 5))
    for noise in (1e-2, GaussianProcess.NOISE_BOUNDS[0]):
        posterior = Posterior(Kernel(1.0, np.full(5, 0.7), noise), X, y)
        assert np.allclose(posterior.L_inv @ posterior.L, np.eye(60), atol=1e-8)
        _, _, V = posterior.explain(X_c)
        K_cross = posterior.kernel.cross(posterior.X, X_c)
        expected = solve_triangular(posterior.L, K_cross, lower=True)
        assert np.allclose(V, expected, rtol=1e-6, atol=1e-8 * np.abs(expected).max())


def test_the_gp_is_scikit_learns_regressor_with_the_same_kernel():
    """tuner/matern_gp.py computes what scikit-learn's GaussianProcessRegressor (Matérn 5/2
    with one length scale per feature, white noise, normalize_y) does, without its machinery:
    the same posterior mean and spread, likelihood and weights, for any hyperparameters; and
    a fit re-estimates them from the prior's mode, whatever the last estimate was."""
    from pipetune.tuner.matern_gp import Kernel, Posterior
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(5)
    for n, d in ((1, 2), (4, 3), (40, 6)):
        X = rng.random((n, d))
        y = np.cos(5 * X).sum(axis=1) + 0.1 * rng.standard_normal(n)
        X_c = np.vstack([rng.random((30, d)), X[:1]])  # a training row too
        for _ in range(3):
            kernel = Kernel.from_theta(rng.uniform(-3.0, 1.0, d + 2))
            mine, reference = Posterior(kernel, X, y), _scikit_learn_gp(kernel, X, y)
            mean, sd = mine.predict(X_c)
            ref_mean, ref_sd = reference.predict(X_c, return_std=True)
            assert np.allclose(mean, ref_mean, rtol=1e-9, atol=1e-9)
            assert np.allclose(sd, ref_sd, rtol=1e-7, atol=1e-9)
            assert np.allclose(mine.mean(X_c), ref_mean, rtol=1e-9, atol=1e-9)
            assert mine.log_likelihood == pytest.approx(
                reference.log_marginal_likelihood_value_, rel=1e-9
            )
            assert np.allclose(mine.alpha, reference.alpha_, rtol=1e-8, atol=1e-10)
    gp = GaussianProcess(3, seed=0)
    X = rng.random((12, 3))
    y = np.sin(4 * X[:, 0])
    gp.fit(X, y)
    first = gp.kernel
    gp.kernel = Kernel.from_theta(np.zeros(5))  # another estimate: the next fit ignores it
    gp._estimated_on = 0
    gp.fit(X, y)
    assert np.array_equal(gp.kernel.theta, first.theta)


def test_a_re_estimate_starts_from_the_last_one_and_the_rough_start_as_the_data_double(
    monkeypatch,
):
    """Hyperparameters are first estimated from the two fixed starts (the prior's mode and
    short length scales); later from the last estimate (a fraction of the optimiser's work),
    and whenever the data have doubled since the rough start last ran, from it as well (a
    rougher mode the data have come to favour); never again from the prior's mode."""
    from pipetune.tuner import surrogate
    from pipetune.tuner.surrogate import GaussianProcess

    starts: list[list[np.ndarray]] = []
    real = surrogate.minimize_bounded

    def recording(fun, x0, *args):
        starts[-1].append(np.array(x0))
        return real(fun, x0, *args)

    monkeypatch.setattr(surrogate, "minimize_bounded", recording)
    rng = np.random.default_rng(3)
    X = rng.random((40, 3))
    y = np.sin(4 * X[:, 0]) + X[:, 1]
    gp = GaussianProcess(3, seed=0)
    rough = gp.start.theta.copy()
    rough[1:-1] = np.log(0.3)
    for n in (10, 12, 15, 20, 24, 40):  # each one re-estimates (a tenth more data)
        starts.append([])
        before = gp.kernel.theta
        gp.fit(X[:n], y[:n])
        if n == 10:  # the first fit
            expected = [gp.start.theta, rough]
        elif n in (20, 40):  # each time the data have doubled
            expected = [before, rough]
        else:
            expected = [before]
        assert len(starts[-1]) == len(expected), n
        for got, want in zip(starts[-1], expected, strict=True):
            assert np.array_equal(got, want), n


def test_a_warm_re_estimate_finds_the_optimum_the_fixed_starts_find():
    """Started from the last estimate, the optimiser reaches the posterior mode that the two
    fixed starts reach on the same data (a smooth function, the usual case): the warm start
    saves work, not accuracy."""
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(11)
    X = rng.random((30, 4))
    y = np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.3 * X[:, 2] + 0.02 * rng.standard_normal(30)
    warm = GaussianProcess(4, seed=0)
    warm.fit(X[:16], y[:16])
    warm.fit(X, y[:30])  # 30 < 2 * 16: from the estimate on 16 points
    assert warm._checked_on == 16  # the warm start alone
    cold = GaussianProcess(4, seed=0)
    cold.fit(X, y)
    assert cold._checked_on == 30
    assert warm.log_evidence() == pytest.approx(cold.log_evidence(), abs=1e-3)
    mean_w, sd_w = warm.predict(X)
    mean_c, sd_c = cold.predict(X)
    assert np.allclose(mean_w, mean_c, atol=1e-3) and np.allclose(sd_w, sd_c, atol=1e-3)


def test_gp_fantasies_are_the_joint_gaussian_conditioned_on_the_believed_picks():
    """The GP's kriging believer updates variances by rank-one terms instead of refitting:
    after believing picks i1, i2, i3 it must give exactly the posterior of the fitted GP
    (fixed hyperparameters and standardisation) conditioned on noisy observations there that
    equal their predicted means: the same means, and the conditioned covariance's diagonal."""
    from pipetune.tuner.surrogate import Fantasies, GaussianProcess

    rng = np.random.default_rng(3)
    d = 4
    X = rng.random((15, d))
    y = np.cos(4 * X).sum(axis=1) + 0.05 * rng.standard_normal(15)
    X_c = rng.random((40, d))
    gp = GaussianProcess(d, seed=0)
    gp.fit(X, y)
    reference = _scikit_learn_gp(gp.kernel, X, y)
    mean, cov = reference.predict(X_c, return_cov=True)  # noisy-observation covariance
    cov *= gp.cv_scale**2  # widened as the GP's own spread is (leave-one-out)
    fantasies = gp.fantasies(X_c)
    believed: list[int] = []
    for i in (7, 21, 3):
        fantasies.believe(i)
        believed.append(i)
        cov = cov - np.outer(cov[:, i], cov[i, :]) / cov[i, i]
        others = np.setdiff1d(np.arange(len(X_c)), believed)  # a pick is never picked again
        assert np.allclose(fantasies.mean, mean, rtol=0, atol=1e-12)
        assert np.allclose(fantasies.sd[others], np.sqrt(np.diag(cov)[others]), rtol=1e-6)
    # Elsewhere the uncertainty shrinks, never grows, and it shrinks most near the picks.
    before = gp.predict(X_c)[1]
    assert np.all(fantasies.sd <= before + 1e-12)
    assert np.any(fantasies.sd[others] < 0.9 * before[others])
    # Before any fit the prior is conditioned the same way (the first batch under a prior).
    prior = GaussianProcess(d, seed=0, length_scale=0.5, sd=0.1)
    fantasies = prior.fantasies(X_c)
    prior_cov = _scikit_learn_kernel(prior.kernel)(X_c)
    fantasies.believe(5)
    expected = np.diag(prior_cov - np.outer(prior_cov[:, 5], prior_cov[5, :]) / prior_cov[5, 5])
    rest = np.arange(len(X_c)) != 5
    assert np.allclose(fantasies.sd[rest], np.sqrt(expected[rest]), rtol=1e-6)
    # The generic form (refitting a copy) is kept for surrogates without a closed form.
    assert type(fantasies) is not Fantasies


def test_candidates_added_later_are_conditioned_on_the_picks_already_believed():
    """The believer widens its candidate set during a batch: rows added after some picks must
    be predicted as if they had been candidates from the start (GP and generic form alike)."""
    from pipetune.tuner.surrogate import ExtraTrees, GaussianProcess

    rng = np.random.default_rng(5)
    d = 3
    X = rng.random((12, d))
    y = np.sin(4 * X[:, 0]) + X[:, 1] + 0.05 * rng.standard_normal(12)
    X_c = rng.random((60, d))
    for surrogate in (GaussianProcess(d, seed=0), ExtraTrees(d, seed=0, n_trees=8)):
        surrogate.fit(X, y)
        whole = surrogate.fantasies(X_c)
        part = surrogate.fantasies(X_c[:20])
        for i in (4, 11):
            whole.believe(i)
            part.believe(i)
        part.extend(X_c[20:45])
        whole.believe(30)
        part.believe(30)
        part.extend(X_c[45:])
        assert np.allclose(part.mean, whole.mean, rtol=0, atol=1e-10)
        assert np.allclose(part.sd, whole.sd, rtol=1e-7, atol=1e-12)


def _gp_on_cosines(rows: int, fitted: int, seed: int):
    """Random rows of four features, a GP fitted to a noisy sum of cosines at the first
    `fitted` of them; returns the generator (to draw on), the rows, the targets and the GP."""
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(seed)
    features = rng.random((rows, 4))
    X = features[:fitted]
    y = np.cos(3 * X).sum(axis=1) + 0.05 * rng.standard_normal(fitted)
    gp = GaussianProcess(4, seed=0)
    gp.fit(X, y)
    return rng, features, y, gp


def _believer_scoring_every_row(surrogate, best, features, offset, p_ok, pools):
    """The kriging believer written plainly: every pool row scored at every pick."""
    from pipetune.tuner.acquisition import constrained_score

    rows = np.unique(np.concatenate(pools))
    place = {int(r): i for i, r in enumerate(rows)}
    fantasies = surrogate.fantasies(features[rows])
    taken = np.zeros(len(rows), dtype=bool)
    picked = []
    for pool in pools:
        mean = fantasies.mean + offset[rows]
        score = constrained_score(mean, fantasies.sd, best, p_ok[rows])
        idx = np.array([place[int(r)] for r in pool], dtype=np.int64)
        idx = idx[~taken[idx]]
        if not len(idx):
            order = np.argsort(-score, kind="stable")
            idx = order[~taken[order]]
        i = int(idx[np.argmax(score[idx])])
        taken[i] = True
        picked.append(int(rows[i]))
        best = max(best, float(mean[i]))
        fantasies.believe(i)
    return picked


@pytest.mark.parametrize("first", [2, 16, 256])
def test_the_believer_is_exact_over_whole_pools_while_scoring_only_their_heads(monkeypatch, first):
    """believer_batch starts from each pool's best rows and widens a pool only while a row
    left out could still beat the pick: its batch is the one scoring every row gives, for
    any starting size, with a trust region that runs out and falls back to anywhere."""
    from pipetune.tuner import acquisition
    from pipetune.tuner.acquisition import believer_batch, constrained_score

    monkeypatch.setattr(acquisition, "FIRST_CANDIDATES", first)
    rng, spread, y, gp = _gp_on_cosines(rows=3000, fitted=25, seed=7)
    d = spread.shape[1]
    # 300 near-copies of the most promising row: they fill the first places of the whole
    # space's order, and believing picks among them sends later picks far down that order.
    mean, sd = gp.predict(spread[25:])
    top = 25 + int(np.argmax(constrained_score(mean, sd, float(y.max()), np.ones(len(mean)))))
    features = np.vstack([spread, spread[top] + 1e-3 * rng.standard_normal((300, d))])
    offset = np.zeros(len(features))
    p_ok = rng.uniform(0.9, 1.0, len(features))
    unvisited = np.arange(25, len(features))
    mean, sd = gp.predict(features[unvisited])
    best = float(y.max())
    score = constrained_score(mean, sd, best, p_ok[unvisited])
    first_score = np.full(len(features), -np.inf)
    first_score[unvisited] = score
    whole = unvisited[np.argsort(-score, kind="stable")]
    near = np.flatnonzero(np.abs(features[unvisited] - features[3]).max(axis=1) < 0.12)
    region = unvisited[near[np.argsort(-score[near], kind="stable")]]
    assert 2 < len(region) < 8  # so that the trust region runs out within the batch
    pools = [whole, region] * 4 + [region, whole, region]
    expected = _believer_scoring_every_row(gp, best, features, offset, p_ok, pools)
    got = believer_batch(gp, best, features, offset, p_ok, pools, first_score)
    assert got == expected
    assert len(set(got)) == len(pools)
    # Not a vacuous check: the pools' first 64 rows alone give another batch.
    heads = [pool[:64] for pool in pools[:2]] * 4
    assert _believer_scoring_every_row(gp, best, features, offset, p_ok, heads) != expected[:8]


def test_the_hessian_is_the_curvature_of_the_map_objective():
    """hessian_of_neg_log_posterior (forward differences of the analytic gradient) must be the
    second derivative of the objective's value: checked by central second differences of the
    value alone, away from and at the optimum."""
    from pipetune.tuner.matern_gp import (
        hessian_of_neg_log_posterior,
        neg_log_posterior,
        pair_sq_diffs,
        standardise,
    )
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(11)
    X = rng.random((14, 3))
    y = np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.05 * rng.standard_normal(14)
    gp = GaussianProcess(3, seed=0)
    gp.fit(X, y)
    D2, (t, _, _) = pair_sq_diffs(X), standardise(y)
    args = (D2, t, gp.log_ls_mean, gp.log_ls_var)
    for theta in (gp.kernel.theta, gp.start.theta):
        H = hessian_of_neg_log_posterior(theta, *args)
        assert H is not None and np.allclose(H, H.T)
        h, m = 1e-3, len(theta)
        numeric = np.empty((m, m))
        for i, j in itertools.product(range(m), repeat=2):
            e_i, e_j = np.eye(m)[i] * h, np.eye(m)[j] * h
            f = [
                neg_log_posterior(theta + a + b, *args)[0] for a in (e_i, -e_i) for b in (e_j, -e_j)
            ]
            numeric[i, j] = (f[0] - f[1] - f[2] + f[3]) / (4 * h * h)
        assert np.allclose(H, numeric, rtol=1e-3, atol=1e-3 * np.abs(numeric).max())


def test_hyperparameter_draws_are_the_laplace_approximation_and_narrow_with_data():
    """Draws around the estimate: as many as asked, reproducible from the generator, inside
    the bounds, distributed as N(estimate, H^-1) where no bound cuts them (H the objective's
    Hessian, its eigenvalues floored at the length-scale prior's precision), and closer to
    the estimate on more data."""
    from pipetune.tuner.matern_gp import hessian_of_neg_log_posterior, pair_sq_diffs, standardise
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(2)
    d = 3

    def fitted(n: int) -> GaussianProcess:
        X = rng.random((n, d))
        y = np.sin(4 * X[:, 0]) + 0.5 * X[:, 1] + 0.02 * rng.standard_normal(n)
        gp = GaussianProcess(d, seed=0)
        gp.fit(X, y)
        return gp

    few, many = fitted(8), fitted(80)
    draws = few.hyperparameter_draws(5, np.random.default_rng(9))
    assert len(draws) == 5
    again = few.hyperparameter_draws(5, np.random.default_rng(9))
    assert all(np.array_equal(a.theta, b.theta) for a, b in zip(draws, again, strict=True))
    low, high = np.array(few._bounds()).T
    for gp in (few, many):
        thetas = np.array(
            [k.theta for k in gp.hyperparameter_draws(4000, np.random.default_rng(1))]
        )
        assert np.all(thetas >= low - 1e-12) and np.all(thetas <= high + 1e-12)
    X, y = many.training_data
    H = hessian_of_neg_log_posterior(
        many.kernel.theta, pair_sq_diffs(X), standardise(y)[0], many.log_ls_mean, many.log_ls_var
    )
    values, vectors = np.linalg.eigh(H)
    covariance = (vectors / np.maximum(values, 1 / many.log_ls_var)) @ vectors.T
    inside = np.all((thetas > low + 1e-9) & (thetas < high - 1e-9), axis=0)
    assert inside.sum() >= 3  # the test means something: most coordinates are unbounded
    sd = np.sqrt(np.diag(covariance))
    assert np.allclose(
        thetas.mean(axis=0)[inside],
        many.kernel.theta[inside],
        atol=4 * sd[inside] / np.sqrt(4000) + 1e-9,
    )
    assert np.allclose(thetas.std(axis=0)[inside], sd[inside], rtol=0.08)
    # The relevant length scale (knob 0) is pinned down by eighty points, not by eight.
    spread = {
        n: np.std([k.theta[1] for k in gp.hyperparameter_draws(400, np.random.default_rng(3))])
        for n, gp in ((8, few), (80, many))
    }
    assert spread[80] < 0.9 * spread[8]


def _strategy_after_design(space, recorded, seed: int, n: int):
    strategy = make_strategy("bo", space, seed=seed)
    enc = KnobEncoding.of(space)
    history = _observe(recorded, design_rows(enc, n, seed=seed))
    return strategy, history, {o.row for o in history}


def test_a_batch_on_few_data_makes_its_later_picks_under_drawn_hyperparameters(
    recorded, space, monkeypatch
):
    """On fewer successes than twice the GP's hyperparameters, a batch's first pick is the
    believer's and each later pick is made under hyperparameters drawn from their posterior,
    believing the picks before it: with draws equal to the estimate it is the plain
    believer's batch exactly; with real draws it differs, and keeps the rhythm (its local
    picks within the trust region), distinct and unvisited."""
    from pipetune.tuner.surrogate import GaussianProcess

    differs = 0
    for seed in range(3):
        strategy, history, seen = _strategy_after_design(space, recorded, seed, 12)
        batch = strategy.next_batch(8, seen, history)
        gp = strategy._plain
        n_ok = sum(not o.failed for o in history)
        assert isinstance(gp, GaussianProcess) and 3 <= n_ok < 2 * (gp.n_features + 2)
        assert len(set(batch)) == 8 and not seen & set(batch)
        incumbent = min((o for o in history if not o.failed), key=lambda o: o.latency_s).row
        near = KnobEncoding.of(space).knob_changes(incumbent)
        assert all(near[r] <= strategy.radius for r in batch if r in strategy._local_rows)
        assert sum(r in strategy._local_rows for r in batch) == 5
        # The same state, the estimate "drawn": the plain believer's batch.
        with monkeypatch.context() as patch:
            patch.setattr(
                GaussianProcess, "hyperparameter_draws", lambda self, k, rng: [self.kernel] * k
            )
            fresh, _, _ = _strategy_after_design(space, recorded, seed, 12)
            plain = fresh.next_batch(8, seen, history)
        assert plain[0] == batch[0]
        single, _, _ = _strategy_after_design(space, recorded, seed, 12)
        assert single.next_batch(1, seen, history) == batch[:1]
        differs += plain != batch
        # ...and that is the plain believer's batch over the same pools.
        with monkeypatch.context() as patch:
            patch.setattr(bo.BayesianStrategy, "_batch", _plain_believer)
            fresh, _, _ = _strategy_after_design(space, recorded, seed, 12)
            assert fresh.next_batch(8, seen, history) == plain
    assert differs >= 2


def _plain_believer(self, model, best, offset, p_ok, pools, first_score, pending, *_, **__):
    """BayesianStrategy._batch as it was before the draws: the believer under the estimate."""
    return bo.believer_batch(
        model, best, self.features, offset, p_ok, pools, first_score, pending=pending
    )


def test_no_hyperparameters_are_drawn_under_a_prior_or_on_enough_data(recorded, space, monkeypatch):
    """The draws stand in for the re-estimates of a few-trial search without a prior: on
    twice as many successes as hyperparameters, or in a search with a prior (whether the
    prior or the measurements alone drive the round), a batch is the plain believer's (no
    draw is made)."""
    from pipetune.tuner.surrogate import GaussianProcess

    def refuse(self, count, rng):
        raise AssertionError("no draws expected")

    monkeypatch.setattr(GaussianProcess, "hyperparameter_draws", refuse)
    strategy, history, seen = _strategy_after_design(space, recorded, 0, 40)
    assert sum(not o.failed for o in history) >= 2 * (strategy._plain.n_features + 2)
    assert len(strategy.next_batch(8, seen, history)) == 8
    ms = np.where(np.isfinite(recorded.objective_ms), recorded.objective_ms, 1.0)
    used = set()
    for prior in (PriorMean(-np.log(ms), "the truth"), PriorMean(np.log(ms), "backwards")):
        strategy = make_strategy("bo", space, seed=0, prior=prior)
        history: list[Observation] = []
        for _ in range(4):  # the backwards prior loses on the second batch's results
            seen = {o.row for o in history}
            history += _observe(recorded, strategy.next_batch(8, seen, history))
            used.add(strategy.last_used_prior)
    assert used == {True, False}  # rounds driven by the prior and by the measurements alone


def test_leave_one_out_z_scores_are_those_of_refitting_without_each_point():
    """The closed form must equal conditioning the fitted GP (the same hyperparameters and
    standardised targets) on all points but one and predicting that one, noise included."""
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(11)
    X = rng.random((12, 3))
    y = np.sin(5 * X[:, 0]) + X[:, 1] + 0.05 * rng.standard_normal(12)
    gp = GaussianProcess(3, seed=0)
    gp.fit(X, y)
    t = (y - y.mean()) / y.std()
    K = gp.kernel.train(X)  # training covariance, noise included
    expected = []
    for i in range(len(X)):
        rest = np.arange(len(X)) != i
        weights = np.linalg.solve(K[np.ix_(rest, rest)], K[rest, i])
        mean = weights @ t[rest]
        variance = K[i, i] - K[i, rest] @ weights
        expected.append((t[i] - mean) / np.sqrt(variance))
    assert np.allclose(gp.posterior.loo_z_scores(), expected, rtol=1e-8, atol=1e-10)


def test_equal_targets_are_standardised_to_zero_whatever_their_value():
    """Equal measurements (a recorded dataset's rounded timings) must give the GP the same
    spread and evidence whatever their common value: np.mean of equal values can miss them
    by a rounding error, which np.std must not turn into the targets' unit."""
    from pipetune.tuner.matern_gp import standardise
    from pipetune.tuner.surrogate import GaussianProcess

    t, mean, std = standardise(np.full(7, 13.7))
    assert np.array_equal(t, np.zeros(7)) and mean == 13.7 and std == 1.0
    rng = np.random.default_rng(0)
    X = rng.random((7, 2))
    X_c = rng.random((5, 2))
    fits = []
    for value in (0.0, 13.7):
        gp = GaussianProcess(2, seed=0)
        gp.fit(X, np.full(7, value))
        fits.append((gp.log_evidence(), gp.predict(X_c)[1]))
    assert fits[1][0] == pytest.approx(fits[0][0])
    assert np.allclose(fits[1][1], fits[0][1])


def test_the_log_evidence_is_the_same_whether_the_fit_re_estimated_or_kept_its_kernel():
    """bo compares two GPs' log evidence while one may have re-estimated its hyperparameters
    this round and the other kept its last estimate: the same kernel on the same data must
    report the same evidence either way (the hyperprior's density counted in both), or the
    GP that skipped its re-estimate gains the hyperprior's nats in the comparison."""
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(0)
    X = rng.random((12, 6))
    y = np.sin(5 * X[:, 0]) + np.cos(4 * X[:, 1]) + 0.05 * rng.standard_normal(12)
    gp = GaussianProcess(6, seed=0)
    gp.fit(X, y)
    re_estimated, kernel = gp.log_evidence(), gp.kernel
    gp.fit(X, y, new_share=1)  # no new data: the last estimate is kept
    assert gp.kernel is kernel
    assert gp.log_evidence() == pytest.approx(re_estimated, abs=1e-9)


def test_the_spread_is_widened_where_the_gp_is_more_confident_than_its_held_out_errors():
    """A smooth function with one point far off it: the fit calls that point's excess noise
    it cannot see elsewhere, and its leave-one-out errors exceed what it predicts. The spread
    (predict, and the believer's) is then the fitted one times the root-mean-square z-score;
    never narrower than fitted."""
    from pipetune.tuner.surrogate import GaussianProcess

    rng = np.random.default_rng(0)
    X = rng.random((8, 4))
    y = np.sin(6 * X[:, 0])
    y[3] += 2.0
    gp = GaussianProcess(4, seed=0)
    gp.fit(X, y)
    rms = float(np.sqrt(np.mean(gp.posterior.loo_z_scores() ** 2)))
    assert rms > 1.1 and gp.cv_scale == pytest.approx(rms)
    X_c = rng.random((50, 4))
    fitted_sd = gp.posterior.predict(X_c)[1]
    assert np.allclose(gp.predict(X_c)[1], fitted_sd * rms)
    assert np.allclose(gp.fantasies(X_c).sd, fitted_sd * rms)
    # A GP whose held-out errors are within its spread keeps the spread it fitted.
    rng = np.random.default_rng(2)
    X = rng.random((30, 4))
    y = np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(30)
    calibrated = GaussianProcess(4, seed=0)
    calibrated.fit(X, y)
    assert np.mean(calibrated.posterior.loo_z_scores() ** 2) < 1.0
    assert calibrated.cv_scale == 1.0
    assert np.array_equal(calibrated.predict(X_c)[1], calibrated.posterior.predict(X_c)[1])


def test_a_prior_is_not_judged_on_its_own_best_guesses_alone(recorded, space):
    # The first trials under a prior are its best guesses: they span a sliver of its range,
    # and among them the measurements barely follow it whether it is right or wrong (a
    # restriction of range). Here the prior ranks the whole space faithfully, but among its
    # eight best the measurements are level up to noise three times the prior's differences
    # there.
    faithful = recorded_prior(recorded, recorded.configs, recorded.knob_names)
    best8 = np.argsort(-faithful.values, kind="stable")[:8]
    rng = np.random.default_rng(0)
    level = float(faithful.values[best8].mean())
    y = level + rng.normal(0.0, 3 * float(faithful.values[best8].std()), size=8)
    history = [
        Observation(row=int(r), latency_s=float(np.exp(-v)), failed=False)
        for r, v in zip(best8, y, strict=True)
    ]
    strategy = make_strategy("bo", space, seed=0, prior=faithful)
    assert isinstance(strategy, BayesianStrategy)
    slope, variance = strategy._slope(y, best8)
    assert variance > bo.SLOPE_SD**2  # the data cannot tell the slope
    assert abs(strategy._scale(y, best8) - 1.0) < abs(slope - 1.0)  # the belief holds it near 1
    design = set(strategy._design_rows(8, set()))
    rows = strategy.next_batch(8, set(best8.tolist()), history)
    assert strategy.last_used_prior is True
    # Nothing to judge the prior against yet: the GP of the measurements alone is not fitted.
    assert strategy._plain.posterior is None
    assert not set(rows) & design  # the prior drives the round: no fallback to the design
    # and its picks lean on it: by the prior's ranking most are in the top third of the
    # space (a sample that ignored the prior would rank about half way down).
    rank = np.argsort(np.argsort(-faithful.values, kind="stable"))
    assert np.median(rank[rows]) < len(space) / 3


def test_a_decisive_prior_refreshes_its_rivals_hyperparameters_only_as_the_data_double(
    recorded, space
):
    # A faithful prior explains the measurements far better than the measurements alone do:
    # the plain GP is then only conditioned on new trials, its hyperparameters re-estimated
    # once the data have doubled, while the prior's GP is re-estimated as usual.
    faithful = recorded_prior(recorded, recorded.configs, recorded.knob_names)
    strategy = make_strategy("bo", space, seed=0, prior=faithful)
    assert isinstance(strategy, BayesianStrategy)
    history: list[Observation] = []
    lagged = 0  # rounds that conditioned the plain GP on data it was not re-estimated on
    for _ in range(6):
        lead, estimated_on = strategy._lead, strategy._plain._estimated_on
        rows = strategy.next_batch(8, {o.row for o in history}, history)
        n_ok = sum(not o.failed for o in history)  # what this round was fit to
        if lead > bo.LEAD_MARGIN:  # decisive before the round: refreshed only on doubling
            refreshed = strategy._plain._estimated_on
            assert refreshed == estimated_on or refreshed >= 2 * estimated_on
            assert strategy._plain.training_data[1].shape == (n_ok,)  # every trial
            lagged += n_ok > refreshed
        assert strategy._residual is not None and strategy._residual._estimated_on == n_ok
        history += _observe(recorded, rows)
    assert strategy.last_used_prior is True
    assert strategy._lead > bo.LEAD_MARGIN
    assert lagged >= 1


# ---- early proposals: trials proposed and not measured yet --------------------------------


def test_trials_still_measured_are_believed_as_a_batchs_own_picks_are():
    """A batch proposed while earlier picks are unmeasured believes them first: its picks
    are the ones that follow those picks in a batch that had made them itself."""
    from pipetune.tuner.acquisition import believer_batch, constrained_score

    _, features, y, gp = _gp_on_cosines(rows=800, fitted=20, seed=3)
    offset = np.zeros(len(features))
    p_ok = np.ones(len(features))
    best = float(y.max())

    def whole_pool(excluded):
        unvisited = np.setdiff1d(np.arange(20, len(features)), excluded)
        mean, sd = gp.predict(features[unvisited])
        score = constrained_score(mean, sd, best, p_ok[unvisited])
        first = np.full(len(features), -np.inf)
        first[unvisited] = score
        return unvisited[np.argsort(-score, kind="stable")], first

    pool, first = whole_pool([])
    eight = believer_batch(gp, best, features, offset, p_ok, [pool] * 8, first)
    pool, first = whole_pool(eight[:3])
    rest = believer_batch(
        gp, best, features, offset, p_ok, [pool] * 5, first, pending=np.array(eight[:3])
    )
    assert rest == eight[3:]
    # Not vacuous: without believing them, the batch goes elsewhere.
    assert believer_batch(gp, best, features, offset, p_ok, [pool] * 5, first) != eight[3:]


def test_the_model_takes_over_once_the_design_is_proposed_not_once_it_is_measured(recorded, space):
    """With two of the design's eight trials still measured, the next batch is the model's
    (the design is not extended to make up for trials that are only late)."""
    for seed in range(3):
        strategy = make_strategy("bo", space, seed=seed)
        design = strategy.next_batch(8, set(), [])
        history = _observe(recorded, design[:6])
        batch = strategy.next_batch(8, set(design), history)
        assert not set(batch) & set(design)
        assert batch != strategy._design_rows(8, set(design))
        assert [r in strategy._local_rows for r in batch] == [False, True, True] * 2 + [
            False,
            True,
        ]


def test_a_benchmark_run_proposes_early_when_asked(recorded, space):
    """run_strategy_rows(early=k): from the second batch on, each batch is proposed while the
    last k trials of the one before are unmeasured, and every trial is measured in the end."""
    calls = []

    class Recording(Strategy):
        name = "recording"

        def next_batch(self, n, exclude, history):
            calls.append((len(exclude), len(history)))
            return [r for r in range(len(self.space)) if r not in exclude][:n]

    rows = run_strategy_rows(Recording(space, None), recorded.objective_ms, 20, 8, early=2)
    assert calls == [(0, 0), (8, 8), (16, 14)]  # the first batch is always waited for
    assert rows == list(range(20))
    calls.clear()
    assert run_strategy_rows(Recording(space, None), recorded.objective_ms, 20, 8) == list(
        range(20)
    )
    assert calls == [(0, 0), (8, 8), (16, 16)]


def test_the_map_fit_stops_within_a_hundredth_of_a_nat_of_the_optimum():
    """The MAP fits stop at MAP_FTOL, far looser than scipy's defaults: on data of the
    kinds a search meets (smooth, rough, mostly noise; 12 to 120 points) the estimate's
    objective must stay within 0.01 nats of what the default tolerances reach from the same
    starts (the search compares fits by 0.5 nats and more), and cost fewer evaluations."""
    from scipy.optimize import minimize

    from pipetune.tuner import surrogate
    from pipetune.tuner.matern_gp import neg_log_posterior, pair_sq_diffs, standardise

    rng = np.random.default_rng(3)
    loose_evals = tight_evals = 0
    for n, d, roughness in ((12, 4, 3.0), (40, 8, 8.0), (120, 6, 1.0), (60, 5, 0.0)):
        X = rng.random((n, d))
        signal = np.sin(roughness * X @ rng.standard_normal(d)) if roughness else 0.0
        y = signal + 0.05 * rng.standard_normal(n)
        gp = surrogate.GaussianProcess(d, seed=0)
        t, _, _ = standardise(y)
        D2 = pair_sq_diffs(X)

        def objective(theta, D2=D2, t=t, gp=gp):
            return neg_log_posterior(theta, D2, t, gp.log_ls_mean, gp.log_ls_var)

        rough = gp.start.theta.copy()
        rough[1 : 1 + d] = np.log(0.3)
        for start in (gp.start.theta, rough):
            kwargs = dict(jac=True, method="L-BFGS-B", bounds=gp._bounds())
            loose = minimize(objective, start, options={"ftol": surrogate.MAP_FTOL}, **kwargs)
            tight = minimize(objective, start, **kwargs)
            assert loose.fun - tight.fun < 0.01, (n, d, loose.fun, tight.fun)
            loose_evals += loose.nfev
            tight_evals += tight.nfev
    assert loose_evals < tight_evals


def test_a_search_whose_prior_points_only_at_failures_finds_what_runs():
    """A GPU that fails every schedule of the prior's favourite kind (here each with register
    double-buffering: half the space, and all of the analytical model's top picks). With no
    success the GP's mean was the prior's ranking and the failure classifier had one class,
    so `auto` went down that ranking to the end of its budget: 0 of 64 trials ran. After a
    design's worth of failures it takes the space-filling design, as `bo` starts."""
    from pipetune.model.family import family_of
    from pipetune.model.hardware import get_gpu
    from pipetune.tuner.offline import RecordedSpace, run_offline

    workload = gemm(256, 128, 512)
    space = Space.enumerate(workload, get_gpu("h100"))
    predicted_s = family_of(workload).evaluate(space).latency_us * 1e-6
    fails = space.knobs["reg_stages"] == 2
    latency_s = np.where(fails, np.inf, predicted_s)
    assert fails[np.argsort(predicted_s)[:8]].all()  # the prior's first picks all fail
    for strategy in ("auto", "analytical+xgb"):
        rows = run_offline(RecordedSpace(space, latency_s), strategy, seed=0, budget=24, batch=8)
        ran = np.isfinite(latency_s[rows])
        assert not ran[:8].any() and ran[8:16].sum() >= 2, strategy


def test_a_dropped_prior_completes_the_design_it_proposed_not_only_what_was_measured(
    recorded, space
):
    """Proposing early (a batch while trials of the last are pending), the design rows still
    pending counted as missing once the prior was dropped, and later design rows were
    proposed in their place."""
    lying = PriorMean(
        np.log(np.where(np.isfinite(recorded.objective_ms), recorded.objective_ms, 1.0)),
        source="backwards",
    )
    for early in (0, 3, 5):
        strategy = make_strategy("bo", space, seed=0, prior=lying)
        design = design_rows(strategy.encoding, 16, 0)
        rows = run_strategy_rows(strategy, recorded.objective_ms, 64, 8, early=early)
        assert strategy.last_used_prior is False
        assert sum(r in rows for r in design[:8]) == 8
        assert sum(r in rows for r in design[8:]) <= 1, early


@pytest.mark.parametrize("strategy", ["analytical+xgb", "auto"])
def test_a_dropped_prior_still_fills_the_batch(strategy):
    """The round that dropped the prior returned only the design rows still missing: 6 of 8
    on a measured space (H100 BMM_BERT_QK, seed 0, its fourth batch, as the model then
    stood), with 662 rows unvisited, and the service's workers idled for a round. The rest of
    the batch now comes from the model, the design rows believed as pending. Which run drops
    the prior in a round with some design rows missing moves with the model (readings 14-17
    moved it from seed to seed, then to other spaces; one run in about twelve), so three
    measured spaces' seeds are searched until one does, every round of every run checked
    full on the way."""
    from pathlib import Path

    from pipetune.clients.cli.bench_cmds import recorded_dataset
    from pipetune.tuner.session import TuningSession

    data = Path(__file__).resolve().parents[1] / "benchmarks/data"
    seen: dict[tuple[str, int], list[int]] = {}
    for name in ("h100/BMM_GPT2_QK", "h200/BMM_BERT_QK", "h100/BMM_BERT_QK"):
        rec = recorded_dataset(data / f"{name}.t4.json.gz").ours
        assert rec is not None
        for seed in range(16):
            session = TuningSession(
                rec.space.workload, rec.space.gpu, strategy, seed, 64, space=rec.space
            )
            dropped = []
            while session.remaining:
                left = session.remaining
                batch = session.propose(8)
                assert len(batch) == min(8, left)  # every round full, the dropping one too
                if session.strategy.last_used_prior is False:
                    design = set(session.strategy._design_rows(8, set()))
                    dropped.append(len(design & {rec.space.index(s) for s in batch}))
                session.observe([(s, rec.result(rec.space.index(s))) for s in batch])
            assert len(session.history) == 64
            seen[name, seed] = dropped
            # The round this is about: a full batch of the design rows still missing and
            # the model's.
            if any(0 < designed < 8 for designed in dropped):
                return
    raise AssertionError(f"no run dropped the prior with design rows missing: {seen}")

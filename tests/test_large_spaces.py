"""Foreign spaces larger than any of the development set (Kernel Tuner caches of 10^5 and more
configurations): a search round's work is bounded by its candidate pool, not by the space.

The spaces here are synthetic (test plumbing, not measurements): a grid of 80,000
configurations of eight knobs, a smooth landscape with a failing corner, just past the
candidate pool (65,536), so that the mechanism is tested at a size a test can afford.
"""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from test_tuner_bo import _observe

from pipetune.tuner import bo, design
from pipetune.tuner.encoding import KnobEncoding
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.sa import KnobCodec
from pipetune.tuner.strategies import make_strategy
from pipetune.tuner.strategy_base import Observation

LEVELS = (5, 5, 5, 5, 4, 4, 4, 2)  # 80,000 configurations


def grid_space(levels: tuple[int, ...] = LEVELS, seed: int = 0) -> RecordedConfigs:
    """Every combination of the knobs' values: latency a seeded bowl with 2% noise, failing
    where the first two knobs are both at their top value (as too many threads would)."""
    rng = np.random.default_rng(seed)
    index = np.array(list(itertools.product(*(range(v) for v in levels))))
    scaled = index / (np.array(levels) - 1)
    centre = rng.uniform(0.2, 0.8, len(levels))
    ms = 1.0 + ((scaled - centre) ** 2).sum(axis=1) * np.exp(0.02 * rng.standard_normal(len(index)))
    ms[(scaled[:, 0] == 1) & (scaled[:, 1] == 1)] = np.inf
    knobs = {f"k{j}": [2**v for v in range(n)] for j, n in enumerate(levels)}
    configs = [{k: 2**v for k, v in zip(knobs, row, strict=True)} for row in index.tolist()]
    return RecordedConfigs("grid", knobs, configs, ms)


@pytest.fixture(scope="module")
def large() -> RecordedConfigs:
    return grid_space()


def _counting_predictions(patch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each prediction of a round scores (bo._predict_rows counted)."""
    predicted: list[int] = []
    real_predict = bo._predict_rows

    def counted(model, features, rows):  # type: ignore[no-untyped-def]
        predicted.append(len(rows))
        return real_predict(model, features, rows)

    patch.setattr(bo, "_predict_rows", counted)
    return predicted


def _first_trials(recorded: RecordedConfigs, count: int = 16) -> list[Observation]:
    """Trials spread over the space (past the initial design), some of them failed."""
    rows = np.random.default_rng(5).choice(len(recorded.configs), size=count, replace=False)
    failing = np.flatnonzero(~np.isfinite(recorded.objective_ms))[:2]
    return _observe(recorded, [*rows.tolist(), *failing.tolist()])


def test_a_round_on_a_large_space_scores_a_pool_not_the_whole_space(large, monkeypatch):
    # Each round predicted the surrogate, the failure classifier and the acquisition over
    # every unvisited row: 5-7 s a round on a million configurations. Past the pool, a
    # sample of it and the whole trust region around the best measurement are scored.
    space = ForeignSpace(large)
    strategy = make_strategy("bo", space, seed=0)
    history = _first_trials(large)
    predicted = _counting_predictions(monkeypatch)
    batch = strategy.next_batch(8, {o.row for o in history}, history)

    assert len(batch) == len(set(batch)) == 8
    assert not set(batch) & {o.row for o in history}
    incumbent = min((o for o in history if not o.failed), key=lambda o: o.latency_s).row
    region = int(np.count_nonzero(strategy.encoding.knob_changes(incumbent) <= strategy.radius))
    assert predicted and max(predicted) < len(large.configs) - 10_000  # before: 79,982
    assert max(predicted) <= bo.CANDIDATE_POOL + region


def test_a_small_space_is_still_scored_whole():
    # Below the pool (every space of the development set, pipetune's own): every unvisited
    # row, as before the pool existed, so their searches are the same.
    recorded = grid_space((4, 4, 4, 4, 3, 3))  # 2,304 configurations
    strategy = make_strategy("bo", ForeignSpace(recorded), seed=0)
    history = _first_trials(recorded)
    with pytest.MonkeyPatch.context() as patch:
        predicted = _counting_predictions(patch)
        strategy.next_batch(8, {o.row for o in history}, history)
    assert predicted[0] == len(recorded.configs) - len(history)


def test_a_sampled_round_is_replayed_exactly(large):
    # The sample is drawn from the session's seed and history: the service replays a
    # session by asking again.
    space = ForeignSpace(large)
    history = _first_trials(large)
    exclude = {o.row for o in history}
    first = make_strategy("auto", space, seed=3).next_batch(8, set(exclude), history)
    again = make_strategy("auto", space, seed=3).next_batch(8, set(exclude), history)
    assert first == again


def test_the_design_of_a_large_space_is_herded_over_a_sample(large, monkeypatch):
    # The initial design measured every configuration's distance to 256 reference rows and
    # to every pick: 3.7 s on a million configurations before the first trial.
    encoding = KnobEncoding.of(ForeignSpace(large))
    measured: list[int] = []
    real_distances = KnobEncoding.l1_distances

    def counted(self, rows, to):
        found = real_distances(self, rows, to)
        measured.append(found.shape[0] * found.shape[1])
        return found

    monkeypatch.setattr(KnobEncoding, "l1_distances", counted)
    rows = design.design_rows(encoding, 16, seed=0)
    assert len(set(rows)) == 16 and all(0 <= r < len(encoding) for r in rows)
    reference = design.REFERENCE_ROWS
    assert sum(measured) < 0.9 * len(encoding) * (reference + 16)  # before: every row's
    assert sum(measured) <= reference * reference + design.CANDIDATE_ROWS * (reference + 16)
    assert design.design_rows(encoding, 16, seed=0) == rows  # seeded


def test_the_codec_of_a_grid_past_int64_holds_arrays_not_tuples():
    # Past 2^62 grid cells the codec kept a dict of every row's tuple of value indices: a
    # million configurations of 32 knobs held 1.2 GB more than their value indices.
    rng = np.random.default_rng(2)
    knobs, values = 40, 8  # a grid of 2^120
    domain = [tuple(range(values))] * knobs
    matrix = np.unique(rng.integers(0, values, size=(20_000, knobs)), axis=0)
    tracemalloc.start()
    try:
        codec = KnobCodec(domain, matrix)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * codec.value_index.nbytes, (peak, codec.value_index.nbytes)
    assert np.array_equal(codec.rows(codec.value_index), np.arange(len(matrix)))
    moved = codec.value_index[:50].copy()
    moved[:, 3] = (moved[:, 3] + 1) % values
    assert np.array_equal(codec.rows(moved[None]), codec.rows(moved)[None])  # any shape


def test_the_benchmarks_space_is_read_as_a_kernel_tuner_cache(tmp_path):
    # benchmarks/bench_large_spaces.py --write-cache: the file `pipetune bench tuner` reads,
    # the same configurations and failures as the benchmark searches in memory.
    from benchmarks.bench_large_spaces import recorded_configs, write_cache
    from pipetune.clients.cli.bench_cmds import recorded_dataset

    path = tmp_path / "synthetic.kt-cache.json.gz"
    count = write_cache(str(path), 3000)
    loaded, expected = recorded_dataset(path).configs, recorded_configs(3000)
    assert len(loaded.configs) == count == len(expected.configs)
    assert loaded.configs == expected.configs
    assert loaded.tune_params == expected.tune_params
    failed = ~np.isfinite(expected.objective_ms)
    assert 0 < failed.sum() < len(failed) / 2
    assert np.array_equal(~np.isfinite(loaded.objective_ms), failed)
    np.testing.assert_allclose(loaded.objective_ms[~failed], expected.objective_ms[~failed], 1e-5)


def test_a_benchmark_builds_a_foreign_space_once_for_every_strategy_and_seed(monkeypatch):
    """Every strategy and seed of `bench tuner` searches the same space, built once (a
    million configurations took seconds a build): their proposals are what a fresh space
    per run gives."""
    from pipetune.tuner import recorded as recorded_module
    from pipetune.tuner.bench import Dataset, bench, trial_rows

    small = grid_space((4, 3, 3, 2))
    fresh = Dataset("fresh", grid_space((4, 3, 3, 2)))
    expected = {
        (s, seed): trial_rows(fresh, s, seed, 12) for s in ("random", "bo") for seed in (0, 1)
    }
    built = []
    original_init = recorded_module.ForeignSpace.__init__

    def counting_init(self, recorded):
        built.append(recorded.name)
        original_init(self, recorded)

    monkeypatch.setattr(recorded_module.ForeignSpace, "__init__", counting_init)
    dataset = Dataset("grid", small)
    bench([dataset], ["random", "bo"], [4, 12], seeds=2)
    rows = {
        (s, seed): trial_rows(dataset, s, seed, 12) for s in ("random", "bo") for seed in (0, 1)
    }
    assert built == ["grid"]
    assert rows == expected

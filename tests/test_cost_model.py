"""XGBoost cost model: pretraining, refit, determinism, save/load."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from pipetune.model.analytical import evaluate
from pipetune.model.cost_model import CostModel, measured_log_tflops, predicted_log_tflops
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import MemSpace
from pipetune.model.memops.workloads import softmax
from pipetune.model.space import Space
from pipetune.model.workloads import bmm, gemm


@pytest.fixture(scope="module")
def space(h100):
    return Space.enumerate(gemm(2048, 1024, 1024), h100)


def test_pretrained_model_ranks_like_the_analytical_model(space):
    model = CostModel(seed=0)
    model.pretrain([space])
    rho = spearmanr(model.predict(space), -evaluate(space).T_kernel).statistic
    assert rho > 0.95


def test_corpus_pretraining_starts_a_new_shape_warm(h100, space):
    corpus = [Space.enumerate(w, h100) for w in (gemm(1024, 1024, 1024), bmm(12, 512, 512, 64))]
    model = CostModel(seed=0)
    model.pretrain(corpus)
    rho = spearmanr(model.predict(space), predicted_log_tflops(space)).statistic
    assert rho > 0.8  # never saw this shape, still ranks it


def test_refit_moves_predictions_toward_measurements(space):
    model = CostModel(seed=0)
    model.pretrain([space])
    rows = np.arange(0, len(space), 7)
    prior = model.predict(space)[rows]
    # Measurements that are uniformly 3x slower than the model predicts.
    latency = evaluate(space).T_kernel[rows] * 3.0
    target = measured_log_tflops(space, latency, np.zeros(len(rows), dtype=bool))
    model.fit(space, rows, latency, np.zeros(len(rows), dtype=bool))
    after = model.predict(space)[rows]
    assert np.mean(np.abs(after - target)) < 0.5 * np.mean(np.abs(prior - target))


def test_failed_trials_are_learned_as_slow(space):
    failed = np.array([False, False, True])
    y = measured_log_tflops(space, np.array([1e-4, 2e-4, np.nan]), failed)
    assert y[2] < y.min(where=~failed, initial=np.inf)


def test_fits_are_deterministic_and_round_trip_through_json(space, tmp_path):
    rows = np.arange(0, 40)
    latency = evaluate(space).T_kernel[rows] * 1.7
    fails = np.zeros(len(rows), dtype=bool)
    preds = []
    for _ in range(2):
        m = CostModel(seed=5)
        m.pretrain([space])
        m.fit(space, rows, latency, fails)
        preds.append(m.predict(space))
    assert np.array_equal(preds[0], preds[1])
    m.save(tmp_path / "cm.json")
    loaded = CostModel.load(tmp_path / "cm.json")
    assert np.allclose(loaded.predict(space), preds[1])


def test_xgb_without_prior_cannot_pretrain_and_must_be_fitted(space):
    m = CostModel(use_analytical=False)
    with pytest.raises(ValueError):
        m.pretrain([space])
    with pytest.raises(RuntimeError):
        m.predict(space)


def test_corpus_fit_carries_a_measured_effect_to_an_unseen_shape(h100, space):
    """Another GPU's or other shapes' measurements (fit_corpus): an effect the analytical
    model lacks (one-stage schedules 2x slower) is learned and predicted on a new shape."""
    corpus = [Space.enumerate(w, h100) for w in (gemm(1024, 1024, 1024), bmm(12, 512, 512, 64))]
    measured = []
    for s in corpus:
        latency = evaluate(s).T_kernel * np.where(s.knobs["smem_stages"] == 1, 2.0, 1.0)
        measured.append((s, latency, np.zeros(len(s), dtype=bool)))
    model = CostModel(seed=0)
    model.fit_corpus(measured)
    gap = model.predict(space) - predicted_log_tflops(space)  # measured over modelled, log
    one_stage = space.knobs["smem_stages"] == 1
    assert np.median(gap[~one_stage]) - np.median(gap[one_stage]) > 0.5  # log 2 = 0.69
    with pytest.raises(ValueError, match="at least one"):
        CostModel().fit_corpus([])


def test_a_corpus_teaches_how_schedules_rank_not_how_fast_each_shape_is(h100, space):
    """fit_corpus learns each space relative to its own median: a shape measured ten times
    slower throughout (another GPU's level, a busier machine) teaches the same model. Fitted
    to absolute log throughput, the trees spent splits on telling shapes apart, and a shape
    they had not seen was ranked by where its features fell among the shapes' levels."""
    corpus = [Space.enumerate(w, h100) for w in (gemm(1024, 1024, 1024), bmm(12, 512, 512, 64))]
    fits = []
    for slower in (1.0, 10.0):
        measured = [
            (s, evaluate(s).T_kernel * (slower if i else 1.0), np.zeros(len(s), dtype=bool))
            for i, s in enumerate(corpus)
        ]
        model = CostModel(seed=0)
        model.fit_corpus(measured)
        fits.append(model.predict(space))
    assert np.array_equal(fits[0], fits[1])


def test_memops_spaces_pretrain_and_fit_with_the_models_terms(h100):
    """The memory-intensive family's model terms beside its schedule features (a duplicated
    column name once made every fit with the analytical features fail)."""
    space = MemSpace.enumerate(softmax(4096, 768), h100)
    model = CostModel(seed=0)
    model.pretrain([space])
    truth = predicted_log_tflops(space)
    assert spearmanr(model.predict(space), truth).statistic > 0.95
    rows = np.arange(0, len(space), 3)
    latency = family_of(space.workload).evaluate(space).T_kernel[rows] * 1.5
    model.fit(space, rows, latency, np.zeros(len(rows), dtype=bool))
    assert model.predict(space).shape == (len(space),)


def test_two_subsets_of_one_size_are_two_spaces_to_the_feature_cache(space):
    """The cache key was (workload, GPU, profile, size): the learned prior, fitted on one
    space per finished task, took one task's cached features for another task's of the same
    shape and trial count, and paired them with the other's latencies."""
    first, second = space.subset(np.arange(0, 50)), space.subset(np.arange(100, 150))
    assert first.cache_key != second.cache_key
    assert space.subset(np.arange(0, 50)).cache_key == first.cache_key  # the same rows: one key
    model = CostModel()
    for part in (first, second):
        own = np.hstack([part.features(), family_of(part.workload).model_features(part)[1]])
        assert np.array_equal(model.features(part), own)


def test_knob_names_xgboost_refuses_are_escaped_not_fatal():
    """A recorded space's knob names are any string; XGBoost refuses "[", "]" and "<" in a
    feature name, and `xgb` on a Kernel Tuner cache with a knob "tile[0]" ended with a bare
    ValueError at its first fit. The names are escaped, distinct, and pipetune's own
    families' unchanged."""
    import itertools

    from pipetune.model.cost_model import CostModel
    from pipetune.tuner.bench import Dataset, trial_rows
    from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs

    knobs = {"tile[0]": [1, 2, 4, 8], "b<c": [16, 32, 64], "tile%5B0]": [1, 2]}
    configs = [dict(zip(knobs, v, strict=True)) for v in itertools.product(*knobs.values())]
    recorded = RecordedConfigs("t", knobs, configs, np.random.default_rng(0).random(24) + 0.1)
    rows = trial_rows(Dataset("t", recorded), "xgb", 0, 20, 4)
    assert len(set(rows)) == 20
    names = CostModel(seed=0, use_analytical=False).feature_names(ForeignSpace(recorded))
    assert len(set(names)) == len(names) and not any(c in n for n in names for c in "[]<")
    ours = Space.enumerate(gemm(1024, 64, 2048), get_gpu("h100"))
    assert CostModel(seed=0).feature_names(ours) == list(CostModel(seed=0)._columns_of(ours)[0])

"""The tuner benchmark's learned prior leaves out a dataset's whole shape
(tuner/learned_prior.py `unseen_shape_priors`), not only its own workload: a same-shape twin
that differs in a constant (a layer norm's eps, the GELU's form) ranks the schedules alike."""

from __future__ import annotations

import numpy as np
import pytest

from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import bias_gelu, layernorm, softmax
from pipetune.tuner.bench import Dataset
from pipetune.tuner.learned_prior import shape_of, unseen_shape_priors
from pipetune.tuner.offline import RecordedSpace
from pipetune.tuner.recorded import RecordedConfigs


def _measured(workload, gpu) -> RecordedSpace:
    """The analytical model's latencies with seeded noise, as if measured."""
    space = family_of(workload).enumerate(workload, gpu)
    modelled = family_of(workload).evaluate(space).T_kernel
    noise = np.exp(np.random.default_rng(0).normal(0, 0.1, len(space)))
    return RecordedSpace(space, modelled * noise)


def _dataset(workload, gpu) -> Dataset:
    rec = _measured(workload, gpu)
    return Dataset("target", RecordedConfigs.from_recorded_space("target", rec), rec)


@pytest.mark.parametrize(
    ("target", "twin"),
    [
        (layernorm(1024, 768, 1e-12), layernorm(1024, 768, 1e-5)),  # BERT's and GPT-2's
        (bias_gelu(1024, 3072, "none"), bias_gelu(1024, 3072, "tanh")),  # erf and tanh
    ],
)
def test_a_same_shape_twin_is_left_out_of_the_learned_prior(h100, target, twin):
    """The twin (another workload hash) stayed in the corpus: LayerNorm_GPT2 taught
    LayerNorm_BERT's prior, and "each shape is unseen" was not what ran."""
    assert twin.workload_hash != target.workload_hash
    assert shape_of(twin) == shape_of(target)
    other = type(target)(**{**target.canonical(), "rows": 2048})  # another shape: kept
    assert shape_of(other) != shape_of(target)
    corpus = [_measured(twin, get_gpu("h200", calibrated=False)), _measured(other, h100)]
    priors, why_not = unseen_shape_priors([_dataset(target, h100)], corpus)
    assert why_not == {}
    assert priors["target"].source.endswith("a cost model of 1 measured shape on h100")


def test_a_shape_is_the_family_and_the_sizes(h100):
    # Of one family, the same sizes are one shape whatever the operator's constants; other
    # sizes or another family are not.
    assert shape_of(softmax(1024, 768)) == shape_of(layernorm(1024, 768, 1e-12))
    assert shape_of(softmax(1024, 768)) != shape_of(softmax(1024, 1536))
    assert shape_of(softmax(1024, 768))[0] == "memops"

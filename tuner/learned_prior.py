"""A prior mean learned from measurements of other shapes, on this GPU or others.

The analytical model ranks a new space with no measurement at all; measurements of other
spaces of the same kernel family (other shapes, other GPUs) teach where it errs. The cost
model (model/cost_model.py: the schedule's features and the analytical model's terms,
XGBoost) is fitted to their log throughput (`CostModel.fit_corpus`: log throughput is
comparable across shapes and GPUs) and predicts this space's rows from its own features and
its own GPU's analytical terms. The search (tuner/bo.py) takes that as its prior mean in the
analytical model's place, and judges it against the measurements as it judges any prior.

On the committed campaigns, a cost model trained on one GPU's measurements of the other
ALCOP operators ranks the other GPU's schedules of an operator it never saw better than the
analytical model (best-in-top-10 0.95 against 0.84-0.88: benchmarks/RESULTS.md,
"Cross-GPU"); on the memory-intensive operators, where the analytical model already ranks
at 0.97, it does worse, so `learned_prior` is the caller's choice per family, not a default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipetune.model.cost_model import CostModel
from pipetune.model.family import family_of
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.offline import RecordedSpace


class LearnedPriorError(ValueError):
    """A corpus that cannot teach this space (empty, or another kernel family)."""


def corpus_for(space: Any, recorded: Sequence[RecordedSpace]) -> list[RecordedSpace]:
    """The recorded spaces that can teach `space`: the same kernel family, another workload
    or another GPU (a record of this very space is its answer, not a prior)."""
    family = family_of(space.workload)
    key = (space.workload.workload_hash, space.gpu.key)
    return [
        r
        for r in recorded
        if family_of(r.space.workload) is family
        and (r.space.workload.workload_hash, r.space.gpu.key) != key
    ]


def learned_prior(space: Any, corpus: Sequence[RecordedSpace], seed: int = 0) -> PriorMean:
    """The cost model fitted to the corpus's measurements, as a prior mean over `space`."""
    usable = corpus_for(space, corpus)
    if not usable:
        raise LearnedPriorError(
            f"no measured space of the {family_of(space.workload).name} family other than "
            "this one to learn from"
        )
    model = CostModel(seed=seed, use_analytical=True)
    model.fit_corpus([(r.space, r.latency_s, ~_succeeded(r.latency_s)) for r in usable])
    shapes = len({r.space.workload.workload_hash for r in usable})
    gpus = sorted({r.space.gpu.key for r in usable})
    return PriorMean(
        values=np.asarray(model.predict(space), dtype=np.float64),
        source=f"a cost model of {shapes} measured shapes on {', '.join(gpus)}",
    )


def _succeeded(latency_s: np.ndarray) -> np.ndarray:
    latency_s = np.asarray(latency_s, dtype=np.float64)
    return np.isfinite(latency_s) & (latency_s > 0)

"""A prior mean learned from measurements of other shapes, on this GPU or others.

The analytical model ranks a new space with no measurement at all; measurements of other
spaces of the same kernel family (other shapes, other GPUs) teach where it errs. The cost
model (model/cost_model.py: the schedule's features and the analytical model's terms,
XGBoost) is fitted to their log throughput (`CostModel.fit_corpus`: log throughput is
comparable across shapes and GPUs) and predicts this space's rows from its own features and
its own GPU's analytical terms. The prior mean is the equal-weight average of that
prediction and the analytical model's (each centred on its median, in log throughput): two
rankers whose mistakes differ. The search (tuner/bo.py) judges it against the measurements
as it judges any prior.

Measured on the committed campaigns (benchmarks/RESULTS.md, "Tuner on the H200 ... learned"
and "Tuner on the H100 campaign"), each operator's own measurements left out on both GPUs:
the learned model alone lifts `auto`'s best-in-10 from 0.887 / 0.922 (H100 / H200) to
0.955 / 0.968 but loses a little at k=100 (0.997 / 0.995 against 0.999 / 0.997) and badly on
a few operators at k=10 (MM_RN50_FC 0.85 where the analytical prior finds the optimum); the
average reaches 0.935 / 0.970 at k=10 and 0.999 / 0.998 at k=100, never below the
analytical prior's geomean. Of those two (the only ones tried) the average is kept. On the
memory-intensive operators, where the analytical model ranks at 0.97, the learned model is
no better, so whether a task learns its prior unless told is the family's choice
(`KernelFamily.learns_by_default`: the tensor-core GEMMs do; benchmarks/RESULTS.md, "the
learned prior by default").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.model.cost_model import CostModel, predicted_log_throughput
from pipetune.model.family import family_of
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.offline import RecordedSpace

# The learned model's share of the prior mean: an equal-weight average, not a fitted weight.
LEARNED_WEIGHT = 0.5


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


@dataclass(frozen=True)
class LearnedModel:
    """The cost model fitted to a corpus, and what the corpus was: fitted once, it gives any
    space of its family a prior (`prior_from`; the fit is most of the cost, a second or more
    on the campaigns' datasets, and does not depend on the space)."""

    model: CostModel
    family: str
    shapes: int
    gpus: tuple[str, ...]


def fit_learned_model(corpus: Sequence[RecordedSpace], seed: int = 0) -> LearnedModel:
    """The cost model fitted to the measurements of `corpus` (spaces of one family)."""
    if not corpus:
        raise LearnedPriorError("no measured space to learn from")
    families = {family_of(r.space.workload).name for r in corpus}
    if len(families) > 1:
        raise LearnedPriorError(f"a corpus of one kernel family, not {sorted(families)}")
    model = CostModel(seed=seed, use_analytical=True)
    model.fit_corpus([(r.space, r.latency_s, r.throughput <= 0) for r in corpus])
    return LearnedModel(
        model,
        families.pop(),
        len({r.space.workload.workload_hash for r in corpus}),
        tuple(sorted({r.space.gpu.key for r in corpus})),
    )


def learned_prior(space: Any, corpus: Sequence[RecordedSpace], seed: int = 0) -> PriorMean:
    """The cost model fitted to the corpus's measurements, as a prior mean over `space`."""
    usable = corpus_for(space, corpus)
    if not usable:
        raise LearnedPriorError(
            f"no measured space of the {family_of(space.workload).name} family other than "
            "this one to learn from"
        )
    return prior_from(space, fit_learned_model(usable, seed))


def prior_from(space: Any, learned: LearnedModel) -> PriorMean:
    """The learned model's prior mean over `space` (a space of its family)."""
    if family_of(space.workload).name != learned.family:
        raise LearnedPriorError(
            f"a cost model of the {learned.family} family cannot rank a space of the "
            f"{family_of(space.workload).name} family"
        )
    predicted = np.asarray(learned.model.predict(space), dtype=np.float64)
    analytical = predicted_log_throughput(space)
    values = np.median(predicted) + LEARNED_WEIGHT * (predicted - np.median(predicted))
    values += (1.0 - LEARNED_WEIGHT) * (analytical - np.median(analytical))
    shapes, gpus = learned.shapes, learned.gpus
    return PriorMean(
        values=values,
        source=f"the analytical model averaged with a cost model of {shapes} measured shapes"
        f" on {', '.join(gpus)}",
    )


def unseen_shape_priors(
    datasets: Sequence[Any], corpus: Sequence[RecordedSpace]
) -> dict[str, PriorMean]:
    """Each of pipetune's datasets' (tuner.bench.Dataset) learned prior, with every record of
    its own workload left out on every GPU: the shape is unseen, so a benchmark says what
    measurements of other shapes are worth. A dataset with nothing of its family to learn
    from keeps the analytical model (it is left out of the answer)."""
    priors = {}
    for ds in datasets:
        if ds.ours is None:
            continue
        mine = ds.ours.space.workload.workload_hash
        unseen = [r for r in corpus if r.space.workload.workload_hash != mine]
        try:
            priors[ds.name] = learned_prior(ds.ours.space, unseen)
        except LearnedPriorError:
            continue
    return priors

"""A prior mean learned from measurements of other shapes, on this GPU or others.

The analytical model ranks a new space with no measurement at all; measurements of other
spaces of the same kernel family (other shapes, other GPUs) teach where it errs. The cost
model (model/cost_model.py: the schedule's features and the analytical model's terms,
XGBoost) is fitted to their log throughput, each space's relative to its own median
(`CostModel.fit_corpus`: how schedules rank carries across shapes and GPUs, a shape's level
does not), and predicts this space's rows from its own features and its own GPU's analytical
terms. That prediction is the prior mean, placed at the analytical model's median over the
space plus the corpus's median distance between measured and modelled levels (what a
lookup reports as the pick's predicted time). The search (tuner/bo.py) judges it against the
measurements as it judges any prior.

Measured on the committed campaigns, each operator's own shape left out on both GPUs
(benchmarks/RESULTS.md, "the learned prior ranks within a shape"): fitted to absolute log
throughput, the learned model ranked a shape's optimum into its first 8 at 0.939 / 0.946 of
it (H100 / H200) and the prior was its equal-weight average with the analytical model (two
rankers whose mistakes differed; the learned model alone had lost badly on a few
operators); fitted relative to each shape's median, the learned model alone reaches 0.982 /
0.983, and `auto` with it 0.983 / 0.988 at k=10 where the average had 0.963 / 0.981. Its
trees still read the analytical model's terms. Whether a task learns its prior unless told
is the family's choice (`KernelFamily.learns_by_default`: the tensor-core GEMMs and, since
the relative fit, the memory-intensive operators do, 0.995 / 0.990 at k=10 there against the
analytical model's 0.977 / 0.971; the Hopper wgmma family does not: on the H200's 15 measured
shapes, learned from the other 14, `auto` moved from 0.988 to 0.993 at k=10, gaining on 5 and
losing on 2, a gain too small and mixed to decide on one GPU's data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.model.cost_model import (
    CostModel,
    measured_log_throughput,
    median_level,
    predicted_log_throughput,
)
from pipetune.model.errors import PipetuneError
from pipetune.model.family import family_of, generator_revision_of
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.offline import RecordedSpace


class LearnedPriorError(PipetuneError, ValueError):
    """A corpus that cannot teach this space (empty, or another kernel family)."""


def measured_shapes(count: int) -> str:
    """How a prior's description counts its corpus: "1 measured shape", "2 measured shapes"."""
    return f"{count} measured shape{'' if count == 1 else 's'}"


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


def generator_line(recorded: RecordedSpace) -> str:
    """The generator line that made a recorded space's kernels."""
    return generator_revision_of(recorded.space.workload).line


def newest_revisions(recorded: Sequence[RecordedSpace]) -> dict[str, int]:
    """Per generator line, the newest revision that measured anything in `recorded`."""
    newest: dict[str, int] = {}
    for r in recorded:
        revisions = r.revision_of_rows()
        if len(revisions):
            line = generator_line(r)
            newest[line] = max(newest.get(line, 0), int(revisions.max()))
    return newest


def current_measurements(recorded: Sequence[RecordedSpace], line: str) -> list[RecordedSpace]:
    """`recorded` without the measurements of `line` (the generator line of the space a prior
    is for) made by an older revision than the newest of it that `recorded` holds. A change of
    the generated code that moved its schedules' times (a revision) leaves them describing
    kernels that no longer exist, and they teach the wrong ranking: learning from the H100's
    convolutions measured with the loader that divided, `auto` found 0.978 of the optimum in
    10 trials on the H200's convolutions, and 0.988 without them (benchmarks/RESULTS.md,
    "measurements of an older generator revision left out"). A space with none left is left
    out. Other lines' measurements stay, whatever their revision: they describe other kernels
    than the target's in any case, and leaving the old convolutions out of a GEMM's corpus as
    well cost the H200's GEMMs and batched GEMMs 0.005 at k=10. The newest revision present
    rather than this code's: the measurements a fleet has are all there is to learn from
    until its workers measure the new kernels."""
    newest = newest_revisions(recorded).get(line)
    kept = []
    for r in recorded:
        if newest is None or generator_line(r) != line:
            kept.append(r)
            continue
        keep = r.revision_of_rows() == newest
        if keep.all():
            kept.append(r)
        elif keep.any():
            kept.append(r.rows(keep))
    return kept


@dataclass(frozen=True)
class LearnedModel:
    """The cost model fitted to a corpus, and what the corpus was: fitted once, it gives any
    space of its family a prior (`prior_from`; the fit is most of the cost, a second or more
    on the campaigns' datasets, and does not depend on the space)."""

    model: CostModel
    family: str
    shapes: int
    gpus: tuple[str, ...]
    # How far the corpus measured above the analytical model, in log throughput: the median
    # over its spaces of each one's measured median less its modelled median.
    level: float = 0.0
    # The generator line it was fitted for (None: for any, from every measurement given),
    # and the measurements of that line left out as made by an older revision of it
    # (current_measurements): spaces left out whole, and rows in all.
    line: str | None = None
    stale_spaces: int = 0
    stale_rows: int = 0


def fit_learned_model(
    corpus: Sequence[RecordedSpace], seed: int = 0, line: str | None = None
) -> LearnedModel:
    """The cost model fitted to the measurements of `corpus` (spaces of one family); for the
    spaces of generator line `line`, without that line's older revisions
    (current_measurements; None: every measurement)."""
    if not corpus:
        raise LearnedPriorError("no measured space to learn from")
    families = {family_of(r.space.workload).name for r in corpus}
    if len(families) > 1:
        raise LearnedPriorError(f"a corpus of one kernel family, not {sorted(families)}")
    given = corpus
    corpus = given if line is None else current_measurements(given, line)
    stale_rows = sum(len(r.latency_s) for r in given) - sum(len(r.latency_s) for r in corpus)
    measured = [(r.space, r.latency_s, r.throughput <= 0) for r in corpus]
    model = CostModel(seed=seed, use_analytical=True)
    model.fit_corpus(measured)
    levels = [
        median_level(measured_log_throughput(space, latency_s, failed), failed)
        - median_level(predicted_log_throughput(space), failed)
        for space, latency_s, failed in measured
    ]
    return LearnedModel(
        model,
        families.pop(),
        len({r.space.workload.workload_hash for r in corpus}),
        tuple(sorted({r.space.gpu.key for r in corpus})),
        float(np.median(levels)),
        line=line,
        stale_spaces=len(given) - len(corpus),
        stale_rows=stale_rows,
    )


def learned_prior(space: Any, corpus: Sequence[RecordedSpace], seed: int = 0) -> PriorMean:
    """The cost model fitted to the corpus's measurements, as a prior mean over `space`."""
    usable = corpus_for(space, corpus)
    if not usable:
        raise LearnedPriorError(
            f"no measured space of the {family_of(space.workload).name} family other than "
            "this one to learn from"
        )
    return prior_from(
        space, fit_learned_model(usable, seed, generator_revision_of(space.workload).line)
    )


def prior_from(space: Any, learned: LearnedModel) -> PriorMean:
    """The learned model's prior mean over `space` (a space of its family)."""
    if family_of(space.workload).name != learned.family:
        raise LearnedPriorError(
            f"a cost model of the {learned.family} family cannot rank a space of the "
            f"{family_of(space.workload).name} family"
        )
    line = generator_revision_of(space.workload).line
    if learned.line is not None and line != learned.line:
        raise LearnedPriorError(
            f"a cost model fitted for {learned.line} cannot rank a space of {line}"
        )
    predicted = np.asarray(learned.model.predict(space), dtype=np.float64)
    if len(predicted) > 1 and np.ptp(predicted) == 0:
        # Trees fitted to too little (one shape's few trials) can predict one value
        # everywhere: a prior that ranks nothing, which replaced the analytical model's ranking.
        raise LearnedPriorError(
            f"a cost model of {measured_shapes(learned.shapes)} ranks no schedule of this "
            "space above another"
        )
    level = float(np.median(predicted_log_throughput(space))) + learned.level
    shapes, gpus = learned.shapes, learned.gpus
    stale = ""
    if learned.stale_rows:
        stale = (
            f" ({learned.stale_rows} measurements of an older generator revision left out"
            f"{f', {learned.stale_spaces} spaces whole' if learned.stale_spaces else ''})"
        )
    return PriorMean(
        values=predicted - np.median(predicted) + level,
        source="the analytical model's terms read by a cost model of "
        f"{measured_shapes(shapes)} on {', '.join(gpus)}{stale}",
    )


def shape_of(workload: Any) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A workload's shape: its kernel family and its sizes (every integer field: dimensions,
    batch, strides, padding), not the constants that leave the shape as it is (a layer
    norm's eps, the GELU's form, a GEMM's B layout, a reduction's kind, the element type)
    nor the operator of the family. Twins that differ only in those rank the schedules
    alike: the H100's LayerNorm_BERT_b1_s1024 (eps 1e-12) and LayerNorm_GPT2_b1_s1024 (eps
    1e-5), both layernorm 1024x768, have a Spearman correlation of 0.999 over their
    throughputs, so the one's measurements are the other's answer, not a prior."""
    fields = workload.canonical()
    sizes = sorted(
        (name, value)
        for name, value in fields.items()
        if isinstance(value, int) and not isinstance(value, bool)
    )
    return family_of(workload).name, tuple(sizes)


def unseen_shape_priors(
    datasets: Sequence[Any], corpus: Sequence[RecordedSpace]
) -> tuple[dict[str, PriorMean], dict[str, str]]:
    """Each of pipetune's datasets' (tuner.bench.Dataset) learned prior, with every record of
    its own shape (`shape_of`: its workload, and the workloads of its family with the same
    sizes that differ only in a constant) left out on every GPU: the shape is unseen, so a
    benchmark says what measurements of other shapes are worth (leaving out the workload
    alone kept LayerNorm_GPT2's records in LayerNorm_BERT's corpus). A dataset that gets
    none (nothing of its family to learn from, or a cost model that ranks nothing of its
    space) keeps the analytical model: it is left out of the priors, and the second mapping
    says why (for the caller to say beside the run)."""
    priors: dict[str, PriorMean] = {}
    why_not: dict[str, str] = {}
    for ds in datasets:
        if ds.ours is None:
            continue
        mine = shape_of(ds.ours.space.workload)
        unseen = [r for r in corpus if shape_of(r.space.workload) != mine]
        try:
            priors[ds.name] = learned_prior(ds.ours.space, unseen)
        except LearnedPriorError as exc:
            why_not[ds.name] = str(exc)
    return priors, why_not

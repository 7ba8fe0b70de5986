"""Transfer between GPUs: a recorded space of the same kernel on another GPU as a prior.

The other GPU's log throughput of each configuration becomes the prior mean of the search
(tuner/bo.py): the first batch is that GPU's best configurations, spread out, and the
measurements here correct it. Its failures teach the failure classifier. A prior that the
measurements contradict (the other GPU's optimum lies elsewhere) loses the search's
per-round model comparison and is dropped, once the measurements span enough of its range
to judge it (tuner/bo.py: its own best guesses alone cannot).

Configurations are matched by their knob values; the prior must name the same knobs. Rows
the prior has no record of get its worst successful value (an unknown configuration is not
assumed to be good: an exhaustive record lacks a row that could not run there). A prior
from a tuning task (the service's `prior_task`, `pipetune bench tuner --prior-trials`) is a
sample instead (`sampled`): a few dozen of thousands of configurations, the rest unmeasured.
`completed_by_model` fills rows with a model's guess, moved onto the recorded GPU's scale:
for pipetune's kernels the analytical model guesses every row the prior lacks (it knows this
GPU, whatever could not run on the other); on a foreign space only a sampled prior is
filled, by `fitted_to_record`, a Gaussian process fitted to the sample itself
(benchmarks/RESULTS.md, "a task's trials as the prior": better than the worst value on the
development set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipetune.model.errors import PipetuneError
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.surrogate import GaussianProcess

if TYPE_CHECKING:  # (tuner.recorded imports the session, which imports the strategies)
    from pipetune.tuner.recorded import RecordedConfigs


# The GP that guesses a sampled prior's unmeasured rows: its hyperparameters are estimated on
# at most HYPER_ROWS of the prior's successes (each of the estimate's few dozen likelihood
# evaluations is cubic in the rows: 512 rows took 12 s, 64 rows 0.1 s), then it is conditioned
# on at most MAX_FIT_ROWS of them (one factorisation) for its posterior mean.
HYPER_ROWS = 64
MAX_FIT_ROWS = 1024


class TransferError(PipetuneError, ValueError):
    """A prior that cannot inform this space (other knobs, nothing in common)."""


def recorded_prior(
    prior: RecordedConfigs,
    configs: Sequence[Mapping[str, Any]],
    knob_names: Sequence[str],
    sampled: bool = False,
) -> PriorMean:
    """The prior over `configs` (a space's rows, as knob -> value) from `prior`; `sampled`:
    `prior` is a sample of the space (a tuning task's trials), not an exhaustive record."""
    if set(prior.knob_names) != set(knob_names):
        raise TransferError(
            f"prior {prior.name}: its knobs {sorted(prior.knob_names)} are not this space's "
            f"{sorted(knob_names)} (a prior must be the same kernel)"
        )
    index = prior.row_of()
    names = prior.knob_names
    recorded = np.zeros(len(configs), dtype=bool)
    failed = np.zeros(len(configs), dtype=bool)
    values = np.full(len(configs), np.nan)
    for i, config in enumerate(configs):
        row = index.get(tuple(config[k] for k in names))
        if row is None:
            continue
        recorded[i] = True
        ms = prior.objective_ms[row]
        if np.isfinite(ms) and ms > 0:
            values[i] = -np.log(ms)
        else:
            failed[i] = True
    if not np.isfinite(values).any():
        raise TransferError(
            f"prior {prior.name}: no configuration of this space ran there "
            f"({int(recorded.sum())} in common)"
        )
    values[~np.isfinite(values)] = np.nanmin(values)
    return PriorMean(values, source=prior.name, recorded=recorded, failed=failed, sampled=sampled)


def completed_by_model(
    prior: PriorMean, model: np.ndarray, what: str = "the analytical model"
) -> PriorMean:
    """`prior` with its unrecorded rows filled by `model` (a predicted log throughput per
    row, this space's), shifted by the median difference between the recorded successes and
    the model's prediction for them.

    Only a shift, no slope: in log throughput another GPU (or a model's idea of its speed)
    differs mostly by a constant factor, and a slope fitted to a tuning task's few dozen
    trials, all near its optimum, would rest on a sliver of the model's range (the reason
    tuner/bo.py does not judge a prior on its own best guesses either). The median: one
    schedule that the model gets badly wrong must not move the others.
    """
    if prior.recorded is None or prior.recorded.all():
        return prior
    assert prior.failed is not None
    model = np.asarray(model, dtype=np.float64)
    if model.shape != prior.values.shape:
        raise TransferError(f"model: {model.shape[0]} rows, the prior has {len(prior.values)}")
    ok = prior.recorded & ~prior.failed
    shift = float(np.median(prior.values[ok] - model[ok])) if ok.any() else 0.0
    values = np.where(prior.recorded, prior.values, model + shift)
    return replace(prior, values=values, source=f"{prior.source} and {what}")


def fitted_to_record(prior: PriorMean, features: np.ndarray, seed: int) -> np.ndarray:
    """A guess of log throughput for every row from the prior's own successes, where no model
    of the kernel exists: the posterior mean of the search's Gaussian process fitted to them
    over the knob features. For a sampled prior (a task's trials) on a foreign space: its
    unmeasured rows are guessed from the measured ones near them, not assumed the worst."""
    assert prior.recorded is not None and prior.failed is not None
    ok = np.flatnonzero(prior.recorded & ~prior.failed)
    rng = np.random.default_rng(seed)
    if len(ok) > MAX_FIT_ROWS:
        ok = np.sort(rng.choice(ok, MAX_FIT_ROWS, replace=False))
    some = ok if len(ok) <= HYPER_ROWS else np.sort(rng.choice(ok, HYPER_ROWS, replace=False))
    gp = GaussianProcess(features.shape[1], seed)
    gp.fit(features[some], prior.values[some])
    if len(some) < len(ok):
        gp = gp.condition(features[ok], prior.values[ok])
    assert gp.posterior is not None
    return gp.posterior.mean(features)  # the spread over every row costs far more

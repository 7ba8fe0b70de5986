"""Transfer between GPUs: a recorded space of the same kernel on another GPU as a prior.

The other GPU's log throughput of each configuration becomes the prior mean of the search
(tuner/bo.py): the first batch is that GPU's best configurations, spread out, and the
measurements here correct it. Its failures teach the failure classifier. A prior that the
measurements contradict (the other GPU's optimum lies elsewhere) loses the search's
per-round model comparison and is dropped, once the measurements span enough of its range
to judge it (tuner/bo.py: its own best guesses alone cannot).

Configurations are matched by their knob values; the prior must name the same knobs. Rows
the prior has no record of get its worst successful value (an unknown configuration is not
assumed to be good).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipetune.tuner.bo import PriorMean
from pipetune.tuner.recorded import RecordedConfigs


class TransferError(ValueError):
    """A prior that cannot inform this space (other knobs, nothing in common)."""


def recorded_prior(
    prior: RecordedConfigs, configs: Sequence[Mapping[str, Any]], knob_names: Sequence[str]
) -> PriorMean:
    """The prior over `configs` (a space's rows, as knob -> value) from `prior`."""
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
    return PriorMean(values, source=prior.name, recorded=recorded, failed=failed)

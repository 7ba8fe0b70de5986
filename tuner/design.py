"""Space-covering initial design: a scrambled Sobol sequence over the knobs, each point
snapped to the nearest configuration of the space.

A random start can put several of its few trials in one corner; a low-discrepancy sequence
spreads them over every knob's range (as HEBO and BaCO start). The space is a constrained
subset of the knob grid, so each Sobol point takes the nearest configuration that exists and
is not taken yet (L1 distance over the scaled features; categorical knobs count a mismatch as
one), ties broken by a seeded permutation.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import qmc

from pipetune.tuner.encoding import KnobEncoding


def sobol_rows(encoding: KnobEncoding, n: int, seed: int) -> list[int]:
    """Up to n distinct rows covering the space (n is at most the space's size)."""
    n = min(n, len(encoding))
    if n == 0:
        return []
    features = encoding.features
    rng = np.random.default_rng(seed)
    tie_break = rng.permutation(len(encoding)) / len(encoding) * 1e-9
    m = max(1, int(np.ceil(np.log2(n))))
    points = qmc.Sobol(d=features.shape[1], scramble=True, seed=rng).random_base2(m)[:n]
    # A Sobol coordinate is a quantile of the column over the space's rows: the design is
    # spread like the space itself (a constrained space has few rows at some levels of a
    # knob, e.g. large tiles with large blocks), not like the full knob grid, whose corners
    # may hold few or only failing configurations. One-hot columns are mapped the same way
    # and then compared as numbers (a categorical mismatch counts as a distance of one).
    ordered = np.sort(features, axis=0)
    taken = np.zeros(len(encoding), dtype=bool)
    rows: list[int] = []
    for point in points:
        target = ordered[
            np.minimum((point * len(encoding)).astype(np.int64), len(encoding) - 1),
            np.arange(features.shape[1]),
        ]
        distance = np.abs(features - target).sum(axis=1) + tie_break
        distance[taken] = np.inf
        row = int(np.argmin(distance))
        taken[row] = True
        rows.append(row)
    return rows

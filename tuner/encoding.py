"""Knob encoding for model-based search: what a surrogate sees of a configuration.

A space's configurations are vectors of knob *value indices* (the annealer's codec). The
surrogate's features treat each knob as what it is:
- an ordered knob (numbers: block sizes, tile sizes, stage counts, flags 0/1) becomes its value
  index scaled to [0, 1], so its neighbours are its neighbours, and powers of two are evenly
  spaced as on a log scale;
- a categorical knob (strings, or values that cannot be ordered) becomes one-hot columns, so
  every pair of its values is equally far apart;
- a knob with one value in the space carries no information and is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.distance import cdist

from pipetune.tuner.sa import codec_for


def is_ordered(values: tuple | list) -> bool:
    """Numbers (and booleans, a 2-value order) are ordered; anything else is categorical."""
    return all(isinstance(v, int | float) for v in values)


@dataclass(frozen=True)
class KnobEncoding:
    value_index: np.ndarray  # (N, knobs) value index of each knob, for every configuration
    radices: np.ndarray  # values per knob
    ordered: np.ndarray  # bool per knob
    features: np.ndarray  # (N, F) surrogate features in [0, 1]
    # The same configurations, compact: the ordered columns of `features`, and each
    # categorical knob's value rank (its one-hot columns differ in two places or none).
    scaled: np.ndarray  # (N, ordered columns)
    categories: np.ndarray  # (N, categorical knobs) int

    @classmethod
    def of(cls, space: Any) -> KnobEncoding:
        codec = codec_for(space)
        value_index = codec.value_index
        ordered = np.asarray(
            getattr(space, "ordered_knobs", None) or [True] * value_index.shape[1], dtype=bool
        )
        n = len(value_index)
        # Each varying knob's ranks among the values present in the space (a knob value that
        # no valid configuration uses leaves no gap), and how many columns it takes.
        knobs: list[tuple[np.ndarray, int, bool]] = []
        for j in range(value_index.shape[1]):
            present = np.unique(value_index[:, j])
            if len(present) < 2:
                continue  # constant in this space
            rank = np.searchsorted(present, value_index[:, j])
            one_column = bool(ordered[j]) or len(present) == 2
            knobs.append((rank, len(present), one_column))
        # Filled in place: built as columns and stacked, the one-hot matrix was held twice
        # (1.6 GB for 200,000 configurations of a 500-valued categorical knob).
        width = sum(1 if one else levels for _, levels, one in knobs)
        features = np.zeros((n, max(width, 1)))
        scaled, categories, at = [], [], 0
        for rank, levels, one_column in knobs:
            if one_column:
                features[:, at] = rank / (levels - 1)
                scaled.append(at)
                at += 1
            else:
                features[np.arange(n), at + rank] = 1.0
                categories.append(rank)
                at += levels
        return cls(
            value_index,
            codec.radices,
            ordered,
            features,
            features[:, scaled] if width else np.zeros((n, 0)),
            np.column_stack(categories) if categories else np.zeros((n, 0), dtype=np.int64),
        )

    def l1_distances(self, rows: slice | np.ndarray, to: np.ndarray) -> np.ndarray:
        """(len(rows), len(to)) L1 distances between the `features` of configurations `rows`
        and `to`, from the compact columns: with one-hot columns the feature matrix is as
        wide as the knobs have values (500 for a 500-valued text knob), the compact one as
        there are knobs."""
        distances = cdist(self.scaled[rows], self.scaled[to], metric="cityblock")
        categories, other = self.categories[rows], self.categories[to]
        for j in range(categories.shape[1]):
            np.add(distances, 2.0, out=distances, where=categories[:, j, None] != other[None, :, j])
        return distances

    def __len__(self) -> int:
        return len(self.value_index)

    def knob_changes(self, row: int) -> np.ndarray:
        """How many knobs differ between `row` and every configuration (Hamming distance)."""
        return np.count_nonzero(self.value_index != self.value_index[row], axis=1)

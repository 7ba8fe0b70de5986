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

    @classmethod
    def of(cls, space: Any) -> KnobEncoding:
        codec = codec_for(space)
        value_index = codec.value_index
        ordered = np.asarray(
            getattr(space, "ordered_knobs", None) or [True] * value_index.shape[1], dtype=bool
        )
        columns: list[np.ndarray] = []
        for j in range(value_index.shape[1]):
            present = np.unique(value_index[:, j])
            if len(present) < 2:
                continue  # constant in this space
            # Positions among the values present in the space: a knob value that no valid
            # configuration uses leaves no gap.
            rank = np.searchsorted(present, value_index[:, j])
            if ordered[j] or len(present) == 2:
                columns.append((rank / (len(present) - 1))[:, None])
            else:
                columns.append((rank[:, None] == np.arange(len(present))[None, :]).astype(float))
        features = np.hstack(columns) if columns else np.zeros((len(value_index), 1))
        return cls(value_index, codec.radices, ordered, features)

    def __len__(self) -> int:
        return len(self.value_index)

    def knob_changes(self, row: int) -> np.ndarray:
        """How many knobs differ between `row` and every configuration (Hamming distance)."""
        return np.count_nonzero(self.value_index != self.value_index[row], axis=1)

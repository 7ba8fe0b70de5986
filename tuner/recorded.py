"""Recorded spaces of any kernel, for offline comparison of search strategies.

`RecordedConfigs` is the neutral form every strategy (ours and the peers) runs against: the
knobs and their values, one row per recorded configuration, and its objective in ms (inf for a
failed one). `ForeignSpace` lets pipetune's knob-only strategies (`random`, `grid`, `xgb`, `bo`)
search it: the knob values are the features and the annealer walks the same knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipetune.model.space import KNOB_NAMES, KNOBS
from pipetune.tuner.encoding import is_ordered
from pipetune.tuner.offline import RecordedSpace, throughput_of
from pipetune.tuner.sa import KnobCodec


@dataclass(frozen=True)
class RecordedConfigs:
    name: str
    tune_params: dict[str, list]  # knob -> its values, in order
    configs: list[dict[str, Any]]
    objective_ms: np.ndarray  # inf where the configuration failed

    @property
    def knob_names(self) -> list[str]:
        return list(self.tune_params)

    @property
    def throughput(self) -> np.ndarray:
        return throughput_of(self.objective_ms)

    @property
    def optimum(self) -> float:
        return float(self.throughput.max())

    def key(self, config: dict[str, Any]) -> tuple:
        return tuple(config[k] for k in self.knob_names)

    def row_of(self) -> dict[tuple, int]:
        return {self.key(c): i for i, c in enumerate(self.configs)}

    @classmethod
    def from_recorded_space(cls, name: str, recorded: RecordedSpace) -> RecordedConfigs:
        space = recorded.space
        present = {k: sorted(set(space.knobs[k].tolist())) for k in KNOB_NAMES}
        tune_params = {k: [v for v in KNOBS[k] if v in present[k]] for k in KNOB_NAMES}
        latency_ms = np.asarray(recorded.latency_s, dtype=np.float64) * 1e3
        latency_ms[~np.isfinite(latency_ms) | (latency_ms <= 0)] = np.inf
        return cls(name, tune_params, [s.as_dict() for s in space], latency_ms)


class ForeignSpace:
    """A RecordedConfigs seen as a search space (len, features, codec, cache_key, work)."""

    def __init__(self, recorded: RecordedConfigs):
        self.recorded = recorded
        names = recorded.knob_names
        values = [tuple(recorded.tune_params[k]) for k in names]
        # Value indices are the features: they order numeric knobs and also serve for
        # non-numeric ones (booleans, strings).
        index = np.array(
            [[values[j].index(c[k]) for j, k in enumerate(names)] for c in recorded.configs],
            dtype=np.int64,
        )
        self._index = index
        self.codec = KnobCodec([tuple(range(len(v))) for v in values], index)
        # Numbers are ordered knobs; strings (and mixed values) are categorical.
        self.ordered_knobs = tuple(is_ordered(v) for v in values)
        self.cache_key = ("foreign", recorded.name, len(recorded.configs))
        self.feature_names = tuple(names)
        self.work = 1.0

    def __len__(self) -> int:
        return len(self.recorded.configs)

    def features(self) -> np.ndarray:
        return self._index.astype(np.float64)

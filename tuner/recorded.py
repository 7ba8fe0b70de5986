"""Recorded spaces of any kernel, for offline comparison of search strategies.

`RecordedConfigs` is the neutral form every strategy (ours and the peers) runs against: the
knobs and their values, one row per recorded configuration, and its objective in ms (inf for a
failed one). `ForeignSpace` lets pipetune's knob-only strategies (`random`, `grid`, `xgb`, `bo`)
search it: the knob values are the features and the annealer walks the same knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from pipetune.model.family import family_of
from pipetune.tuner.encoding import is_ordered
from pipetune.tuner.offline import RecordedSpace, throughput_of
from pipetune.tuner.sa import KnobCodec


@dataclass(frozen=True)
class RecordedConfigs:
    name: str
    tune_params: dict[str, list]  # knob -> its values, in order
    configs: list[dict[str, Any]]
    objective_ms: np.ndarray  # inf where the configuration failed
    # Per knob, whether its values are ordered, where a declaration says so (a kernel
    # family's categorical int knobs); otherwise read from the values (ForeignSpace).
    ordered: dict[str, bool] | None = None

    @property
    def knob_names(self) -> list[str]:
        return list(self.tune_params)

    @property
    def throughput(self) -> np.ndarray:
        return throughput_of(self.objective_ms)

    @property
    def optimum(self) -> float:
        return float(self.throughput.max())

    @cached_property
    def search_space(self) -> ForeignSpace:
        """These configurations as a search space, built once: every strategy and seed of a
        benchmark searches the same one (a million configurations took 2 s a build), and
        a strategy only reads it."""
        return ForeignSpace(self)

    def key(self, config: dict[str, Any]) -> tuple:
        return tuple(config[k] for k in self.knob_names)

    def row_of(self) -> dict[tuple, int]:
        return {self.key(c): i for i, c in enumerate(self.configs)}

    @classmethod
    def from_recorded_space(cls, name: str, recorded: RecordedSpace) -> RecordedConfigs:
        space = recorded.space
        knobs = family_of(space.workload).knobs
        present = {k.name: set(space.knobs[k.name].tolist()) for k in knobs}
        tune_params = {k.name: [v for v in k.values if v in present[k.name]] for k in knobs}
        latency_ms = np.asarray(recorded.latency_s, dtype=np.float64) * 1e3
        latency_ms[~np.isfinite(latency_ms) | (latency_ms <= 0)] = np.inf
        ordered = {k.name: k.ordered for k in knobs}
        return cls(name, tune_params, [s.as_dict() for s in space], latency_ms, ordered)


class ForeignSpace:
    """A RecordedConfigs seen as a search space (len, features, codec, cache_key, work)."""

    def __init__(self, recorded: RecordedConfigs):
        self.recorded = recorded
        names = recorded.knob_names
        # Numbers are ordered knobs; strings (and mixed values) are categorical; a family's
        # declaration says which of its int knobs are categories.
        declared = recorded.ordered or {}
        self.ordered_knobs = tuple(
            declared.get(k, is_ordered(recorded.tune_params[k])) for k in names
        )
        # Value indices are the features: they order numeric knobs and also serve for
        # non-numeric ones (booleans, strings). An ordered knob's values are taken in numeric
        # order, not as listed: a Kernel Tuner cache may list them in any order ([128, 16,
        # 64]), and as listed the search saw neighbours that are not (and scored the same
        # measurements otherwise than with the values sorted, as a T4 file has them).
        listed = [recorded.tune_params[k] for k in names]
        values = [
            tuple(sorted(v) if ordered and is_ordered(v) else v)
            for v, ordered in zip(listed, self.ordered_knobs, strict=True)
        ]
        self.codec = KnobCodec(
            [tuple(range(len(v))) for v in values], _value_indices(recorded, values)
        )
        self.cache_key = ("foreign", recorded.name, len(recorded.configs))
        self.feature_names = tuple(names)
        self.work = 1.0

    def __len__(self) -> int:
        return len(self.recorded.configs)

    def features(self) -> np.ndarray:
        return self.codec.value_index.astype(np.float64)


def _value_indices(recorded: RecordedConfigs, values: list[tuple[Any, ...]]) -> np.ndarray:
    """(configurations, knobs): the index of each configuration's value of each knob among
    `values` (its first equal one, as `tuple.index` finds it). Looked up in a table per
    knob, one column at a time: `tuple.index` per cell, in a Python loop, scanned a knob's
    values (4.3 s of one core for a million configurations of 17 knobs; 2.9 s now)."""
    index = np.empty((len(values), len(recorded.configs)), dtype=np.int64)  # a knob a row
    for j, knob in enumerate(recorded.knob_names):
        position: dict[Any, int] = {}
        for i, value in enumerate(values[j]):
            position.setdefault(value, i)
        # (map over C callables: no Python frame per configuration)
        column = map(position.__getitem__, map(itemgetter(knob), recorded.configs))
        index[j] = np.fromiter(column, dtype=np.int64, count=len(recorded.configs))
    return index.T

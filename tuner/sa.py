"""Simulated annealing over a schedule space, in the AutoTVM manner.

Many parallel chains walk the space; a neighbour changes one knob to another of its values
(moves that leave the valid space are rejected); a move is accepted with probability
exp((score_new - score_old) / T) while T cools linearly to zero. Chains persist across
rounds (the next round starts where the last one stopped), visited schedules never enter
the top-k heap, and a round stops early once the heap has not improved for a while.

All chains step together with numpy; scores come from a per-space array (the cost model
predicts the whole space once per round, which is cheap for spaces of thousands).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipetune.model.family import FamilySpace, family_of

# A code table over the whole knob grid (the product of the value counts) up to this size:
# one array look-up per move. Past it (a foreign space of many knobs with many values, whose
# grid is mostly outside the space) codes are found in the space's own sorted codes.
DENSE_CODES = 1 << 20


class KnobCodec:
    """Maps configurations to mixed-radix codes over knob value indices, and codes to rows.

    Works for any space given as one column of values per knob, so the same annealer walks
    pipetune's schedule spaces and foreign recorded spaces (e.g. a Kernel Tuner cache).
    """

    def __init__(self, values: list[tuple], matrix: np.ndarray):
        self.radices = np.array([len(v) for v in values], dtype=np.int64)
        # value index of each knob for each row: shape (N, n_knobs)
        self.value_index = np.column_stack(
            [np.searchsorted(np.array(v), matrix[:, j]) for j, v in enumerate(values)]
        ).astype(np.int64, copy=False)
        grid = math.prod(len(v) for v in values)  # (Python's ints: no overflow)
        rows = np.arange(len(matrix), dtype=np.int64)
        self._row_of_code: np.ndarray | None = None
        self._sorted_codes: np.ndarray | None = None
        self._groups: list[list[int]] | None = None  # knobs per code, past int64
        if grid < 1 << 62:  # codes fit in int64
            self._strides = np.array(
                [math.prod(len(v) for v in values[j + 1 :]) for j in range(len(values))],
                dtype=np.int64,
            )
            codes = self.value_index @ self._strides
            if grid <= DENSE_CODES:
                self._row_of_code = np.full(grid, -1, dtype=np.int64)
                self._row_of_code[codes] = rows
            else:
                order = np.argsort(codes, kind="stable")
                self._sorted_codes, self._sorted_rows = codes[order], rows[order]
        else:
            # A grid past int64 (a foreign space of many knobs): one code per group of knobs
            # whose values fit in int64, the rows sorted by their codes. A dict of each row's
            # tuple of value indices held a million configurations of 32 knobs in 1.2 GB.
            self._groups = _code_groups([len(v) for v in values])
            codes = self._group_codes(self.value_index)
            order = np.lexsort(codes.T[::-1])  # by the first group's code, then the next...
            self._sorted_codes, self._sorted_rows = self._as_keys(codes[order]), rows[order]

    @classmethod
    def for_space(cls, space: FamilySpace) -> KnobCodec:
        """The codec of a kernel family's space: its knobs and their declared values."""
        knobs = family_of(space.workload).knobs
        matrix = np.column_stack([space.knobs[k.name] for k in knobs])
        return cls([k.values for k in knobs], matrix)

    def __len__(self) -> int:
        return len(self.value_index)

    def rows(self, value_index: np.ndarray) -> np.ndarray:
        """Row of each value-index vector, -1 where it is not a member of the space."""
        if self._row_of_code is not None:
            return self._row_of_code[value_index @ self._strides]
        assert self._sorted_codes is not None
        if self._groups is None:
            codes = value_index @ self._strides
        else:
            flat = value_index.reshape(-1, value_index.shape[-1])
            codes = self._as_keys(self._group_codes(flat)).reshape(value_index.shape[:-1])
        at = np.minimum(np.searchsorted(self._sorted_codes, codes), len(self) - 1)
        found = self._sorted_codes[at] == codes
        return np.where(found, self._sorted_rows[at], -1)

    def _group_codes(self, value_index: np.ndarray) -> np.ndarray:
        """(rows, groups) int64: each group's mixed-radix code of the rows' value indices."""
        assert self._groups is not None
        codes = np.zeros((len(value_index), len(self._groups)), dtype=np.int64)
        for g, knobs in enumerate(self._groups):
            for j in knobs:
                codes[:, g] = codes[:, g] * self.radices[j] + value_index[:, j]
        return codes

    def _as_keys(self, codes: np.ndarray) -> np.ndarray:
        """The rows of a (rows, groups) code matrix as one record each, compared group by
        group (numpy orders records field by field), for searchsorted."""
        record = np.dtype([(f"g{g}", np.int64) for g in range(codes.shape[1])])
        return np.ascontiguousarray(codes).view(record)[:, 0]


def _code_groups(radices: list[int]) -> list[list[int]]:
    """The knobs, in order, cut into runs whose grids (the product of their value counts)
    fit in int64."""
    groups: list[list[int]] = [[]]
    grid = 1
    for j, radix in enumerate(radices):
        if groups[-1] and grid * radix >= 1 << 62:
            groups.append([])
            grid = 1
        groups[-1].append(j)
        grid *= radix
    return groups


def codec_for(space: Any) -> KnobCodec:
    """The codec of a space: foreign spaces carry their own, schedule spaces get one built."""
    codec = getattr(space, "codec", None)
    return codec if isinstance(codec, KnobCodec) else KnobCodec.for_space(space)


@dataclass
class SimulatedAnnealing:
    codec: KnobCodec
    n_chains: int = 64
    n_iter: int = 200
    early_stop: int = 40
    temperature: tuple[float, float] = (1.0, 0.0)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    _chains: np.ndarray | None = None  # rows where each chain stands

    def _neighbours(self, rows: np.ndarray) -> np.ndarray:
        """One random single-knob move per chain; an invalid move keeps the chain in place."""
        codec = self.codec
        vi = codec.value_index[rows].copy()
        knob = self.rng.integers(0, len(codec.radices), size=len(rows))
        radix = codec.radices[knob]
        # a different value of that knob: shift by 1..radix-1
        shift = 1 + (self.rng.random(len(rows)) * (radix - 1)).astype(np.int64)
        vi[np.arange(len(rows)), knob] = (vi[np.arange(len(rows)), knob] + shift) % radix
        moved = codec.rows(vi)
        return np.where(moved >= 0, moved, rows)

    def find_maximums(
        self,
        scores: np.ndarray,
        k: int,
        exclude: set[int],
        tiebreak: np.ndarray | None = None,
    ) -> list[int]:
        """Up to k unvisited rows with the highest scores found by the chains, best first.
        Equal scores are ordered by `tiebreak` (one random number per row; drawn here when
        not given), not by row: a tree model's predictions are full of exact ties, and with
        the lowest row first a model that had learnt nothing (all trials tied, or failed)
        walked the space from its first row like a grid search."""
        n = len(self.codec)
        if tiebreak is None:
            tiebreak = self.rng.random(n)
        if self._chains is None:
            self._chains = self.rng.integers(0, n, size=min(self.n_chains, n))
        chains = self._chains
        # A min-heap of (score, tiebreak, row) over unvisited rows.
        heap: list[tuple[float, float, int]] = []
        in_heap: set[int] = set()

        def offer(rows: np.ndarray) -> bool:
            improved = False
            for r in np.unique(rows).tolist():
                if r in exclude or r in in_heap:
                    continue
                entry = (float(scores[r]), float(tiebreak[r]), r)
                if len(heap) < k:
                    heapq.heappush(heap, entry)
                    in_heap.add(r)
                    improved = True
                elif entry > heap[0]:
                    dropped = heapq.heapreplace(heap, entry)[2]
                    in_heap.discard(dropped)
                    in_heap.add(r)
                    improved = True
            return improved

        offer(chains)
        t_start, t_end = self.temperature
        since_improved = 0
        for step in range(self.n_iter):
            temp = t_start + (t_end - t_start) * step / max(1, self.n_iter - 1)
            candidates = self._neighbours(chains)
            gain = scores[candidates] - scores[chains]
            with np.errstate(over="ignore"):
                accept_p = np.exp(np.minimum(0.0, gain) / max(temp, 1e-9))
            accept = (gain >= 0) | (self.rng.random(len(chains)) < accept_p)
            chains = np.where(accept, candidates, chains)
            since_improved = 0 if offer(chains) else since_improved + 1
            if since_improved >= self.early_stop and len(heap) >= k:
                break
        self._chains = chains
        return [r for _, _, r in sorted(heap, reverse=True)]

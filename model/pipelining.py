"""Schedule classes by pipelining depth, as ALCOP's ablation compares them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipetune.model.space import Space


def non_pipelined(space: Space) -> np.ndarray:
    """One shared-memory stage, one register stage: load, wait, compute."""
    return (space.knobs["smem_stages"] == 1) & (space.knobs["reg_stages"] == 1)


def double_buffer_only(space: Space) -> np.ndarray:
    return (space.knobs["smem_stages"] == 2) & (space.knobs["reg_stages"] == 1)


def pipelined(space: Space) -> np.ndarray:
    """Multi-stage (>= 3 shared-memory stages) or multi-level (register double buffering)."""
    return (space.knobs["smem_stages"] >= 3) | (space.knobs["reg_stages"] == 2)


@dataclass(frozen=True)
class PipeliningGain:
    best_s: float
    best_pipelined_s: float
    best_non_pipelined_s: float
    best_double_buffer_s: float

    @property
    def speedup_over_non_pipelined(self) -> float:
        return self.best_non_pipelined_s / self.best_pipelined_s

    @property
    def speedup_over_double_buffer(self) -> float:
        return self.best_double_buffer_s / self.best_pipelined_s


def _best(latency: np.ndarray, mask: np.ndarray) -> float:
    return float(latency[mask].min()) if mask.any() else float("nan")


def pipelining_gain(space: Space, latency: np.ndarray) -> PipeliningGain:
    """Best latency per class, for any per-schedule latency (predicted or measured)."""
    latency = np.asarray(latency, dtype=np.float64)
    return PipeliningGain(
        best_s=float(latency.min()),
        best_pipelined_s=_best(latency, pipelined(space)),
        best_non_pipelined_s=_best(latency, non_pipelined(space)),
        best_double_buffer_s=_best(latency, double_buffer_only(space)),
    )

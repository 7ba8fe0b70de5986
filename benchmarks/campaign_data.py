"""A GPU campaign's unpacked data (benchmarks/data/<gpu>/), read for analysis: each operator's
exhaustive dataset aligned with the analytical model's predictions for the same schedules,
under the spec-sheet profile and under the calibrated one, and the campaign's vendor
baselines, probe and correctness documents.

Everything here is measured data as the campaign wrote it; the only computation is the
model's, evaluated on exactly the schedules that were measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipetune.model.family import KernelFamily, family_of
from pipetune.model.hardware import GPUSpec, get_gpu

if TYPE_CHECKING:
    from collections.abc import Callable

# The committed campaigns: benchmarks/data/<gpu>/ (the CLIs take --data-dir).
DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class OperatorData:
    """One operator's exhaustive measurements, aligned row by row with its space."""

    name: str
    family: KernelFamily
    workload: Any
    space: Any  # the measured schedules as a family space (calibrated GPU spec)
    measured_us: np.ndarray  # inf where the trial failed
    library: dict[str, Any] | None  # the vendor baseline's entry of baselines.json

    @property
    def ok(self) -> np.ndarray:
        return np.isfinite(self.measured_us)

    @property
    def work(self) -> float:
        return float(self.space.work)

    def throughput(self, latency_us: float) -> float:
        """In the family's unit (TFLOP/s for GEMMs, GB/s of compulsory traffic)."""
        return self.family.rate(self.work, latency_us)

    @cached_property
    def prediction(self) -> Any:
        """The family's model over the space with the calibrated profile
        (model/profiles/<gpu>.json): its latencies and, for the tensor-core GEMMs, its terms."""
        return self.family.evaluate(self.space)

    @cached_property
    def predicted_us(self) -> np.ndarray:
        """The model's latency of every schedule with the calibrated profile."""
        return np.asarray(self.prediction.latency_us, dtype=np.float64)

    @cached_property
    def predicted_spec_us(self) -> np.ndarray:
        """The model with the spec-sheet constants only (what the sweeps ran with)."""
        gpu = get_gpu(self.space.gpu.key, calibrated=False)
        space = self.family.space_of(self.workload, gpu, self.space.knobs)
        return np.asarray(self.family.evaluate(space).latency_us, dtype=np.float64)

    @cached_property
    def best(self) -> tuple[float, int] | None:
        """(latency µs, row) of the fastest measured schedule."""
        return self.best_in(np.ones(len(self.measured_us), dtype=bool))

    def best_in(self, mask: np.ndarray) -> tuple[float, int] | None:
        """(latency µs, row) of the fastest measured schedule among ``mask``."""
        rows = np.flatnonzero(mask & self.ok)
        if rows.size == 0:
            return None
        row = int(rows[np.argmin(self.measured_us[rows])])
        return float(self.measured_us[row]), row


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def campaign_gpu(key: str) -> GPUSpec:
    """The GPU's spec with the profile shipped with pipetune (model/profiles/<key>.json: the
    committed campaign's calibration), never a user's own: get_gpu applies the user's
    profile folder first, whose profile (calibrate, a default unpack) measured another
    device than the committed data's."""
    return get_gpu(key, user_profile=False)


def committed_gpu_of(path: Path) -> Callable[[str], GPUSpec] | None:
    """The GPU spec to evaluate a dataset file with: campaign_gpu for a file of the
    committed campaigns (under DATA_DIR: measured on the shipped profile's device), None
    (get_gpu's, the user's own profile first) for any other, which the user measured or
    chose, as `pipetune bench tuner` reads it."""
    return campaign_gpu if path.resolve().is_relative_to(DATA_DIR) else None


def load_operator(path: Path, baselines: dict[str, Any]) -> OperatorData:
    """A dataset file with its family's space (the rows the current valid space knows),
    under the campaign's calibrated GPU spec (campaign_gpu)."""
    from pipetune.clients.cli.bench_cmds import recorded_dataset

    name = path.name.split(".")[0]
    recorded = recorded_dataset(path, gpu_of=campaign_gpu).ours
    if recorded is None:
        raise ValueError(f"{path}: not a pipetune dataset")
    space = recorded.space
    latency_us = np.asarray(recorded.latency_s, dtype=np.float64) * 1e6
    latency_us[~np.isfinite(latency_us) | (latency_us <= 0)] = np.inf
    return OperatorData(
        name=name,
        family=family_of(space.workload),
        workload=space.workload,
        space=space,
        measured_us=latency_us,
        library=baselines.get("operators", {}).get(name),
    )


@dataclass(frozen=True)
class Campaign:
    """What `pipetune campaign unpack` left for one GPU."""

    gpu: str
    folder: Path

    @cached_property
    def probe(self) -> dict[str, Any]:
        return read_json(self.folder / "campaign" / "probe.json")

    @cached_property
    def correctness(self) -> dict[str, Any]:
        return read_json(self.folder / "campaign" / "correctness.json")

    @cached_property
    def baselines(self) -> dict[str, Any]:
        return read_json(self.folder / "campaign" / "baselines.json")

    @cached_property
    def summary(self) -> dict[str, Any]:
        """campaign.json: its state (complete, or paused with operators left) and operators."""
        return read_json(self.folder / "campaign" / "campaign.json")

    def dataset_paths(self) -> list[Path]:
        return sorted(self.folder.glob("*.t4.json.gz"))

    def sweep_dates(self) -> dict[str, list[str]]:
        """The UTC date each operator's sweep began (its first record's timestamp) ->
        the operators swept that day: a later call may sweep some operators again (a
        changed kernel), and their figures are then not of the first call's day."""
        from pipetune.workers.datasets import load_dataset

        dates: dict[str, list[str]] = {}
        for path in self.dataset_paths():
            stamps = [r.timestamp for r in load_dataset(path).records if r.timestamp]
            day = min(stamps)[:10] if stamps else "undated"
            dates.setdefault(day, []).append(path.name.split(".")[0])
        return dict(sorted(dates.items()))

    def operators(self, order: list[str] | None = None) -> list[OperatorData]:
        """Every swept operator, in ``order`` (names) where given, the rest after it."""
        paths = {p.name.split(".")[0]: p for p in self.dataset_paths()}
        names = [n for n in (order or []) if n in paths]
        names += sorted(set(paths) - set(names))
        return [load_operator(paths[n], self.baselines) for n in names]


def campaign(gpu: str, data_dir: Path) -> Campaign:
    folder = data_dir / gpu
    if not (folder / "campaign" / "campaign.json").exists():
        raise SystemExit(f"error: no unpacked campaign in {folder} (pipetune campaign unpack)")
    return Campaign(gpu, folder)

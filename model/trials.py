"""What a measurement of one schedule returns: the contract between runners, workers, the
service and the tuner (all of them import it from here)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

TrialStatus = Literal[
    "ok",
    "compile_error",
    "launch_error",
    "runtime_error",
    "wrong_result",
    "timeout",
]
FAILED_STATUSES: frozenset[str] = frozenset(get_args(TrialStatus)) - {"ok"}


class RunnerKind(StrEnum):
    """What answers a trial: the runners' names (workers/runners implement one each).

    Declared here, with the result they return, because the wire schema (model/) must
    derive its enums from it and model/ imports nothing from workers/. A result's `runner`
    string may carry a suffix after a colon (a replayed result says `replay:<recorded
    runner>`); :meth:`of` reads the kind.
    """

    CUPY = "cupy"  # a real GPU, timed with CUDA events
    REPLAY = "replay"  # answers from a recorded dataset
    SIMULATED = "simulated"  # the analytical model plus stated noise: demos and CI only

    @classmethod
    def of(cls, runner: str | None) -> RunnerKind | None:
        """The kind of a result's or a worker's runner string (None if unknown)."""
        if not runner:
            return None
        try:
            return cls(runner.split(":", 1)[0])
        except ValueError:
            return None

    @property
    def adjective(self) -> str:
        """How its latencies are labelled wherever they are shown: measured, simulated or
        replayed."""
        return _ADJECTIVES[self]


def is_simulated(runner: str | None) -> bool:
    """Whether a result's runner string says its latency is the analytical model's: the
    simulated runner, or a replay of a simulated sweep ("replay:simulated")."""
    return RunnerKind.SIMULATED.value in (runner or "").split(":")


_ADJECTIVES = {
    RunnerKind.CUPY: "measured",
    RunnerKind.REPLAY: "replayed",
    RunnerKind.SIMULATED: "simulated",
}


class MeasureResult(BaseModel):
    """One schedule's measurement. latency_us is the median of the timed repeats."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: TrialStatus
    latency_us: float | None = Field(default=None, gt=0)
    samples_us: list[float] = Field(default_factory=list)
    # Spread of the repeats: (p90 - p10) / median; None when it was not recorded.
    spread: float | None = Field(default=None, ge=0)
    registers: int | None = Field(default=None, ge=0)
    spill_bytes: int | None = Field(default=None, ge=0)
    smem_bytes: int | None = Field(default=None, ge=0)
    compile_ms: float | None = Field(default=None, ge=0)
    max_abs_error: float | None = Field(default=None, ge=0)
    error: str | None = None
    runner: str | None = None

    @field_validator("error", "runner")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # Free text from compilers and drivers: keep the result, drop NUL bytes (no database
        # text column can hold them), rather than refuse a measurement over its log text.
        return None if value is None else value.replace("\x00", "\ufffd")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

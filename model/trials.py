"""What a measurement of one schedule returns: the contract between runners, workers, the
service and the tuner (all of them import it from here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TrialStatus = Literal[
    "ok",
    "compile_error",
    "launch_error",
    "runtime_error",
    "wrong_result",
    "timeout",
]
FAILED_STATUSES: frozenset[str] = frozenset(
    {"compile_error", "launch_error", "runtime_error", "wrong_result", "timeout"}
)


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"

"""What a measurement of one schedule returns: the contract between runners, workers, the
service and the tuner (all of them import it from here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    @field_validator("error", "runner")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # Free text from compilers and drivers: keep the result, drop NUL bytes (no database
        # text column can hold them), rather than refuse a measurement over its log text.
        return None if value is None else value.replace("\x00", "\ufffd")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

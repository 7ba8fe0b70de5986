"""Faults rehearsed on a CPU: a simulated trial whose measuring child crashes or hangs.

On a GPU, a kernel that reads an illegal address can take its process down, and a kernel
that never finishes leaves the process waiting forever. The cupy runner survives both by
measuring in an isolated child (workers.runners.isolation). To test that path with no GPU,
the simulated runner can be given a :class:`FaultPlan`: it then runs every trial through
the same kind of child, and the schedules the plan picks make that child die of SIGSEGV
(``crash``) or sleep past the trial timeout (``hang``). The failed trials are recorded
through the same mapping as the cupy runner's (workers.runners.outcomes).

    pipetune worker --runner simulated --gpu h100 --simulate-faults crash=0.2,hang=0.1

Which schedules fault is decided by a hash of (seed, workload, schedule): deterministic, so
a test can tell in advance which trials must fail.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import time
from dataclasses import dataclass
from typing import Literal

from pipetune.model.trials import RunnerKind

# `pipetune worker --simulate-faults`'s environment variable: `serve --local-workers` checks
# it too, before it starts workers that inherit it.
FAULTS_ENV = "PIPETUNE_SIMULATED_FAULTS"

FaultKind = Literal["crash", "hang"]
HANG_S = 3600.0  # "forever": far past any trial timeout


@dataclass(frozen=True)
class FaultPlan:
    """The fraction of trials whose child crashes, and of those whose child hangs."""

    crash: float = 0.0
    hang: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("crash", "hang"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: a fraction within 0..1, got {value!r}")
        if self.crash + self.hang > 1.0:
            raise ValueError(f"crash + hang must be at most 1, got {self.crash + self.hang:g}")

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``crash=0.2,hang=0.1[,seed=3]`` (every part optional)."""
        values: dict[str, float | int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or key not in ("crash", "hang", "seed") or key in values:
                raise ValueError(
                    f"expected crash=FRACTION,hang=FRACTION[,seed=INT], got {part!r} in {text!r}"
                )
            try:
                values[key] = int(raw) if key == "seed" else float(raw)
            except ValueError:
                raise ValueError(f"{key}: not a number: {raw.strip()!r}") from None
        return cls(**values)  # type: ignore[arg-type]

    def describe(self) -> str:
        return f"crash={self.crash:g},hang={self.hang:g},seed={self.seed}"

    def fault_of(self, workload_hash: str, schedule_id: str) -> FaultKind | None:
        digest = hashlib.sha256(f"{self.seed}:{workload_hash}:{schedule_id}".encode()).digest()
        u = int.from_bytes(digest[:8], "little") / 2**64
        if u < self.crash:
            return "crash"
        if u < self.crash + self.hang:
            return "hang"
        return None


def fault_plan_problem(runner: str, text: str) -> str | None:
    """Why a worker of this runner refuses the fault plan `text` (None: it takes it); one
    rule for the worker's option and `serve --local-workers`' check of the environment."""
    if runner != RunnerKind.SIMULATED:
        return "only a simulated worker rehearses faults"
    try:
        FaultPlan.parse(text)
    except ValueError as exc:
        return str(exc)
    return None


def run_simulated_trial(fault: FaultKind | None, samples_us: list[float]) -> list[float]:
    """In the measuring child: answer the simulated samples, or die, or never answer."""
    if fault == "crash":
        # No core file (they would litter the working directory), then a real SIGSEGV.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(HANG_S)
    return samples_us

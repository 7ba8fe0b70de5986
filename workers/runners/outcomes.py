"""The failed trial a measuring child's crash, hang or exception stands for.

One mapping for every runner that measures in an isolated child (the cupy runner on a GPU,
and the simulated runner when it injects faults), so that a fault rehearsed on a CPU is
recorded exactly as the same fault on a GPU would be.
"""

from __future__ import annotations

from typing import Any

from pipetune.model.trials import MeasureResult
from pipetune.workers.runners.isolation import CallOutcome

MAX_ERROR_CHARS = 2000


def clip(text: str) -> str:
    """Error text cut to what a trial record keeps."""
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def failed_call(outcome: CallOutcome, **common: Any) -> MeasureResult | None:
    """The failed trial of a call that did not answer (None when it answered):

    - timeout: no answer in time, the child was killed -> ``timeout``;
    - crashed: the child died (a segfault, an abort, the OOM killer) -> ``runtime_error``;
    - error: the measuring function raised -> ``runtime_error``.
    """
    if outcome.kind == "timeout":
        return MeasureResult(status="timeout", error=outcome.error, **common)
    if outcome.kind == "crashed":
        return MeasureResult(status="runtime_error", error=outcome.error, **common)
    if outcome.kind == "error":
        error = f"the measuring process raised {outcome.error}"
        return MeasureResult(status="runtime_error", error=clip(error), **common)
    return None

"""How results are labelled where they are shown: a latency from the simulated runner (the
analytical model plus noise, for demos and CI) is never shown as a measurement."""

from __future__ import annotations

from collections.abc import Iterable

from pipetune.model.trials import is_simulated

__all__ = ["SIMULATED_LABEL", "any_simulated", "is_simulated"]

SIMULATED_LABEL = "simulated: analytical model + noise, not measurements"


def any_simulated(runners: Iterable[str | None]) -> bool:
    return any(is_simulated(r) for r in runners)

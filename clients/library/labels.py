"""How results are labelled where they are shown: a latency from the simulated runner (the
analytical model plus noise, for demos and CI) is never shown as a measurement."""

from __future__ import annotations

from collections.abc import Iterable

SIMULATED_LABEL = "simulated: analytical model + noise, not measurements"


def is_simulated(runner: str | None) -> bool:
    """Whether a result's runner string says its latency is the model's: the simulated
    runner, or a replay of a simulated sweep ("replay:simulated")."""
    return "simulated" in (runner or "")


def any_simulated(runners: Iterable[str | None]) -> bool:
    return any(is_simulated(r) for r in runners)

"""How results are labelled where they are shown: a latency from the simulated runner (the
analytical model plus noise, for demos and CI) is never shown as a measurement, and a task's
trials are counted against what it runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipetune.model.family import generator_revision_of
from pipetune.model.trials import is_simulated
from pipetune.model.wire import TaskDoc

__all__ = [
    "SIMULATED_LABEL",
    "any_simulated",
    "is_simulated",
    "older_kernel_label",
    "runs_whole_space",
    "trials_of",
    "trials_to_run",
]

SIMULATED_LABEL = "simulated: analytical model + noise, not measurements"


def any_simulated(runners: Iterable[str | None]) -> bool:
    return any(is_simulated(r) for r in runners)


def older_kernel_label(workload: Any, measured_revision: int | None) -> str | None:
    """Where a measured latency is an older kernel's (its trial's generator revision is not
    the one this code makes, model.family.GeneratorRevision): the words shown beside it.
    None where the time is this kernel's, or no kernel was timed."""
    if measured_revision is None:
        return None
    now = generator_revision_of(workload)
    if measured_revision == now.revision:
        return None
    return (
        f"measured on revision {measured_revision} of the {now.line} kernel generator; this "
        f"kernel is its revision {now.revision}, whose times differ"
    )


def runs_whole_space(doc: TaskDoc) -> bool:
    """Whether the task's space is smaller than its budget: it runs every schedule."""
    return doc.trials_target is not None and doc.trials_target < doc.budget


def trials_to_run(doc: TaskDoc) -> int:
    """How many trials the task runs: its budget, or its whole space where that is smaller
    (a progress bar out of the budget stood at 2/50 for a space of two schedules)."""
    return doc.budget if doc.trials_target is None else min(doc.trials_target, doc.budget)


def trials_of(doc: TaskDoc) -> str:
    """Trials done of those the task runs: "4/10", or "4/4 (its whole space; budget 10)"
    where the space is smaller than the budget (it read "4/10 ..., done")."""
    if not runs_whole_space(doc):
        return f"{doc.trials_done}/{doc.budget}"
    return f"{doc.trials_done}/{doc.trials_target} (its whole space; budget {doc.budget})"

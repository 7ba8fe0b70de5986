"""Why followed tasks do not move: the service's `no_worker` of each unfinished task, said
where a command waits on them.

With a progress bar, the bar's line carries the reason. Without one (`--json`, whose stdout is
one document for a script), a command that waited on a task no worker can serve printed
nothing at all until it was killed: `tune --wait --json` and `tune-model` alike. There the
reason is said on stderr, once for each reason as it appears, with the tasks it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from pipetune.model.wire import TaskDoc


def waiting_reasons(docs: Sequence[TaskDoc]) -> dict[str, list[int]]:
    """Each reason the unfinished tasks give for waiting, with the ids of the tasks that give
    it (a finished task waits for nothing)."""
    reasons: dict[str, list[int]] = {}
    for doc in docs:
        if doc.no_worker and not doc.is_finished():
            reasons.setdefault(doc.no_worker, []).append(doc.id)
    return reasons


def waiting_words(docs: Sequence[TaskDoc]) -> str:
    """What a progress bar's line adds: '; waiting: REASON' for the first reason the tasks
    give (and how many other reasons there are), '' where none waits."""
    reasons = list(waiting_reasons(docs))
    if not reasons:
        return ""
    others = len(reasons) - 1
    more = f" (and {others} other reason{'s' if others > 1 else ''})" if others else ""
    return f"; waiting: {reasons[0]}{more}"


class WaitNotes:
    """Says each waiting reason once on `console` (stderr), as it appears; again only after it
    has cleared (a worker came, then went)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._said: set[str] = set()

    def see(self, docs: Sequence[TaskDoc]) -> None:
        reasons = waiting_reasons(docs)
        for reason, ids in reasons.items():
            if reason not in self._said:
                tasks = f"task {ids[0]} waits" if len(ids) == 1 else f"tasks {_ids(ids)} wait"
                # One line whatever the terminal's width: a log's reader greps for it.
                self.console.print(f"warning: {tasks}: {reason}", soft_wrap=True)
        self._said = set(reasons)


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)

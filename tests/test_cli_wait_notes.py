"""Why followed tasks wait (clients/cli/wait_notes.py): the words a progress bar adds, and
the stderr notes where there is no bar, each reason once."""

from __future__ import annotations

import io

from rich.console import Console

from pipetune.clients.cli.wait_notes import WaitNotes, waiting_reasons, waiting_words
from pipetune.model.wire import TaskDoc

NO_H200 = "no h200 worker has registered"
NO_CUPY = "no cupy worker for h100 has registered"


def _doc(task_id: int, no_worker: str | None, state: str = "queued") -> TaskDoc:
    return TaskDoc.model_validate(
        {
            "id": task_id, "state": state, "workload": {"op": "gemm", "m": 64, "n": 64, "k": 64},
            "gpu": "h200", "strategy": "auto", "budget": 4, "seed": 0, "trials_done": 0,
            "trials_failed": 0, "no_worker": no_worker,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        }
    )  # fmt: skip


def test_reasons_group_the_unfinished_tasks_that_give_them():
    docs = [_doc(1, NO_H200), _doc(2, None), _doc(3, NO_H200), _doc(4, NO_CUPY)]
    assert waiting_reasons(docs) == {NO_H200: [1, 3], NO_CUPY: [4]}
    # A finished task waits for nothing, whatever its document says.
    assert waiting_reasons([_doc(5, NO_H200, state="cancelled")]) == {}


def test_a_bar_line_says_the_first_reason_and_how_many_others():
    assert waiting_words([_doc(1, None)]) == ""
    assert waiting_words([_doc(1, NO_H200), _doc(2, NO_H200)]) == f"; waiting: {NO_H200}"
    both = waiting_words([_doc(1, NO_H200), _doc(2, NO_CUPY)])
    assert both == f"; waiting: {NO_H200} (and 1 other reason)"
    three = waiting_words([_doc(1, NO_H200), _doc(2, NO_CUPY), _doc(3, "the third")])
    assert three.endswith("(and 2 other reasons)")


def test_each_reason_is_said_once_and_again_only_after_it_cleared():
    err = io.StringIO()
    notes = WaitNotes(Console(file=err, markup=False, width=40))  # each note one line anyway
    notes.see([_doc(1, NO_H200)])
    notes.see([_doc(1, NO_H200)])
    assert err.getvalue() == f"warning: task 1 waits: {NO_H200}\n"
    notes.see([_doc(1, None)])  # a worker came
    notes.see([_doc(1, NO_H200), _doc(2, NO_H200), _doc(3, NO_CUPY)])  # and went
    assert err.getvalue().splitlines()[1:] == [
        f"warning: tasks 1, 2 wait: {NO_H200}",
        f"warning: task 3 waits: {NO_CUPY}",
    ]

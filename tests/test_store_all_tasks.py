"""`all_tasks` (what `pipetune export --gpu` reads): every task once, page after page by the
last id read. By offset, each page read and skipped every task before it (2 s for 10,000
tasks through PostgreSQL: benchmarks/bench_lookup.py), and a task created between two pages
shifted the next page by one, so that a task came twice."""

from __future__ import annotations

from typing import Any

from pipetune.clients.library.store import all_tasks
from pipetune.model.wire import TASK_PAGE


class _Tasks:
    """A reader's `tasks` over ids, newest first, that creates a task after its first page."""

    def __init__(self, count: int):
        self.ids = list(range(count, 0, -1))
        self.asked: list[dict[str, Any]] = []

    def tasks(self, state=None, *, limit=None, offset=None, before=None):
        self.asked.append({"limit": limit, "offset": offset, "before": before})
        ids = [i for i in self.ids if before is None or i < before][offset or 0 :][:limit]
        if len(self.asked) == 1:
            self.ids.insert(0, max(self.ids) + 1)  # a task created meanwhile
        return [type("Task", (), {"id": i})() for i in ids]


def test_every_task_comes_once_page_after_page_by_the_last_id():
    reader = _Tasks(2 * TASK_PAGE + 30)
    ids = [task.id for task in all_tasks(reader)]  # type: ignore[arg-type]
    assert ids == list(range(2 * TASK_PAGE + 30, 0, -1))
    assert [a["offset"] for a in reader.asked] == [None, None, None]
    assert [a["before"] for a in reader.asked] == [None, TASK_PAGE + 31, 31]

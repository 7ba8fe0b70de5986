"""The dashboard given the service's answers by Playwright (page.route): the page and its
scripts come from a live service, every /v1 answer from a fake one, so that failed trials,
failed tasks, error answers, a service that does not answer, keys with `+`, `&` or `%` and
tasks older than the list are shown in seconds, without a worker to produce them.

These tests drive the same headless chromium as tests/test_dashboard.py (its fixture)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from test_dashboard import CHROMIUM_ARGS, _serve
from test_dashboard import chromium as chromium  # the fixture

WHEN = "2025-01-01T00:00:00Z"
UNIT = "TFLOP/s"


def task_doc(task_id: int, **fields: Any) -> dict[str, Any]:
    """A /v1/tasks row: a finished 6-trial GEMM task on h200, nothing failed, no best."""
    doc = {
        "id": task_id,
        "state": "done",
        "workload": {"op": "gemm", "m": 256, "n": 768, "k": 256},
        "label": "gemm 256x768x256",
        "gpu": "h200",
        "strategy": "random",
        "budget": 6,
        "seed": 0,
        "priority": 1,
        "trials_done": 6,
        "trials_failed": 0,
        "trials_target": 6,
        "best": None,
        "error": None,
        "no_worker": None,
        "created_at": WHEN,
        "updated_at": WHEN,
    }
    return {**doc, **fields}


def best_doc(throughput: float = 59.6, latency_us: float = 4.5) -> dict[str, Any]:
    return {
        "trial": 0,
        "schedule": {"block_m": 64},
        "schedule_label": "64x64x32 w4 s3",
        "latency_us": latency_us,
        "throughput": throughput,
        "throughput_unit": UNIT,
        "runner": "simulated",
    }


def ok_trial(trial: int, latency_us: float = 5.0) -> dict[str, Any]:
    return {
        "trial": trial,
        "state": "done",
        "status": "ok",
        "schedule": {"block_m": 64},
        "schedule_label": "64x64x32 w4 s3",
        "latency_us": latency_us,
        "predicted_us": latency_us * 0.9,
        "runner": "simulated",
    }


def failed_trial(trial: int, status: str, error: str) -> dict[str, Any]:
    return {
        "trial": trial,
        "state": "done",
        "status": status,
        "schedule": {"block_m": 64},
        "error": error,
        "runner": "simulated",
    }


class FakeService:
    """The /v1 answers the page gets: `listed` for /v1/tasks, `others` besides (read by id),
    `trials` per task; `errors` answers any URL containing its key with (status, body);
    `hanging` answers nothing at all while set."""

    def __init__(self, listed: list[dict], trials: dict[int, list[dict]] | None = None):
        self.listed = listed
        self.others: dict[int, dict] = {}
        self.trials = trials or {}
        self.errors: dict[str, tuple[int, Any]] = {}
        self.hanging = False
        self.held: list = []
        self.requests: list[tuple[str, dict[str, str]]] = []

    def install(self, page) -> None:  # type: ignore[no-untyped-def]
        page.route(lambda url: "/v1/" in url, self.answer)

    def answer(self, route) -> None:  # type: ignore[no-untyped-def]
        url = route.request.url
        self.requests.append((url, route.request.headers))
        if self.hanging:
            self.held.append(route)  # never answered: the page must give up by itself
            return
        for part, (status, body) in self.errors.items():
            if part in url:
                if isinstance(body, str):
                    route.fulfill(status=status, body=body, content_type="text/plain")
                else:
                    route.fulfill(status=status, json=body)
                return
        status, body = self.route(urlparse(url).path)
        route.fulfill(status=status, json=body)

    def route(self, path: str) -> tuple[int, Any]:
        parts = path.strip("/").split("/")  # v1, tasks, ID, trials
        if parts == ["v1", "tasks"]:
            return 200, {"tasks": self.listed}
        if parts == ["v1", "workers"]:  # (no worker: the tests here are about tasks)
            return 200, {"workers": [], "counts": {"live": 0, "silent": 0, "exited": 0}}
        if parts == ["v1", "curves"]:
            curve = [{"k": k, "best_in_k": 0.5 + k / 20, "tasks": 1} for k in range(1, 7)]
            return 200, {"curves": {"random": curve}, "runners": ["simulated"]}
        task_id = int(parts[2])
        task = {t["id"]: t for t in self.listed} | self.others
        if task_id not in task:
            return 404, {"detail": f"no task {task_id}"}
        trials = self.trials.get(task_id, [])
        if parts[3:] == ["trials"]:
            return 200, {"trials": trials}
        if parts[3:] == ["curve"]:
            points, best = [], None
            for t in trials:
                if t["status"] == "ok":
                    rate = 1000 / t["latency_us"]
                    best = rate if best is None else max(best, rate)
                points.append({"trial": t["trial"], "best_throughput": best})
            return 200, {"throughput_unit": UNIT, "points": points}
        return 200, task[task_id]

    def sent(self, part: str) -> list[str]:
        return [url for url, _ in self.requests if part in url]


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live service for the page and its static files (its /v1 routes are never asked)."""
    yield from _serve(tmp_path_factory.mktemp("dashboard-answers"))


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser, page_url):  # type: ignore[no-untyped-def]
    """open_page(fake, query, fragment): a fresh tab (own sessionStorage) on the dashboard,
    its /v1 requests answered by `fake`; page errors are collected in page.errors."""
    pages = []

    def open_(fake: FakeService, query: str = "refresh=250", fragment: str = ""):  # type: ignore[no-untyped-def]
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        fake.install(page)
        page.goto(f"{page_url}/dashboard?{query}{fragment}")
        return page

    yield open_
    for page in pages:
        page.context.close()


def refreshes(page) -> int:  # type: ignore[no-untyped-def]
    return int(page.evaluate("Number(document.body.dataset.refreshes || 0)"))


def wait_refreshes(page, more: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Until `more` refreshes past the current one have ended."""
    seen = refreshes(page)
    page.wait_for_function(
        f"() => Number(document.body.dataset.refreshes || 0) >= {seen + more}", timeout=20000
    )


def row(page, task_id: int):  # type: ignore[no-untyped-def]
    return page.locator(f'#tasks tbody tr[data-task="{task_id}"]')


def cell_text(page, task_id: int, column: int) -> str:  # type: ignore[no-untyped-def]
    return " ".join(row(page, task_id).locator("td").nth(column).inner_text().split())


def color(page, selector: str) -> str:  # type: ignore[no-untyped-def]
    return page.evaluate(f"getComputedStyle(document.querySelector('{selector}')).color")


GREEN = "rgb(26, 127, 55)"  # .state-done
MARKUP = '<img src=x onerror="document.title=1">'


# --- 1: failures ---------------------------------------------------------------------------


def test_failed_trials_a_task_without_success_and_a_failed_tasks_error_are_shown(open_page):
    """All 6 trials of task 117 failed: it read as a green "done 6/6"; 3 of task 12's 10
    trials failed: "done 10/10"; task 8 failed ("cannot propose: ..."): a red "failed" with
    no reason. The detail had no word of a failed trial."""
    fake = FakeService(
        [
            task_doc(117, trials_failed=6),
            task_doc(
                12, budget=10, trials_done=10, trials_target=10, trials_failed=3, best=best_doc()
            ),
            task_doc(8, state="failed", trials_done=0, error=f"cannot propose: {MARKUP}"),
            task_doc(5, state="queued", trials_done=0),
        ],
        {
            117: [failed_trial(i, "compile_error", f"ptxas: {MARKUP}") for i in range(5)]
            + [failed_trial(5, "runtime_error", "illegal address")],
            12: [failed_trial(i, "runtime_error", "crash") for i in range(3)]
            + [ok_trial(i) for i in range(3, 10)],
        },
    )
    page = open_page(fake, "refresh=250&task=117")
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")

    assert cell_text(page, 117, 5) == "6/6, 6 failed"
    assert cell_text(page, 117, 4) == "done no successful trial"
    assert color(page, '#tasks tr[data-task="117"] td:nth-child(5)') != GREEN
    assert cell_text(page, 12, 5) == "10/10, 3 failed"
    assert cell_text(page, 12, 4) == "done"  # a success: stays green
    assert color(page, '#tasks tr[data-task="12"] td:nth-child(5)') == GREEN
    assert cell_text(page, 8, 4) == f"failed cannot propose: {MARKUP}"  # as text
    assert cell_text(page, 5, 5) == "0/6"

    assert (
        page.locator("#task-summary").inner_text()
        == "done, 6/6 trials, 6 failed, no successful trial"
    )
    assert page.locator("#task-failures").inner_text() == (
        "6 of 6 trials failed (compile_error ×5, runtime_error ×1); "
        "latest, trial 5: illegal address"
    )
    assert page.locator("#task-error").is_hidden()

    row(page, 12).locator("td").nth(0).click()
    page.wait_for_function(
        "() => document.getElementById('task-failures').textContent.startsWith('3 of 10')"
    )
    assert page.locator("#task-failures").inner_text() == (
        "3 of 10 trials failed (runtime_error ×3); latest, trial 2: crash"
    )
    summary = page.locator("#task-summary").inner_text()
    assert summary == "done, 10/10 trials, 3 failed, best 59.6 TFLOP/s at 4.50 µs (simulated)"

    row(page, 8).locator("td").nth(0).click()
    page.wait_for_selector("#task-error:not([hidden])")
    assert page.locator("#task-error").inner_text() == f"cannot propose: {MARKUP}"
    assert page.locator("#task-failures").is_hidden()
    assert page.locator("#task-summary").inner_text() == "failed, 0/6 trials"
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.errors == []


def test_a_queued_task_has_a_style_of_its_own(open_page):
    fake = FakeService([task_doc(5, state="queued", trials_done=0), task_doc(4)])
    page = open_page(fake)
    row(page, 5).wait_for()
    queued = color(page, '#tasks tr[data-task="5"] td:nth-child(5)')
    assert queued != color(page, "body") and queued != GREEN


# --- 2: the key in the fragment ------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("Ab+9/xQ==", "Ab+9/xQ=="),  # base64: "+" was sent as a space
        ("p&q=r", "p&q=r"),  # was cut at "&"
        ('a"<>`b', 'a"<>`b'),  # the browser writes these %-escaped: undone
        ("k%2541z", "k%41z"),  # a literal "%" before two hex digits, written %25
        ("50%zz", "50%zz"),  # a "%" that starts no escape: as typed, nothing thrown
        ("x%E0%A4y", "x%E0%A4y"),  # escapes that are not UTF-8: as typed
    ],
)
def test_the_key_in_the_fragment_is_taken_as_typed(open_page, typed, sent):
    fake = FakeService([task_doc(1)])
    page = open_page(fake, fragment=f"#key={typed}")
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
    keys = {headers.get("x-api-key") for _, headers in fake.requests}
    assert keys == {sent}
    assert page.errors == []
    assert urlparse(page.url).fragment == ""


# --- 3: a service that does not answer -----------------------------------------------------


def test_a_request_with_no_answer_is_given_up_and_said_so(open_page):
    """A hung service (kill -STOP) left the page on its last "updated" time, polling nothing,
    until TCP gave up. The limit is 15 s at this refresh period."""
    fake = FakeService([task_doc(1, best=best_doc())], {1: [ok_trial(0)]})
    page = open_page(fake)
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 2")
    fake.hanging = True
    hung_at = time.monotonic()
    page.wait_for_function(
        "() => document.getElementById('status').textContent"
        ".startsWith('no answer from the service since ')",
        timeout=30000,
    )
    waited = time.monotonic() - hung_at
    assert 14 < waited < 25, waited
    fake.hanging = False  # back: the page polls again by itself
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('updated ')",
        timeout=20000,
    )


# --- 4: the table is updated in place ------------------------------------------------------


def _three_tasks(open_page):  # type: ignore[no-untyped-def]
    """A page on tasks 3 (running: its row changes), 2 and 1, after its first refreshes."""
    tasks = [task_doc(3, state="running", trials_done=1), task_doc(2), task_doc(1)]
    page = open_page(FakeService(tasks))
    row(page, 1).wait_for()
    wait_refreshes(page)
    assert row(page, 3).get_attribute("class") == "selected"  # the newest
    return page, tasks


def _workload_box(page, task_id: int) -> dict:  # type: ignore[no-untyped-def]
    """Where a row's workload cell is, measured in one step (a locator's box is None when the
    row is replaced meanwhile, as the unfixed page did every refresh)."""
    return page.evaluate(
        "(id) => { const r = document.querySelector(`#tasks tr[data-task='${id}'] td:nth-child(2)`)"
        ".getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; }",
        task_id,
    )


def _middle(box: dict) -> tuple[float, float]:
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def test_rows_are_updated_in_place_and_a_text_selection_survives_a_refresh(open_page):
    """The table was rebuilt every refresh: a text selection in it vanished within 2 s."""
    page, tasks = _three_tasks(open_page)
    page.evaluate(
        "window.kept = document.querySelector('#tasks tr[data-task=\"2\"] td:nth-child(2)');"
        "window.runningRow = document.querySelector('#tasks tr[data-task=\"3\"]');"
        "getSelection().selectAllChildren(window.kept)"
    )
    tasks[0]["trials_done"] = 2  # the running task moves on: its row changes
    wait_refreshes(page, 2)
    assert cell_text(page, 3, 5) == "2/6"
    assert page.evaluate("window.kept.isConnected && window.runningRow.isConnected")
    assert page.evaluate("getSelection().toString()") == "gemm 256x768x256"
    assert page.errors == []


def test_a_drag_over_a_cell_selects_its_text_not_its_task(open_page):
    page, _ = _three_tasks(open_page)
    box = _workload_box(page, 2)
    x, y = _middle(box)
    page.mouse.move(box["x"] + 2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] - 2, y, steps=5)
    page.mouse.up()
    assert page.evaluate("getSelection().toString()").startswith("gemm")
    wait_refreshes(page)
    assert row(page, 3).get_attribute("class") == "selected"
    assert not row(page, 2).get_attribute("class")
    page.mouse.click(x, y)  # a plain click does choose it
    page.wait_for_function(
        "() => document.querySelector('#tasks tr[data-task=\"2\"]').className === 'selected'",
        timeout=5000,
    )


def test_a_click_whose_press_and_release_straddle_a_refresh_is_not_lost(open_page):
    """Pressed on task 1, released after refreshes that changed the table: the press and the
    release fell on different (rebuilt) rows, and no click came."""
    page, tasks = _three_tasks(open_page)
    page.mouse.move(*_middle(_workload_box(page, 1)))
    page.mouse.down()
    tasks[0]["trials_done"] = 3
    wait_refreshes(page, 2)
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('#tasks tr[data-task=\"1\"]').className === 'selected'",
        timeout=5000,
    )
    assert page.errors == []


def test_an_unchanged_list_is_not_redrawn(open_page):
    fake = FakeService([task_doc(2), task_doc(1, trials_failed=1)])
    page = open_page(fake)
    row(page, 1).wait_for()
    page.evaluate(
        "window.changes = 0; new MutationObserver((m) => { window.changes += m.length; })"
        ".observe(document.querySelector('#tasks tbody'),"
        " {subtree: true, childList: true, characterData: true, attributes: true})"
    )
    wait_refreshes(page, 3)
    assert page.evaluate("window.changes") == 0


# --- 5, 6: the selected task's own row -----------------------------------------------------


def test_a_task_outside_the_list_is_read_and_its_state_shown(open_page):
    """/dashboard?task=8 of a task older than the 100 listed: its plots and title, but its
    state (failed) nowhere; a selected task that dropped out of the list lost its title."""
    failed = task_doc(
        8,
        state="failed",
        budget=8,
        trials_target=8,
        trials_done=8,
        trials_failed=8,
        error="cannot propose: no space",
    )
    fake = FakeService([task_doc(117), task_doc(116, strategy="grid")], {})
    fake.others[8] = failed
    page = open_page(fake, "refresh=250&task=8")
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
    assert row(page, 8).count() == 0
    assert page.locator("#task-title").inner_text() == "Task 8: gemm 256x768x256 on h200 (random)"
    assert page.locator("#task-summary").inner_text() == (
        "failed, 8/8 trials, 8 failed, no successful trial"
    )
    assert page.locator("#task-error").inner_text() == "cannot propose: no space"
    # Read again each refresh: its state follows the service.
    fake.others[8] = {**failed, "error": "cannot propose: space exhausted"}
    page.wait_for_function(
        "() => document.getElementById('task-error').textContent.endsWith('exhausted')"
    )

    row(page, 116).locator("td").nth(0).click()
    page.wait_for_function(
        "() => document.getElementById('task-title').textContent.startsWith('Task 116:')"
    )
    fake.listed = [task_doc(118), task_doc(117)]  # a new task: 116 drops out of the list
    fake.others[116] = task_doc(116, strategy="grid", state="cancelled")
    page.wait_for_function(
        "() => document.getElementById('task-summary').textContent.startsWith('cancelled')"
    )
    assert page.locator("#task-title").inner_text() == "Task 116: gemm 256x768x256 on h200 (grid)"
    assert page.errors == []


def test_the_title_words_the_strategy_as_the_row_does(open_page):
    """An imported dataset's title said "(grid)" beside a row that says "imported dataset";
    a warm-started task's lost its prior and its priority."""
    fake = FakeService(
        [
            task_doc(13, strategy="grid", imported_from="Conv2D.t4.json.gz"),
            task_doc(6, strategy="auto", prior_task=1, priority=3),
        ]
    )
    page = open_page(fake, "refresh=250&task=13")
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
    assert cell_text(page, 13, 3) == "imported dataset"
    assert page.locator("#task-title").inner_text().endswith("(imported dataset)")
    row(page, 6).locator("td").nth(0).click()
    page.wait_for_function(
        "() => document.getElementById('task-title').textContent.startsWith('Task 6:')"
    )
    assert cell_text(page, 6, 3) == "auto (prior: task 1), priority 3"
    assert page.locator("#task-title").inner_text().endswith("(auto (prior: task 1), priority 3)")


# --- 7: one failing part -------------------------------------------------------------------


def test_a_failing_part_keeps_nothing_else_from_drawing_and_is_worded_as_an_answer(open_page):
    """A 503 of the selected task's trials (a database stall) kept the aggregate and the
    banner from ever drawing, and said "cannot reach the service: ...: HTTP 503"."""
    fake = FakeService([task_doc(8, best=best_doc())], {8: [ok_trial(0), ok_trial(1, 4.5)]})
    stalled = "the database is not answering; retry later"
    fake.errors["/v1/tasks/8/trials"] = (503, {"detail": stalled})
    page = open_page(fake, "refresh=250&task=8")
    page.wait_for_function(
        "() => { const d = document.getElementById('aggregate-plot').data;"
        " return d && d.length === 1; }",
        timeout=20000,
    )
    page.wait_for_selector("#simulated-banner:not([hidden])")
    assert row(page, 8).count() == 1
    assert page.locator("#task-section").is_visible()
    assert page.locator("#task-title").inner_text().startswith("Task 8: gemm")
    status = page.locator("#status").inner_text()
    asked = "/v1/tasks/8/trials?after=-1&limit=2000&error_chars=300"
    assert status == f"the service answered 503 for {asked}: {stalled}; retrying"

    # The aggregate's route failing (a 500 with no JSON): the rest draws, it is tried again.
    del fake.errors["/v1/tasks/8/trials"]
    fake.errors["/v1/curves"] = (500, "Internal Server Error")
    page2 = open_page(fake, "refresh=250&task=8")
    page2.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 2; }",
        timeout=20000,
    )
    page2.wait_for_selector("#simulated-banner:not([hidden])")
    assert page2.locator("#status").inner_text() == (
        "the service answered 500 for /v1/curves; retrying"
    )
    asked = len(fake.sent("/v1/curves"))
    wait_refreshes(page2, 2)
    assert len(fake.sent("/v1/curves")) > asked  # not left for 5 refreshes
    del fake.errors["/v1/curves"]
    page2.wait_for_function(
        "() => { const d = document.getElementById('aggregate-plot').data;"
        " return d && d.length === 1; }",
        timeout=20000,
    )
    page2.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('updated ')"
    )
    assert page.errors == [] and page2.errors == []


# --- HEAD -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/dashboard", "/dashboard/static/dashboard.js", "/dashboard/static/plotly.min.js"]
)
def test_head_is_answered_as_get(page_url, path):
    """An uptime check asking with HEAD got 405."""
    head = httpx.head(f"{page_url}{path}")
    get = httpx.get(f"{page_url}{path}")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert httpx.head(f"{page_url}/dashboard/static/nothing.js").status_code == 404


def test_the_vocabulary_names_the_final_task_states(page_url):
    page = httpx.get(f"{page_url}/dashboard").text
    start = page.index('type="application/json">') + len('type="application/json">')
    vocabulary = json.loads(page[start : page.index("</script>", start)])
    assert sorted(vocabulary["final_task_states"]) == ["cancelled", "done", "failed"]


def test_a_throughput_too_small_for_its_decimals_keeps_two_significant_digits(open_page):
    """A tiny GEMM's 0.0052 TFLOP/s read "best 0.0 TFLOP/s", as the CLI's did."""
    fake = FakeService(
        [task_doc(3, best=best_doc(throughput=0.0052, latency_us=1.6))],
        {3: [ok_trial(i) for i in range(6)]},
    )
    page = open_page(fake, "refresh=250&task=3")
    page.wait_for_function("() => Number(document.body.dataset.refreshes || 0) >= 1")
    summary = page.locator("#task-summary").inner_text()
    assert summary == "done, 6/6 trials, best 0.0052 TFLOP/s at 1.60 µs (simulated)", summary

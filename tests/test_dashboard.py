"""The dashboard in headless Chromium (Debian's chromium, driven by Playwright): it loads
with no console error and no request off the machine, draws the task's best-so-far curve,
the measured-vs-predicted scatter and the best-in-k curves per strategy, and refreshes
incrementally as trials arrive. Simulated trials are labelled simulated wherever they are
drawn, and the plot titles stay clear of Plotly's mode bar.

`PIPETUNE_DASHBOARD_SCREENSHOT=docs/dashboard-simulated.png` makes the simulated-labels test
save its screenshot there too (the one in docs/ was taken that way)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from service_support import GEMM, TOKEN, fake_latency, live_server
from sqlalchemy import create_engine, update

from pipetune.service.migrate import upgrade
from pipetune.service.orm import WorkerRow

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
SCREENSHOT_ENV = "PIPETUNE_DASHBOARD_SCREENSHOT"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium; its absence fails the test with the command that installs it."""
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if found is None:
        pytest.fail(
            "Debian's chromium is not installed (make test installs it; by hand: "
            "sudo apt-get install -y chromium)",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def chromium_browser(chromium: str) -> Iterator[Browser]:
    """One Chromium for the module's tests: a launch (with Playwright's driver) costs about
    1.5 CPU seconds, a context of its own 0.2."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium_browser: Browser) -> Iterator[Browser]:
    """The module's Chromium. Each of its new_page() opens a context of its own (cookies,
    storage and cache as a freshly launched browser's), as each did when every test
    launched one; the test's contexts are closed after it."""
    yield chromium_browser
    for context in chromium_browser.contexts:
        context.close()


@pytest.fixture
def live_url(tmp_path: Path) -> Iterator[str]:
    yield from _serve(tmp_path)


def _serve(tmp_path: Path, **overrides) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'dashboard.db'}"
    upgrade(url)
    with live_server(url, **overrides) as base:
        yield base


def _register(client: httpx.Client, name: str, runner: str, gpu: str = "h100") -> int:
    arch = {"a100": "sm_80", "h100": "sm_90"}[gpu]
    body = {"name": name, "gpu": gpu, "arch": arch, "runner": runner}
    return client.post("/v1/workers", json=body, headers=HEADERS).json()["id"]


def _answer(
    client: httpx.Client, worker: int, max_jobs: int, wait_s: float = 2, runner: str | None = None
) -> int:
    jobs = client.post(
        "/v1/jobs/lease",
        json={"worker_id": worker, "max_jobs": max_jobs, "wait_s": wait_s},
        headers=HEADERS,
    ).json()["jobs"]
    for job in jobs:
        body: dict = {
            "worker_id": worker,
            "lease_token": job["lease_token"],
            "result": {"status": "ok", "latency_us": fake_latency(job["schedule"])},
        }
        if runner is not None:
            body["result"]["runner"] = runner
        ack = client.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=HEADERS)
        assert ack.json()["accepted"] is True
    return len(jobs)


def _finish(
    client: httpx.Client, worker: int, task_ids: list[int], runner: str | None = None
) -> None:
    """Answer jobs until the tasks are done (the next batch comes after each advance)."""
    while any(client.get(f"/v1/tasks/{t}").json()["state"] != "done" for t in task_ids):
        _answer(client, worker, 8, runner=runner)


def _two_finished_tasks(client: httpx.Client) -> int:
    """A simulated worker, and a grid and an analytical task of 16 trials it finished."""
    worker = _register(client, "sim", "simulated")
    finished = []
    for strategy in ("grid", "analytical"):
        body = {"workload": GEMM, "gpu": "h100", "budget": 16, "strategy": strategy}
        finished.append(client.post("/v1/tasks", json=body).json()["id"])
    _finish(client, worker, finished)
    return worker


def test_the_page_runs_only_its_own_scripts_and_is_not_framed(live_url):
    # (No header at all before: the page was safe only as long as every string stayed text.
    # The console-error test below runs the page under this policy: a violation is an error.)
    page = httpx.get(f"{live_url}/dashboard")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-eval" not in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"


def test_dashboard_draws_the_curves_without_console_errors(live_url, browser):

    client = httpx.Client(base_url=live_url, timeout=30)
    worker = _two_finished_tasks(client)
    running = client.post(
        "/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 24, "strategy": "random"}
    ).json()["id"]
    _answer(client, worker, 8)  # 8 of its 24 trials measured

    page = browser.new_page()
    errors = _console_errors(page)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    page.goto(f"{live_url}/dashboard?refresh=300")
    # The newest task is selected first: 8 trials measured so far.
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 8; }",
        timeout=20000,
    )
    assert page.locator("#tasks tbody tr").count() == 3
    assert "running" in page.locator("#tasks tbody tr").first.inner_text()
    assert page.locator("#curve-plot .scatterlayer .trace").count() == 1
    scatter = page.evaluate("document.getElementById('scatter-plot').data[0].x.length")
    assert scatter == 8
    page.wait_for_function(
        "() => { const d = document.getElementById('aggregate-plot').data;"
        " return d && d.length === 3; }",
        timeout=20000,
    )
    strategies = page.evaluate(
        "document.getElementById('aggregate-plot').data.map(t => t.name).sort()"
    )
    assert strategies == ["analytical", "grid", "random"]
    assert page.locator("#aggregate-plot .scatterlayer .trace").count() == 3

    # More trials arrive: the page extends its plots, asking only for what is new.
    _finish(client, worker, [running])
    page.wait_for_function(
        "() => document.getElementById('curve-plot').data[0].x.length === 24",
        timeout=20000,
    )
    assert page.evaluate("document.getElementById('scatter-plot').data[0].x.length") == 24
    afters = [
        int(parse_qs(urlparse(u).query)["after"][0])
        for u in requested
        if f"/v1/tasks/{running}/trials" in u
    ]
    assert afters[0] == -1 and max(afters) >= 7  # later refreshes start past what it has
    # Errors come cut to the 300 characters the page shows, not as whole compiler logs.
    cuts = [parse_qs(urlparse(u).query).get("error_chars") for u in requested if "/trials" in u]
    assert cuts and all(cut == ["300"] for cut in cuts), cuts

    # Selecting another task draws its curve.
    page.locator("#tasks tbody tr").nth(2).click()
    page.wait_for_function(
        "() => document.getElementById('task-title').textContent.includes('grid')",
        timeout=20000,
    )
    page.wait_for_function(
        "() => document.getElementById('curve-plot').data[0].x.length === 16",
        timeout=20000,
    )
    page.close()
    client.close()
    assert errors == []
    assert all(urlparse(u).netloc == urlparse(live_url).netloc for u in requested), requested
    assert any(u.endswith("/dashboard/static/plotly.min.js") for u in requested)


PROXY_PREFIX = "/pipetune"


def _behind_a_prefix_stripping_proxy(page, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Route the page's requests as a proxy serving the service under `prefix` would: those
    under it to the service without it, any other answered 404 and listed (the list). The
    test ends the routing (page.unroute_all) before the page closes: a refresh's request in
    flight then failed in the route's fetch, and the next test's new page with it."""
    outside: list[str] = []

    def proxy(route) -> None:  # type: ignore[no-untyped-def]
        url = urlparse(route.request.url)
        if not url.path.startswith(f"{prefix}/"):
            outside.append(route.request.url)
            route.fulfill(status=404, body="not behind this proxy")
            return
        inner = url._replace(path=url.path.removeprefix(prefix)).geturl()
        route.fulfill(response=route.fetch(url=inner))

    page.route("**/*", proxy)
    return outside


def test_the_dashboard_works_behind_a_proxy_that_serves_it_under_a_prefix(live_url, browser):
    """A proxy at https://host/pipetune/ that strips its prefix (emulated in the browser: a
    request under /pipetune/ goes to the service without it, any other answers 404). The
    page asked for its files and its data at the host's root (/dashboard/static/...,
    /v1/...), outside the proxy's prefix: it drew nothing. Its links are relative now, and
    the service needs no setting for it."""
    client = httpx.Client(base_url=live_url, timeout=30)
    _two_finished_tasks(client)
    client.close()
    page = browser.new_page()
    outside = _behind_a_prefix_stripping_proxy(page, PROXY_PREFIX)
    errors = _console_errors(page)
    page.goto(f"{live_url}{PROXY_PREFIX}/dashboard?refresh=300")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 16; }",
        timeout=20000,
    )
    assert page.locator("#tasks tbody tr").count() == 2
    page.wait_for_function(
        "() => { const d = document.getElementById('aggregate-plot').data;"
        " return d && d.length === 2; }",
        timeout=20000,
    )
    # What the page said while behind the proxy: past unroute_all its next refresh goes to
    # the service at the proxy's path, which answers 404.
    said = list(errors)
    page.unroute_all(behavior="ignoreErrors")  # (a refresh's request may be in flight)
    page.close()
    assert outside == [] and said == [], (outside, said)


def test_a_click_during_a_refresh_draws_each_curve_point_once(live_url, browser):
    """A refresh in flight when another task is selected used to run beside the click's
    refresh: both fetched the curve from the same point and appended it twice (32 points
    for 16 trials; seen as a flaky timeout in CI). The page's /v1/tasks requests are held
    here so the two refreshes overlap every time."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        _two_finished_tasks(client)

    page = browser.new_page()
    page.goto(f"{live_url}/dashboard?refresh=250")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 16; }",
        timeout=20000,
    )
    held: list = []
    holding = [True]

    def hold(route) -> None:  # type: ignore[no-untyped-def]
        if holding[0]:
            held.append(route)
        else:
            route.continue_()

    page.route("**/v1/tasks?limit=100", hold)
    deadline = time.monotonic() + 20
    while not held:  # the loop's next refresh now waits for its task list
        assert time.monotonic() < deadline
        page.wait_for_timeout(50)
    page.locator("#tasks tbody tr").nth(1).click()  # the grid task
    page.wait_for_timeout(300)  # the click's refresh starts (and waits too, unfixed)
    holding[0] = False
    for route in held:
        route.continue_()
    page.wait_for_function(
        "() => document.getElementById('task-title').textContent.includes('grid')",
        timeout=20000,
    )
    seen = int(page.evaluate("document.body.dataset.refreshes"))
    page.wait_for_function(
        f"() => Number(document.body.dataset.refreshes) >= {seen + 3}", timeout=20000
    )
    points = page.evaluate("document.getElementById('curve-plot').data[0].x")
    page.close()
    assert points == list(range(1, 17))


def _axis_title(page, plot: str, axis: str) -> str:
    return page.evaluate(f"document.getElementById('{plot}').layout.{axis}.title.text")


def _wait_for_aggregate(page, traces: int) -> None:
    page.wait_for_function(
        "() => { const d = document.getElementById('aggregate-plot').data;"
        f" return d && d.length === {traces}; }}",
        timeout=20000,
    )


def test_simulated_trials_are_labelled_simulated_wherever_drawn(live_url, browser, tmp_path):
    with httpx.Client(base_url=live_url, timeout=30) as client:
        _two_finished_tasks(client)  # a simulated worker's: every trial on screen simulated

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 16; }",
        timeout=20000,
    )
    _wait_for_aggregate(page, 2)
    page.wait_for_selector("#simulated-banner:not([hidden])", timeout=20000)
    banner = page.locator("#simulated-banner").inner_text()
    assert "simulated" in banner and "not a measurement" in banner
    # The task table: both best latencies (and throughputs) tagged simulated.
    for row in range(2):
        cells = page.locator("#tasks tbody tr").nth(row).locator("td")
        for column in (6, 7):  # best TFLOP/s, best µs
            text = cells.nth(column).inner_text()
            assert text.split()[-1] == "simulated", text
    # The axis titles and the plot titles.
    assert _axis_title(page, "scatter-plot", "yaxis") == "simulated µs"
    assert _axis_title(page, "curve-plot", "yaxis") == "simulated TFLOP/s"
    assert _axis_title(page, "aggregate-plot", "yaxis") == "best-in-k (simulated trials)"
    assert page.locator("#scatter-title").inner_text() == "Simulated vs predicted"
    assert page.locator("#curve-title").inner_text() == "Best so far (simulated trials)"
    assert page.evaluate("document.getElementById('scatter-plot').data[0].name") == (
        "simulated trials"
    )
    shot = tmp_path / "dashboard-simulated.png"
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])


def test_a_simulated_task_whose_every_trial_failed_is_not_called_measured(live_url, browser):
    """With no successful trial the scatter plot fell back to "Measured vs predicted" beside
    "Best so far (simulated trials)"."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "sim", "simulated")
        body = {"workload": GEMM, "gpu": "h100", "budget": 4, "strategy": "random"}
        task = client.post("/v1/tasks", json=body).json()["id"]
        while client.get(f"/v1/tasks/{task}").json()["state"] != "done":
            lease = {"worker_id": worker, "max_jobs": 8, "wait_s": 2}
            jobs = client.post("/v1/jobs/lease", json=lease, headers=HEADERS).json()["jobs"]
            for job in jobs:
                failed = {"status": "runtime_error", "error": "crash", "runner": "simulated"}
                answer = {"worker_id": worker, "lease_token": job["lease_token"], "result": failed}
                url = f"/v1/jobs/{job['job_id']}/result"
                assert client.post(url, json=answer, headers=HEADERS).json()["accepted"]
        assert client.get(f"/v1/tasks/{task}").json()["trials_failed"] == 4

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300&task={task}")
    # Once the first refresh has drawn the task (the page's own "Measured vs predicted"
    # placeholder matched a wait for "predicted" before any data came: a race CI lost).
    page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1", timeout=20000)
    assert page.locator("#scatter-title").inner_text() == "Simulated vs predicted"
    assert _axis_title(page, "scatter-plot", "yaxis") == "simulated µs"
    page.close()


def test_a_task_that_never_ran_is_not_called_measured(live_url, browser):
    """A task cancelled before any trial (no runner asked for) drew "Measured vs predicted"
    and "measured µs": it has no latencies of any kind."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        body = {"workload": GEMM, "gpu": "h100", "budget": 4, "strategy": "random"}
        task = client.post("/v1/tasks", json=body).json()["id"]
        assert client.delete(f"/v1/tasks/{task}").status_code == 200

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300&task={task}")
    page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 1", timeout=20000)
    assert page.locator("#scatter-title").inner_text() == "Latency vs predicted"
    assert _axis_title(page, "scatter-plot", "yaxis") == "latency µs"
    page.close()


def test_a_softmax_task_draws_its_curve_in_gb_per_s(live_url, browser):
    """The memory-intensive family on the dashboard: its row, its curve and its axis in the
    family's unit (GB/s), labelled simulated, beside a GEMM task in TFLOP/s."""
    softmax = {"op": "softmax", "rows": 4096, "cols": 768}
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "sim", "simulated")
        tasks = []
        for workload in (GEMM, softmax):  # the softmax task is the newest: selected first
            body = {"workload": workload, "gpu": "h100", "budget": 16, "strategy": "random"}
            tasks.append(client.post("/v1/tasks", json=body).json()["id"])
        _finish(client, worker, tasks)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{live_url}/dashboard?refresh=300")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 16; }",
        timeout=20000,
    )
    assert "softmax 4096x768" in page.locator("#task-title").inner_text()
    assert _axis_title(page, "curve-plot", "yaxis") == "simulated GB/s"
    rows = [page.locator("#tasks tbody tr").nth(i).inner_text() for i in range(2)]
    assert "softmax 4096x768" in rows[0] and "GB/s" in rows[0], rows[0]
    assert "TFLOP/s" in rows[1] and "GB/s" not in rows[1], rows[1]
    # The curve's values are the task's best throughputs in GB/s, not TFLOP/s.
    best = page.evaluate("Math.max(...document.getElementById('curve-plot').data[0].y)")
    assert best > 100  # a softmax on an H100 moves hundreds of GB/s, not ~1 TFLOP/s
    page.locator("#tasks tbody tr").nth(1).click()
    page.wait_for_function(
        "() => document.getElementById('task-title').textContent.includes('gemm')",
        timeout=20000,
    )
    page.wait_for_function(
        "() => document.getElementById('curve-plot').layout.yaxis.title.text"
        " === 'simulated TFLOP/s'",
        timeout=20000,
    )
    page.close()
    assert errors == []


def test_measured_trials_beside_simulated_ones_are_told_apart(live_url, browser):
    """A task measured by a cupy worker: no banner (not every trial on screen is
    simulated), its latencies untagged and called measured; the simulated task's tagged."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        _two_finished_tasks(client)
        gpu_worker = _register(client, "gpu", "cupy")
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        measured = client.post("/v1/tasks", json=body).json()["id"]
        _finish(client, gpu_worker, [measured])

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300&task={measured}")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 8; }",
        timeout=20000,
    )
    _wait_for_aggregate(page, 3)
    page.wait_for_function("() => Number(document.body.dataset.refreshes) >= 2", timeout=20000)
    assert page.locator("#simulated-banner").is_hidden()
    rows = page.locator("#tasks tbody tr")
    assert "simulated" not in rows.nth(0).inner_text()  # the newest: the measured task
    assert rows.nth(1).locator("td").nth(7).inner_text().endswith("simulated")
    assert _axis_title(page, "scatter-plot", "yaxis") == "measured µs"
    assert _axis_title(page, "curve-plot", "yaxis") == "TFLOP/s"
    # The aggregate mixes a measured and simulated tasks, and says so.
    assert _axis_title(page, "aggregate-plot", "yaxis") == (
        "best-in-k (measured or simulated trials)"
    )
    page.close()


def test_a_replay_of_a_simulated_sweep_is_labelled_simulated(live_url, browser):
    """A replay worker replaying a simulated sweep ("replay:simulated"): its latencies are the
    analytical model's, and the page says so (they were tagged "replayed", the banner hidden,
    and /v1/curves called their kind "replay")."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "replayer", "replay")
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        task = client.post("/v1/tasks", json=body).json()["id"]
        _finish(client, worker, [task], runner="replay:simulated")
        assert client.get("/v1/tasks/" + str(task)).json()["best"]["runner"] == "replay:simulated"
        assert client.get("/v1/curves").json()["runners"] == ["simulated"]

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300&task={task}")
    page.wait_for_selector("#simulated-banner:not([hidden])", timeout=20000)
    cells = page.locator("#tasks tbody tr").nth(0).locator("td")
    assert cells.nth(7).inner_text().split()[-1] == "simulated"
    assert _axis_title(page, "scatter-plot", "yaxis") == "simulated µs"
    page.close()


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_plot_titles_are_clear_of_the_mode_bar_at_1400_px(live_url, browser):
    with httpx.Client(base_url=live_url, timeout=30) as client:
        _two_finished_tasks(client)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_url}/dashboard?refresh=300")
    page.wait_for_function(
        "() => { const d = document.getElementById('curve-plot').data;"
        " return d && d[0].x.length === 16; }",
        timeout=20000,
    )
    _wait_for_aggregate(page, 2)
    for plot in ("curve-plot", "scatter-plot", "aggregate-plot"):
        page.hover(f"#{plot}")  # the mode bar shows on hover
        bar = page.locator(f"#{plot} .modebar").bounding_box()
        assert bar is not None and bar["width"] > 0, plot
        # Every title of the plot: its caption, and any title drawn inside it.
        titles = page.locator(f"#{plot} .gtitle").all()
        titles.append(page.locator(f"#{plot}").locator("xpath=../figcaption"))
        for title in titles:
            box = title.bounding_box()
            assert box is not None, plot
            assert not _overlap(box, bar), (plot, title.inner_text(), box, bar)
    page.close()


def _import_small_sweep(db_url: str) -> int:
    """A simulated A100 sweep of a small GEMM imported as a task (plumbing only): every 8th
    schedule of its space, as the page shows any import alike (the whole space cost seconds)."""
    from pipetune.model.hardware import get_gpu
    from pipetune.model.space import Space
    from pipetune.model.workloads import gemm
    from pipetune.service.db import Database
    from pipetune.service.imports import import_dataset
    from pipetune.workers.datasets.pipetune import check_pipetune
    from pipetune.workers.runners import make_runner
    from pipetune.workers.runners.sweep import sweep

    gpu, workload = get_gpu("a100"), gemm(256, 128, 512)
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        data = sweep(sim, workload, gpu, list(Space.enumerate(workload, gpu))[::8], progress=None)
    database = Database(db_url, pool_size=1)
    try:
        with database.write() as s:
            return import_dataset(s, data, check_pipetune(data), "sweep.t4.json", database.now())
    finally:
        database.dispose()


def _import_measured(db_url: str) -> int:
    """A measured H100 dataset of the campaign imported as a task: what a learned prior reads."""
    from pipetune.service.db import Database
    from pipetune.service.imports import import_dataset
    from pipetune.workers.datasets import load_dataset
    from pipetune.workers.datasets.pipetune import check_pipetune

    path = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz"
    data = load_dataset(path)
    database = Database(db_url, pool_size=1)
    try:
        with database.write() as s:
            return import_dataset(s, data, check_pipetune(data), path.name, database.now())
    finally:
        database.dispose()


def test_a_warm_started_task_names_its_prior_an_import_says_so_and_a_priority_shows(
    live_url, browser, tmp_path
):
    imported = _import_small_sweep(f"sqlite:///{tmp_path / 'dashboard.db'}")
    measured = _import_measured(f"sqlite:///{tmp_path / 'dashboard.db'}")
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "sim-a100", "simulated", gpu="a100")
        body = {"workload": GEMM, "gpu": "a100", "budget": 8, "strategy": "random"}
        prior = client.post("/v1/tasks", json=body).json()["id"]
        _finish(client, worker, [prior])
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "prior_task": prior}
        warm = client.post("/v1/tasks", json=body).json()["id"]
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "learned_prior": True}
        learned = client.post("/v1/tasks", json=body).json()
        assert learned["learned_from"] == [measured], learned
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        urgent = client.post("/v1/tasks", json={**body, "priority": 3}).json()["id"]

    page = browser.new_page()
    page.goto(f"{live_url}/dashboard?refresh=300")
    row = page.locator(f'#tasks tbody tr[data-task="{warm}"]')
    row.wait_for(timeout=20000)
    assert f"auto (prior: task {prior})" in row.inner_text()
    learned_row = page.locator(f'#tasks tbody tr[data-task="{learned["id"]}"]')
    assert f"auto (prior: learned from task {measured})" in learned_row.inner_text()
    other = page.locator(f'#tasks tbody tr[data-task="{prior}"]').inner_text()
    assert "prior:" not in other and "priority" not in other
    urgent_row = page.locator(f'#tasks tbody tr[data-task="{urgent}"]').inner_text()
    assert "random, priority 3" in urgent_row
    assert (
        "imported dataset" in page.locator(f'#tasks tbody tr[data-task="{imported}"]').inner_text()
    )
    page.close()


def test_the_aggregate_is_asked_again_only_when_a_listed_task_moved(live_url, browser):
    """GET /v1/curves reads every task in the database; the page asked for it every fifth
    refresh whether or not anything had run (an idle tab at 6,000 tasks kept 6% of a core
    busy). Now: when a listed task moved, or after thirty refreshes."""
    client = httpx.Client(base_url=live_url, timeout=30)
    worker = _two_finished_tasks(client)
    page = browser.new_page()
    curves: list[str] = []
    page.on("request", lambda r: curves.append(r.url) if "/v1/curves" in r.url else None)

    def refreshes() -> int:
        return int(page.evaluate("Number(document.body.dataset.refreshes)"))

    def wait_past(n: int) -> None:
        page.wait_for_function(
            f"() => Number(document.body.dataset.refreshes) >= {n}", timeout=30000
        )

    page.goto(f"{live_url}/dashboard?refresh=250")
    wait_past(16)
    assert len(curves) == 1, curves  # nothing ran: the first answer stands
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
    _finish(client, worker, [client.post("/v1/tasks", json=body).json()["id"]])
    page.wait_for_function(
        "() => document.getElementById('aggregate-plot').data.length === 3", timeout=20000
    )
    wait_past(refreshes() + 6)  # (a move seen after the ask is asked for once more)
    asked, now = len(curves), refreshes()
    assert asked >= 2
    wait_past(now + 12)
    assert len(curves) == asked, curves  # nothing moved since
    wait_past(now + 33)  # thirty refreshes after the last ask, whatever the list says
    assert len(curves) > asked, curves
    page.close()
    client.close()


def test_the_aggregate_pools_every_gpu_or_draws_the_one_chosen(live_url, browser):
    """The best-in-k chart asked /v1/curves for every GPU's tasks at once, with no word of it
    and no way to pick one GPU."""
    client = httpx.Client(base_url=live_url, timeout=30)
    worker = _two_finished_tasks(client)  # grid and analytical, on the H100
    a100 = _register(client, "sim-a100", "simulated", gpu="a100")
    body = {"workload": GEMM, "gpu": "a100", "budget": 8, "strategy": "random"}
    _finish(client, a100, [client.post("/v1/tasks", json=body).json()["id"]])
    del worker
    page = browser.new_page()
    curves: list[str] = []
    page.on("request", lambda r: curves.append(r.url) if "/v1/curves" in r.url else None)
    page.goto(f"{live_url}/dashboard?refresh=300")
    _wait_for_aggregate(page, 3)
    title = page.locator("#aggregate-title")
    assert title.inner_text().startswith("Best-in-k, every GPU's tasks"), title.inner_text()
    options = page.locator("#aggregate-gpu option").all_inner_texts()
    assert options == ["every GPU", "a100", "h100"], options
    page.select_option("#aggregate-gpu", "a100")
    _wait_for_aggregate(page, 1)
    assert title.inner_text().startswith("Best-in-k on a100"), title.inner_text()
    names = page.evaluate("document.getElementById('aggregate-plot').data.map(t => t.name)")
    assert names == ["random"]
    assert curves[-1].endswith("/v1/curves?gpu=a100"), curves
    page.select_option("#aggregate-gpu", "")
    _wait_for_aggregate(page, 3)
    page.close()
    client.close()


@pytest.mark.parametrize("refresh", ["x", "-5", "Infinity"])
def test_a_refresh_that_is_not_a_positive_number_is_the_default(live_url, browser, refresh):
    """?refresh=x made the interval NaN, and setTimeout(loop, NaN) runs at once: 161 task
    lists in 12 s where the default asks for 6."""
    page = browser.new_page()
    lists: list[str] = []
    page.on("request", lambda r: lists.append(r.url) if "/v1/tasks?" in r.url else None)
    page.goto(f"{live_url}/dashboard?refresh={refresh}")
    page.wait_for_timeout(3000)
    page.close()
    assert 1 <= len(lists) <= 3, lists  # one at load, then one each 2 s


API_KEY = "dashboard-test-key-0123456789"


@pytest.fixture
def keyed_url(tmp_path: Path) -> Iterator[str]:
    yield from _serve(tmp_path, api_keys=[API_KEY])


def _console_errors(page) -> list[str]:  # type: ignore[no-untyped-def]
    """The page's console errors and uncaught exceptions, as they come."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def _task_list_statuses(page) -> list[int]:  # type: ignore[no-untyped-def]
    """The HTTP statuses of the page's task requests, as they come."""
    statuses: list[int] = []
    page.on("response", lambda r: statuses.append(r.status) if "/v1/tasks" in r.url else None)
    return statuses


def test_with_api_keys_the_dashboard_reads_its_key_from_the_fragment(keyed_url, browser):
    """Where PIPETUNE_API_KEYS guards the user routes, /dashboard#key=KEY sends the key with
    the page's data requests (as the README says); without it they are refused."""
    with httpx.Client(base_url=keyed_url, timeout=30) as client:
        headers = {"X-API-Key": API_KEY}
        body = {"workload": GEMM, "gpu": "h100", "budget": 4, "strategy": "random"}
        created = client.post("/v1/tasks", json=body, headers=headers)
        assert created.status_code == 201, created.text
        assert client.get("/v1/tasks").status_code == 401  # guarded indeed

    page = browser.new_page()
    statuses = _task_list_statuses(page)
    page.goto(f"{keyed_url}/dashboard?refresh=300#key={API_KEY}")
    page.wait_for_function(
        "() => document.querySelectorAll('#tasks tbody tr').length === 1", timeout=20000
    )
    assert "gemm 1024x1024x1024" in page.locator("#tasks tbody tr").nth(0).inner_text()
    assert statuses and all(s == 200 for s in statuses), statuses
    # The key is out of the address bar (and so of the history), the rest kept.
    assert page.url == f"{keyed_url}/dashboard?refresh=300"
    page.reload()  # the tab keeps it for its session
    page.wait_for_function(
        "() => document.querySelectorAll('#tasks tbody tr').length === 1", timeout=20000
    )
    assert all(s == 200 for s in statuses), statuses
    keyless = browser.new_page()  # a tab of its own: no key kept
    refused = _task_list_statuses(keyless)
    keyless.goto(f"{keyed_url}/dashboard?refresh=300")
    deadline = time.monotonic() + 20
    while not refused and time.monotonic() < deadline:
        keyless.wait_for_timeout(100)
    assert refused and refused[0] == 401, refused
    # Said as a key refused, not as a service out of reach.
    keyless.wait_for_function(
        "() => document.getElementById('status').textContent.includes('API key')",
        timeout=20000,
    )
    assert keyless.locator("#status").inner_text() == (
        "this service needs an API key: open /dashboard#key=KEY"
    )
    wrong = browser.new_page()
    wrong.goto(f"{keyed_url}/dashboard?refresh=300#key=wrong")
    wrong.wait_for_function(
        "() => document.getElementById('status').textContent.includes('refused')",
        timeout=20000,
    )
    # The right key given in the same tab is taken at once, without a reload.
    wrong.evaluate(f"location.hash = 'key={API_KEY}'")
    wrong.wait_for_function(
        "() => document.querySelectorAll('#tasks tbody tr').length === 1", timeout=20000
    )
    assert wrong.url == f"{keyed_url}/dashboard?refresh=300"
    # Behind a proxy's prefix the page names its own address, where the key is to be given.
    proxied = browser.new_page()
    outside = _behind_a_prefix_stripping_proxy(proxied, PROXY_PREFIX)
    proxied.goto(f"{keyed_url}{PROXY_PREFIX}/dashboard?refresh=300")
    proxied.wait_for_function(
        "() => document.getElementById('status').textContent.includes('API key')",
        timeout=20000,
    )
    assert proxied.locator("#status").inner_text() == (
        f"this service needs an API key: open {PROXY_PREFIX}/dashboard#key=KEY"
    )
    proxied.evaluate(f"location.hash = 'key={API_KEY}'")
    proxied.wait_for_function(
        "() => document.querySelectorAll('#tasks tbody tr').length === 1", timeout=20000
    )
    proxied.unroute_all(behavior="ignoreErrors")
    assert outside == []
    for tab in (page, keyless, wrong):
        tab.close()


def test_a_task_whose_space_is_smaller_than_its_budget_shows_its_whole_space(live_url, browser):
    """A task that runs its whole space (42 schedules, budget 50) ends at 42 of 42 with the
    bar full, as the CLI says it (`42/42*`), not at 42 of 50."""
    small = {"op": "gemm", "m": 32, "n": 32, "k": 32, "dtype": "float16"}
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "sim", "simulated")
        body = {"workload": small, "gpu": "h100", "budget": 50, "strategy": "random"}
        task = client.post("/v1/tasks", json=body).json()
        _finish(client, worker, [task["id"]])
        doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_target"], doc["budget"]) == (42, 42, 50)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{live_url}/dashboard?refresh=300")
    page.wait_for_function(
        "() => document.querySelectorAll('#tasks tbody tr').length === 1", timeout=20000
    )
    progress = page.locator("#tasks tbody tr td").nth(5)
    assert " ".join(progress.inner_text().split()) == "42/42 its whole space; budget 50"
    width = page.evaluate(
        "document.querySelector('#tasks tbody tr td:nth-child(6) .bar span').style.width"
    )
    assert width == "100%"
    page.close()
    assert errors == []


def test_a_task_asked_for_by_address_is_shown_when_it_is_older_than_the_list(live_url, browser):
    """/dashboard?task=ID of a task older than the newest 100 the page lists showed the
    newest task instead; one the service does not have still falls back to the newest."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        worker = _register(client, "sim", "simulated")
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        old = client.post("/v1/tasks", json=body).json()["id"]
        _finish(client, worker, [old])
        newest = [client.post("/v1/tasks", json=body).json()["id"] for _ in range(100)][-1]

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for wanted, shown in ((old, old), (newest + 1000, newest)):
        page.goto(f"{live_url}/dashboard?task={wanted}&refresh=300")
        page.wait_for_function(
            "() => Number(document.body.dataset.refreshes || 0) >= 1", timeout=20000
        )
        title = page.locator("#task-title").inner_text()
        assert title.startswith(f"Task {shown}: "), title
        assert page.locator(f'#tasks tbody tr[data-task="{old}"]').count() == 0
    page.close()
    assert errors == []


def test_the_workers_are_shown_in_their_states(live_url, browser, tmp_path):
    """The fleet on the page: each worker's state (live, silent past the lease TTL, exited)
    and jobs in hand, and how many are in each state. The page showed no worker at all: a
    task's "waiting" note was the only sign that the fleet was gone."""
    with httpx.Client(base_url=live_url, timeout=30) as client:
        live = _register(client, "node-live", "simulated")
        silent = _register(client, "node-silent", "simulated")
        gone = _register(client, "node-gone", "simulated")
        beat = client.post(f"/v1/workers/{live}/heartbeat", json={"busy_jobs": 3}, headers=HEADERS)
        assert beat.status_code == 200
        assert client.post(f"/v1/workers/{gone}/exit", headers=HEADERS).status_code == 204
    engine = create_engine(f"sqlite:///{tmp_path / 'dashboard.db'}")
    with engine.begin() as conn:  # an hour silent (the service's TTL is 120 s)
        conn.execute(
            update(WorkerRow)
            .where(WorkerRow.id == silent)
            .values(last_heartbeat=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
        )
    engine.dispose()

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = _console_errors(page)
    page.goto(f"{live_url}/dashboard?refresh=300")
    page.wait_for_function(
        "() => document.querySelectorAll('#workers tbody tr').length === 3", timeout=20000
    )
    assert page.locator("#worker-counts").inner_text() == "1 live, 1 silent, 1 exited"
    rows = {
        cells[0]: cells
        for cells in (
            page.locator("#workers tbody tr").nth(i).locator("td").all_inner_texts()
            for i in range(3)
        )
    }
    assert rows["node-live"][1:5] == ["h100", "simulated", "live", "3"]
    assert rows["node-silent"][3] == "silent" and rows["node-gone"][3] == "exited"
    state_cell = page.locator(f"#workers tbody tr[data-worker='{silent}'] td").nth(3)
    assert state_cell.get_attribute("class") == "worker-silent"
    assert errors == []
    page.close()

"""The service behind a reverse proxy that serves it under a path prefix (PIPETUNE_ROOT_PATH,
`serve --root-path`): the API, /docs, the guards and the dashboard's page answer the same
whether the proxy strips its prefix or passes it on, and the SDK reaches the service at the
proxy's URL. (The dashboard drawn through such a proxy: tests/test_dashboard.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_support import start_service, start_worker, stop
from service_support import GEMM, live_server
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.sdk import Client
from pipetune.service.migrate import upgrade
from pipetune.service.settings import SettingsError, root_path_problem, validated_settings

PREFIX = "/pipetune"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A service with PIPETUNE_ROOT_PATH=/pipetune, answering only Host 127.0.0.1 (so that
    the Host guard's exemption of /healthz is exercised under the prefix too)."""
    url = f"sqlite:///{tmp_path / 'root.db'}"
    upgrade(url)
    with live_server(url, root_path=PREFIX, allowed_hosts=["127.0.0.1"]) as base:
        yield base


@pytest.mark.parametrize("good", ["", "/pipetune", "/tools/pipetune", "/a-b_c.d~1"])
def test_a_path_prefix_is_taken(good):
    assert root_path_problem(good) is None
    assert validated_settings(root_path=good).root_path == good


@pytest.mark.parametrize(
    "bad", ["pipetune", "/pipetune/", "/", "//pipetune", "/a//b", "/a?b", "/a#b", "/a%20b",
            "/a b", "/..", "/a/./b", "http://host/pipetune"],
)  # fmt: skip
def test_anything_else_is_refused_naming_the_variable_and_the_option(bad, tmp_path):
    with pytest.raises(SettingsError, match=r"^PIPETUNE_ROOT_PATH: .* is not a path prefix"):
        validated_settings(root_path=bad)
    url = f"sqlite:///{tmp_path / 'never.db'}"
    result = CliRunner().invoke(app, ["serve", "--db", url, "--root-path", bad])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --root-path: "), result.stderr
    assert not (tmp_path / "never.db").exists()  # refused before anything was made


@pytest.mark.parametrize("passed_on", [False, True])
def test_the_api_and_its_guards_answer_whether_the_proxy_strips_the_prefix_or_not(
    served, passed_on
):
    """Passed on, /pipetune/v1/... lost the no-store header a caching proxy needs (its path
    did not start with /v1/), and /pipetune/healthz was refused for its Host."""
    root = PREFIX if passed_on else ""
    with httpx.Client(base_url=served, timeout=30) as http:
        created = http.post(f"{root}/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 8})
        assert created.status_code == 201, created.text
        listed = http.get(f"{root}/v1/tasks")
        assert listed.status_code == 200
        assert [t["id"] for t in listed.json()["tasks"]] == [created.json()["id"]]
        assert listed.headers["cache-control"] == "no-store"
        health = http.get(f"{root}/healthz", headers={"Host": "probe.internal"})
        assert health.status_code == 200, health.text
        refused = http.get(f"{root}/v1/tasks", headers={"Host": "probe.internal"})
        assert refused.status_code == 400
        tuned = http.post(
            f"{root}/v1/schedules", json={"workload": GEMM, "gpu": "h100", "tune": {"budget": 8}}
        )
        assert tuned.status_code == 202, tuned.text
        assert tuned.json()["url"] == f"{served}{PREFIX}/v1/tasks/{tuned.json()['task_id']}"
        docs = http.get(f"{root}/docs")
        assert docs.status_code == 200
        assert f"'{PREFIX}/openapi.json'" in docs.text or f'"{PREFIX}/openapi.json"' in docs.text
        assert http.get(f"{root}/openapi.json").json()["servers"] == [{"url": PREFIX}]


@pytest.mark.parametrize("root", ["", PREFIX])
def test_the_dashboard_s_links_are_relative_to_its_page(served, root):
    """Its files and its API requests were addressed from the host's root: behind a proxy at
    /pipetune they went to the host's /dashboard/static/... and /v1/..., outside the
    service. /dashboard/ sends the browser to the page by a relative address (Starlette's
    own redirect named the path without a stripped prefix)."""
    with httpx.Client(base_url=served, timeout=30) as http:
        page = http.get(f"{root}/dashboard")
        assert page.status_code == 200
        assert 'src="/' not in page.text and 'href="/' not in page.text
        assert 'src="dashboard/static/dashboard.js"' in page.text
        slash = http.get(f"{root}/dashboard/?refresh=500")
        assert slash.status_code == 308
        assert slash.headers["location"] == "../dashboard?refresh=500"
        target = httpx.URL(f"{served}{root}/dashboard/").join(slash.headers["location"])
        assert target.path == f"{root}/dashboard" and target.query == b"refresh=500"
        script = http.get(f"{root}/dashboard/static/dashboard.js").text
        assert "fetch(ROOT + " in script and "fetch(path" not in script


def test_serve_worker_and_sdk_work_at_the_proxy_s_url(tmp_path):
    """`serve --root-path`, a `pipetune worker` and the SDK given the service's URL with the
    prefix (as a proxy that passes it on would hand it over): a task tuned to the end."""
    service = start_service(tmp_path, extra_args=["--root-path", PREFIX])
    log = tmp_path / "worker.log"
    try:
        with Client(f"{service.url}{PREFIX}") as client:
            task = client.tune(GEMM, "h100", budget=6, seed=1)
            proc = start_worker(f"{service.url}{PREFIX}", log, "--runner", "simulated", "--gpu",
                                "h100")  # fmt: skip
            try:
                done = client.wait(task.id, poll_s=0.2, timeout_s=60)
            finally:
                code = stop(proc, log)
            assert [w.name for w in client.workers()] != []
    finally:
        service.stop()
    assert code == 0
    assert done.state == "done" and done.trials_done == 6

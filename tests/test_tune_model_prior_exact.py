"""`pipetune tune-model --resume` follows a task that started cold though a prior is asked for
only where the service would start that shape cold again, as the service says (POST
/v1/tasks/prior: the prior a task creation would take, creating nothing). The client copied
the service's choice from the task list (`PriorAsked.warm_starts`), and where the copy and
the service disagreed a resume queued a task the service then started cold again: a
duplicate. The copy stays for a service that predates the route (404, 405). SQLite and
PostgreSQL for the route."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from service_support import (
    TestClient,
    client_for,
    fake_latency,
    lease,
    ok,
    post_result,
    register,
    row_count,
)

from pipetune.clients.sdk import Client
from pipetune.clients.tune_model import PriorAsked, launch, resumable_tasks
from pipetune.model.family import family_of
from pipetune.model.networks import network
from pipetune.service import priors
from pipetune.service.orm import JobRow, TaskRow

pytest_plugins = ["service_fixtures"]

SHAPES = network("bert-base", 1, 128).distinct()
GEMMS = [s for s in SHAPES if family_of(s.workload).name == "tensor_gemm"]
TARGET = [GEMMS[0]]  # the shape a run tunes on the H200
W0, W1 = (s.workload.canonical() for s in GEMMS[:2])
PRIOR_ROUTE = "/v1/tasks/prior"
BUDGET = 8  # trials of each finished task


def _finished(client: TestClient, workload: dict, runner_of: Callable[[int], str]) -> int:
    """A finished task of BUDGET trials of `workload` on the H100, its n-th result reported by
    a worker of runner_of(n); the first is far the fastest."""
    body = {"workload": workload, "gpu": "h100", "budget": BUDGET, "learned_prior": False}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    task = response.json()["id"]
    workers = {r: register(client, f"{r}-{task}", "h100", r) for r in ("cupy", "simulated")}
    for n in range(BUDGET):
        worker = workers[runner_of(n)]
        (job,) = lease(client, worker, max_jobs=1)
        latency = fake_latency(job["schedule"]) * (0.1 if n == 0 else 1.0)
        assert post_result(client, worker, job, ok(latency)).status_code == 200
    assert client.get(f"/v1/tasks/{task}").json()["state"] == "done"
    return task


def _sdk(client: TestClient, transport: httpx.BaseTransport | None = None) -> Client:
    return Client(str(client.base_url), transport=transport or client._transport)


@contextmanager
def _service(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    url = f"sqlite:///{tmp_path / 'prior.db'}"
    with client_for(url, create_empty_schema=True) as c:
        yield c, url


def _best_measured_rest_simulated(client: TestClient) -> int:
    """Another GEMM's finished H100 task whose best trial a GPU measured and whose other
    trials are simulated: no learned prior's teacher (a simulated result leaves it out), though
    its best trial, the one the task list shows, is measured."""
    return _finished(client, W1, lambda n: "cupy" if n == 0 else "simulated")


def _resumed(sdk: Client) -> dict[int, int]:
    found = resumable_tasks(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True)
    return {i: t.id for i, t in found.items()}


def test_a_resume_follows_the_cold_task_the_service_would_start_cold_again(tmp_path):
    with _service(tmp_path) as (c, url):
        other = _best_measured_rest_simulated(c)
        sdk = _sdk(c)
        # The earlier run of --learned-prior: nothing to learn from, the task started cold.
        (earlier,) = launch(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True)
        assert (earlier.prior_task, earlier.learned_from) == (None, None)
        # (The copy from the list took the other task for a prior: the disagreement.)
        listed = sdk.task(other)
        assert PriorAsked(learned_prior=True).warm_starts(listed, TARGET, "h200") == {0}
        tasks = row_count(url, TaskRow.id)
        resumed = resumable_tasks(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True)
        assert {i: t.id for i, t in resumed.items()} == {0: earlier.id}
        again = launch(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True, resumed=resumed)
        assert [t.id for t in again] == [earlier.id]  # no second cold task
        assert row_count(url, TaskRow.id) == tasks


def test_a_resume_leaves_a_cold_task_where_the_service_would_now_learn(tmp_path):
    """The other way: a measured task to learn from appeared since the run started cold."""
    with _service(tmp_path) as (c, _):
        sdk = _sdk(c)
        (earlier,) = launch(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True)
        assert earlier.learned_from is None
        assert _resumed(sdk) == {0: earlier.id}  # nothing to learn from yet
        measured = _finished(c, W1, lambda n: "cupy")
        assert _resumed(sdk) == {}  # this run learns now: the cold task is another run's
        (queued,) = launch(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True, resumed={})
        assert queued.learned_from == [measured]


def _count(url: str) -> tuple[int, int]:
    return row_count(url, TaskRow.id), row_count(url, JobRow.id)


def test_the_route_answers_the_prior_a_creation_then_takes(client, db_url, monkeypatch):
    w0_h100 = _finished(client, W0, lambda n: "cupy")
    w1_h100 = _finished(client, W1, lambda n: "cupy")
    measured = [w0_h100, w1_h100]
    cases = {
        # One measured shape, fewer than a default learned prior takes: cold.
        "cold": ({}, None, None),
        "learned_prior false": ({"learned_prior": False}, None, None),
        "prior_gpu": ({"prior_gpu": "h100"}, w0_h100, None),
        "prior_task": ({"prior_task": w0_h100}, w0_h100, None),
        "learned": ({"learned_prior": True}, None, measured),
    }
    for name, (prior, prior_task, learned_from) in cases.items():
        body = {"workload": W0, "gpu": "h200", "budget": 8, **prior}
        before = _count(db_url)
        answer = client.post(PRIOR_ROUTE, json=body)
        assert answer.status_code == 200, (name, answer.text)
        assert answer.json() == {"prior_task": prior_task, "learned_from": learned_from}, name
        assert _count(db_url) == before, name  # nothing created
        created = client.post("/v1/tasks", json=body)
        assert created.status_code == 201, (name, created.text)
        doc = created.json()
        assert (doc["prior_task"], doc["learned_from"]) == (prior_task, learned_from), name
    # Two shapes: learned by default where the family's minimum is two.
    monkeypatch.setattr(priors, "MIN_DEFAULT_SHAPES", 2)
    body = {"workload": W0, "gpu": "h200", "budget": 8}
    assert client.post(PRIOR_ROUTE, json=body).json()["learned_from"] == measured
    assert client.post("/v1/tasks", json=body).json()["learned_from"] == measured


def test_a_creation_after_the_route_reuses_the_prior_it_built(client, monkeypatch):
    """The route builds the prior to know it can be one; the creation that follows takes it
    from the driver's cache (a learned prior's fit is the slow part of a creation)."""
    from pipetune.service import driver

    built: list[str] = []
    for name in ("learned_model_of_tasks", "prior_from_task"):
        real = getattr(driver, name)

        def counted(*args: object, _real: Callable = real, _name: str = name) -> object:
            built.append(_name)
            return _real(*args)

        monkeypatch.setattr(driver, name, counted)
    measured = _finished(client, W0, lambda n: "cupy")
    _finished(client, W1, lambda n: "cupy")
    for prior, build in (({"learned_prior": True}, "learned_model_of_tasks"),
                         ({"prior_task": measured}, "prior_from_task")):  # fmt: skip
        body = {"workload": W0, "gpu": "h200", "budget": 8, **prior}
        built.clear()
        assert client.post(PRIOR_ROUTE, json=body).status_code == 200
        assert built == [build]
        assert client.post("/v1/tasks", json=body).status_code == 201
        assert built == [build]  # nothing built again


@pytest.mark.parametrize(
    ("prior", "field"),
    [
        ({"prior_task": 999}, "prior_task"),
        ({"prior_gpu": "a100"}, "prior_gpu"),
        ({"learned_prior": True}, "learned_prior"),
        ({"prior_gpu": "a100", "strategy": "grid"}, "strategy"),
    ],
    ids=["no such task", "nothing on that gpu", "nothing to learn from", "no prior taken"],
)
def test_the_route_refuses_what_a_creation_refuses_with_the_same_422(client, db_url, prior, field):
    body = {"workload": W0, "gpu": "h200", "budget": 8, **prior}
    before = _count(db_url)
    answer = client.post(PRIOR_ROUTE, json=body)
    created = client.post("/v1/tasks", json=body)
    assert answer.status_code == created.status_code == 422, answer.text
    assert answer.json() == created.json()
    assert answer.json()["field"] == field
    assert _count(db_url) == before
    # A body creation refuses before any prior (a budget of 0) is refused alike.
    bad = {**body, "budget": 0}
    assert client.post(PRIOR_ROUTE, json=bad).json() == client.post("/v1/tasks", json=bad).json()


def test_the_sdk_asks_with_tunes_arguments(client):
    sdk = _sdk(client)
    prior = sdk.task_prior(W0, "h200", budget=8, learned_prior=False)
    assert (prior.prior_task, prior.learned_from) == (None, None)
    with pytest.raises(ValueError, match="budget"):  # refused before any request, as tune's
        sdk.task_prior(W0, "h200", budget=0)


def test_the_route_takes_the_credential_a_creation_takes(tmp_path):
    key = "ak-" + "7" * 32
    url = f"sqlite:///{tmp_path / 'keyed.db'}"
    body = {"workload": W0, "gpu": "h200", "budget": 8}
    with client_for(url, create_empty_schema=True, api_keys=[key]) as c:
        for path in ("/v1/tasks", PRIOR_ROUTE):
            assert c.post(path, json=body).status_code == 401, path
            assert c.post(path, json=body, headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.post(PRIOR_ROUTE, json=body, headers={"X-API-Key": key}).status_code == 200
        assert row_count(url, TaskRow.id) == 0


def test_the_route_is_documented(tmp_path):
    with _service(tmp_path) as (c, _):
        spec = c.get("/openapi.json").json()
    route = spec["paths"][PRIOR_ROUTE]["post"]
    assert "creating nothing" in " ".join(route["description"].split())
    assert route["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/TaskCreate"
    )
    answer = route["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert answer.endswith("/TaskPrior")
    assert set(spec["components"]["schemas"]["TaskPrior"]["properties"]) == {
        "prior_task",
        "learned_from",
    }
    assert "422" in route["responses"] and "401" in route["responses"]


def _older_service(inner: httpx.BaseTransport, status: int) -> httpx.MockTransport:
    """The service as one that predates POST /v1/tasks/prior answers it: 405 (the path
    matches GET /v1/tasks/{task_id}), or 404 from something in front that does not know it."""
    said = {404: "Not Found", 405: "Method Not Allowed"}[status]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == PRIOR_ROUTE:
            return httpx.Response(status, json={"detail": said})
        return inner.handle_request(request)

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("status", [405, 404])
def test_a_service_without_the_route_is_answered_from_the_task_list(tmp_path, status):
    with _service(tmp_path) as (c, _):
        # (What a POST to a path the service lacks under /v1/tasks/ answers: 405.)
        assert c.post("/v1/tasks/unknown", json={}).status_code == 405
        _best_measured_rest_simulated(c)
        sdk = _sdk(c, _older_service(c._transport, status))
        (earlier,) = launch(sdk, TARGET, "h200", 16, "auto", 0, learned_prior=True)
        # The copy from the list: the other task's best trial is measured, so it counts as
        # a prior and the cold task is not followed (though the service would start it cold).
        assert _resumed(sdk) == {}
        # With no task of the shape on the A100 listed, the copy follows the cold task.
        found = resumable_tasks(sdk, TARGET, "h200", 16, "auto", 0, prior_gpu="a100")
        assert {i: t.id for i, t in found.items()} == {0: earlier.id}

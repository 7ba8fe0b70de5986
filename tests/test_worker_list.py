"""The fleet as the service sees it: `GET /v1/workers` answers each worker's state (live,
silent past the lease TTL, exited) and jobs in hand, filters by state, and counts the
workers in each state; the SDK, the local store and `pipetune workers` read it. Before, the
list gave only each worker's last heartbeat, and which of a thousand workers were alive was
the reader's arithmetic against a TTL it did not know. On SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from service_support import WORKER_HEADERS, client_for, register, service_of
from sqlalchemy import update
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.library.store import LocalInputError, LocalStore
from pipetune.clients.sdk import Client, InvalidArgumentError
from pipetune.service.migrate import upgrade
from pipetune.service.orm import WorkerRow

pytest_plugins = ["service_fixtures"]

runner = CliRunner()


def _fleet(client) -> dict[str, int]:
    """Three workers: one live with two jobs in hand, one silent for an hour (its last
    heartbeat said it held three), one exited."""
    ids = {name: register(client, name) for name in ("live", "silent", "exited")}
    for name, busy in (("live", 2), ("silent", 3)):
        beat = client.post(
            f"/v1/workers/{ids[name]}/heartbeat", json={"busy_jobs": busy}, headers=WORKER_HEADERS
        )
        assert beat.status_code == 200
    db = service_of(client).db
    with db.write() as s:
        s.execute(
            update(WorkerRow)
            .where(WorkerRow.id == ids["silent"])
            .values(last_heartbeat=db.now_plus(-3600.0))
        )
    assert (
        client.post(f"/v1/workers/{ids['exited']}/exit", headers=WORKER_HEADERS).status_code == 204
    )
    return ids


def test_the_list_says_each_worker_s_state_and_counts_them(db_url):
    with client_for(db_url, lease_ttl_s=600) as c:
        ids = _fleet(c)
        answer = c.get("/v1/workers").json()
        assert answer["counts"] == {"live": 1, "silent": 1, "exited": 1}
        by_name = {w["name"]: w for w in answer["workers"]}
        assert {n: w["state"] for n, w in by_name.items()} == {
            "live": "live", "silent": "silent", "exited": "exited",
        }  # fmt: skip
        assert by_name["live"]["busy_jobs"] == 2 and by_name["exited"]["busy_jobs"] == 0
        # Silent past the TTL, its leases have expired: shown as holding three for ever
        # before, as if the jobs were still in its hands.
        assert by_name["silent"]["busy_jobs"] == 0
        # The most recently heard from first: the silent one last.
        assert [w["name"] for w in answer["workers"]][-1] == "silent"
        for state in ("live", "silent", "exited"):
            page = c.get("/v1/workers", params={"state": state}).json()
            assert [w["id"] for w in page["workers"]] == [ids[state]]
            assert page["counts"] == answer["counts"]  # (all registered workers, always)
        assert len(c.get("/v1/workers", params={"limit": 2}).json()["workers"]) == 2


def test_a_registration_answers_live(db_url):
    with client_for(db_url) as c:
        body = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
        doc = c.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()
        assert doc["state"] == "live" and doc["busy_jobs"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [({"state": "alive"}, "state"), ({"limit": 0}, "limit"), ({"limit": 1001}, "limit")],
)
def test_a_bad_state_or_limit_is_a_422_naming_it(db_url, params, field):
    with client_for(db_url) as c:
        answer = c.get("/v1/workers", params=params)
        assert answer.status_code == 422
        assert answer.json()["detail"][0]["field"] == field, answer.text


def test_the_sdk_reads_the_states_and_refuses_an_unknown_one(db_url):
    with client_for(db_url, lease_ttl_s=600) as c:
        ids = _fleet(c)
        sdk = Client(str(c.base_url), transport=c._transport)
        page = sdk.worker_list()
        assert page.counts == {"live": 1, "silent": 1, "exited": 1}
        assert [w.id for w in sdk.workers("silent")] == [ids["silent"]]
        assert len(sdk.workers(limit=1)) == 1
        with pytest.raises(InvalidArgumentError, match="state"):
            sdk.workers("alive")


def test_the_local_store_answers_as_the_service(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    upgrade(url)
    monkeypatch.setenv("PIPETUNE_LEASE_TTL_S", "600")
    with client_for(url, lease_ttl_s=600) as c:
        ids = _fleet(c)
        served = c.get("/v1/workers").json()
    with LocalStore(url) as store:
        local = store.worker_list()
        assert local.model_dump(mode="json") == served
        assert [w.id for w in store.workers("exited")] == [ids["exited"]]
        with pytest.raises(LocalInputError, match="limit"):
            store.workers(limit=0)
    with LocalStore(f"sqlite:///{tmp_path / 'none-yet.db'}", named=False) as empty:
        assert empty.worker_list().counts == {"live": 0, "silent": 0, "exited": 0}


def test_pipetune_workers_lists_the_fleet(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    upgrade(url)
    monkeypatch.setenv("PIPETUNE_LEASE_TTL_S", "600")
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
    with client_for(url, lease_ttl_s=600) as c:
        ids = _fleet(c)
    shown = runner.invoke(app, ["workers", "--db", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "1 live, 1 silent, 1 exited" in shown.output
    rows = {line.split("│")[2].strip(): line for line in shown.output.splitlines() if "│" in line}
    assert "live" in rows and " 2 " in rows["live"]  # its jobs in hand
    doc = json.loads(
        runner.invoke(app, ["workers", "--db", url, "--state", "exited", "--json"]).output
    )
    assert [w["id"] for w in doc["workers"]] == [ids["exited"]]
    assert doc["workers"][0]["exited_at"] is not None and doc["more"] is False
    full = json.loads(runner.invoke(app, ["workers", "--db", url, "--limit", "1", "--json"]).output)
    assert len(full["workers"]) == 1 and full["more"] is True
    for args, option in (
        (["--state", "alive"], "--state"),
        (["--limit", "0"], "--limit"),
    ):
        refused = runner.invoke(app, ["workers", "--db", url, *args])
        assert refused.exit_code == 2 and option in refused.output, refused.output

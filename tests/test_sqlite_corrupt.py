"""A SQLite file damaged on disk ("database disk image is malformed"): what reads its damaged
pages fails until the file is restored. The service answered such a read 500 "Internal Server
Error" with a traceback in its log beside a healthy /healthz, and the CLI printed a screenful
of SQL; both now say the database is corrupt and what to do."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from service_support import GEMM, client_for, metric_value, service_of
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.service.migrate import upgrade


def damage_table(path: Path, table: str) -> None:
    """Overwrite the root page of `table` in the SQLite file at `path` (its WAL checkpointed
    into the file first, so the damage is what every new connection reads)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        page = root.fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with path.open("r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"\xff" * page_size)


BODY = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}


def test_a_corrupt_sqlite_file_is_a_503_naming_it_and_healthz_says_so(tmp_path: Path, caplog):
    path = tmp_path / "pipetune.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    with client_for(url) as client:
        assert client.post("/v1/tasks", json=BODY).status_code == 201
        assert client.get("/healthz").status_code == 200
        damage_table(path, "tasks")
        service_of(client).db.engine.dispose()  # (no connection's page cache hides it)
        answer = client.get("/v1/tasks")
        assert answer.status_code == 503, answer.text
        assert answer.json()["detail"].startswith("the database is corrupt"), answer.text
        assert "restored from a backup" in answer.json()["detail"]
        health = client.get("/healthz")
        assert health.status_code == 503, health.text
        assert health.json()["detail"].startswith("the database is corrupt"), health.text
        assert "malformed" in health.json()["detail"]
        assert metric_value(client.get("/metrics").text, "pipetune_database_up") == 0
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_the_cli_says_a_local_database_is_corrupt_without_its_sql(tmp_path: Path):
    path = tmp_path / "pipetune.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    with client_for(url) as client:
        assert client.post("/v1/tasks", json=BODY).status_code == 201
    damage_table(path, "tasks")
    result = CliRunner().invoke(app, ["tasks", "--db", url], env={"PIPETUNE_SERVER": ""})
    assert result.exit_code == 1, result.output
    assert "error: the database is corrupt" in result.output
    assert "restore it from a backup" in result.output
    assert "SELECT" not in result.output

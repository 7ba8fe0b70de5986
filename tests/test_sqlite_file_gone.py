"""The embedded SQLite file deleted or replaced while the service runs: the open connections
go on with the old file (unlinked, or no longer at the path), new ones open the file at the
path beside the old one's WAL. /healthz and /metrics say so instead of answering healthy, and
every request that reads or writes is refused (503): writes answered 201, ids were handed out
twice, tasks were lost and a restored file was corrupted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from service_support import client_for, metric_value

from pipetune.service.migrate import upgrade


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_health_and_metrics_say_when_the_sqlite_file_is_gone(tmp_path: Path, how: str):
    path = tmp_path / "pipetune.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    with client_for(url) as client:
        assert client.get("/healthz").status_code == 200
        assert metric_value(client.get("/metrics").text, "pipetune_database_up") == 1
        if how == "deleted":
            path.unlink()
        else:  # a copy moved over it (a restore from a backup, say)
            shutil.copy(path, tmp_path / "copy.db")
            (tmp_path / "copy.db").replace(path)
        response = client.get("/healthz")
        assert response.status_code == 503, response.text
        assert f"was {how}" in response.json()["detail"]
        assert metric_value(client.get("/metrics").text, "pipetune_database_up") == 0
        # Nothing more is taken or answered from a database that is not the one at the path.
        body = {"workload": {"op": "gemm", "m": 256, "n": 256, "k": 256}, "gpu": "h100"}
        created = client.post("/v1/tasks", json=body | {"budget": 8})
        assert created.status_code == 503, created.text
        assert f"was {how}" in created.json()["detail"]
        listed = client.get("/v1/tasks")
        assert listed.status_code == 503 and f"was {how}" in listed.json()["detail"]

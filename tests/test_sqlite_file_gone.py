"""The embedded SQLite file deleted or replaced while the service runs: the open connections
go on with the old file (unlinked, or no longer at the path), so every write still succeeds
and is lost at the next start. /healthz and /metrics say so instead of answering healthy."""

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

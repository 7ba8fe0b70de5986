"""LocalService (the demo's, the tests' and the benchmarks' `pipetune serve`) gives the child
its database URL in the environment: on the command line, any user of the machine could read
a password in it with `ps`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipetune.clients.local_service import LocalService


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_database_url_is_not_on_the_command_line(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'secret-name.db'}"
    service = LocalService(url, tmp_path / "serve.log", inherit_settings=False).start()
    try:
        assert service.process is not None
        pid = service.process.pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    finally:
        service.stop()
    assert not any(b"secret-name" in arg for arg in argv), argv
    assert f"PIPETUNE_DATABASE_URL={url}".encode() in environ
    assert (tmp_path / "secret-name.db").exists()  # and it served that database
